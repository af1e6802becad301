"""dsparkhub.verify.reference.batching: ragged batched decoding equals the batch-1 loop; threads by model size; the runner's
concurrency axis, interleaved repeats and refusals."""

from __future__ import annotations

import pytest
import torch

from dsparkhub.verify import runner
from dsparkhub.torch_threads import threads_for
from dsparkhub.verify.reference.engine import ReferenceEngine
from dsparkhub.verify.settings import LoadOptions, VerifySettings

torch.set_num_threads(1)

# ragged on purpose: different prompt lengths, and an EOS that ends some outputs early
PROMPTS = [[3, 4, 5, 6, 7], [10, 11], [20, 21, 22, 23, 24, 25, 26, 27], [30], [40, 41, 42], [50, 51, 52, 53]]


@pytest.mark.parametrize("kind, n, eos", [("dspark_run", 3, []), ("dspark_run", 4, None), ("dflash", 4, []),
                                          ("dflash", 5, None)])
@pytest.mark.parametrize("concurrency", [2, 4])
def test_batched_equals_batch_1(tiny_models, kind, n, eos, concurrency):
    """Outputs and every counter of a batched run equal the batch-1 loop's (greedy), with and without a drafter;
    requests join as others finish (6 prompts, at most 4 in flight)."""
    root, model = tiny_models
    engine = ReferenceEngine(model, root / kind, eos_token_id=eos)
    for cfg in (None, n):
        one = engine.run(PROMPTS, num_speculative_tokens=cfg, max_new_tokens=30)
        many = engine.run(PROMPTS, num_speculative_tokens=cfg, max_new_tokens=30, concurrency=concurrency)
        assert many.outputs == one.outputs and many.concurrency == concurrency
        assert (many.num_drafts, many.num_draft_tokens, many.num_accepted_tokens, many.accepted_per_pos) == \
            (one.num_drafts, one.num_draft_tokens, one.num_accepted_tokens, one.accepted_per_pos)
        assert len(many.ttft_s) == len(many.latency_s) == len(PROMPTS)
        assert all(0 < f <= lat for f, lat in zip(many.ttft_s, many.latency_s))
        assert max(many.latency_s) <= many.wall_s


def test_batched_sampling_is_reproducible(tiny_models):
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    a = engine.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=20, temperature=0.8, seed=5, concurrency=3)
    b = engine.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=20, temperature=0.8, seed=5, concurrency=3)
    assert a.outputs == b.outputs and all(len(o) == 20 for o in a.outputs)


def test_threads_by_model_size():
    assert threads_for(2_000_000, cores=16) == 1
    assert threads_for(8_000_000_000, cores=16) == 16
    assert threads_for(8_000_000_000, cores=1) == 1


def test_run_verify_concurrency_axis_interleaved(tiny_models, tmp_path, monkeypatch):
    """The reference engine through run_verify: concurrency 1 and 3, two interleaved repeats, lossless at both."""
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    order = []
    real = engine.run

    def spy(prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0, concurrency=1,
            progress=None):
        order.append((num_speculative_tokens, concurrency))
        return real(prompts, num_speculative_tokens=num_speculative_tokens, max_new_tokens=max_new_tokens,
                    temperature=temperature, seed=seed, concurrency=concurrency, progress=progress)

    monkeypatch.setattr(engine, "run", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt_token_ids": {p}}}\n' for p in PROMPTS))
    res = runner.run_verify(root / "dspark_run", root / "target",
                            VerifySettings(num_speculative_tokens=[2, 3], datasets=[str(prompts)], max_new_tokens=12,
                                           load=LoadOptions(concurrency=(3, 1), repeats=2)), backend=engine,
                            progress=False, check=False)
    assert order == [(None, 1), (2, 1), (3, 1)] * 2 + [(None, 3), (2, 3), (3, 3)] * 2  # interleaved
    s = res.settings
    assert (s.concurrency, s.repeats, s.order, s.batch_size) == ([1, 3], 2, "interleaved", 3)
    assert s.intra_op_threads == 1  # a tiny model: one thread
    assert res.lossless is True and len(res.summary) == 4 and [x.concurrency for x in res.load] == [1, 3]
    (ds,) = res.datasets
    for n in (2, 3):
        one, three = ds.run(n, 1), ds.run(n, 3)
        assert one.tau == three.tau and len(one.speedup_repeats) == 2 and three.latency.ttft_p50_ms > 0
    assert ds.baseline_at(3).tokens_per_s_repeats and len(ds.baselines) == 2


def test_concurrency_out_of_a_backends_reach_is_refused(tiny_models, tmp_path):
    root, _ = tiny_models

    class OneAtATime:
        name, version, device = "vllm", "fake", "cpu"

        def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0):
            raise AssertionError("must not run")

        def close(self):
            pass

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_token_ids": [1, 2]}\n')
    with pytest.raises(runner.EngineOptionError, match="runs one request at a time, so --concurrency 8"):
        runner.run_verify(root / "dspark_run", root / "target",
                          VerifySettings(num_speculative_tokens=[2], datasets=[str(prompts)],
                                         load=LoadOptions(concurrency=(1, 8))), backend=OneAtATime(),
                          progress=False, check=False)
    with pytest.raises(runner.VerifyArgumentError, match="repeats must be at least 1"):
        LoadOptions(repeats=0).checked()
