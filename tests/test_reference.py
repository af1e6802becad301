"""The reference engine: lossless greedy decoding, vLLM counter semantics, rejection sampling in distribution."""

from __future__ import annotations

import json

import pytest
import torch

from dsparkhub.errors import VerifyError
from dsparkhub.example.layouts import make_tiny_drafter, make_tiny_target
from dsparkhub.verify.reference.modeling import target_features
from dsparkhub.verify.reference.engine import ReferenceEngine
from dsparkhub.verify.reference.sampling import rejection_step

torch.set_num_threads(1)

PROMPTS = [[3, 4, 5, 6, 7], [10, 11], [20, 21, 22, 23, 24, 25, 26, 27]]


def _check_counters(stats, n):
    assert stats.num_draft_tokens == n * stats.num_drafts  # no confidence truncation
    assert len(stats.accepted_per_pos) == n
    assert all(a >= b for a, b in zip(stats.accepted_per_pos, stats.accepted_per_pos[1:]))
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens
    assert stats.steps == stats.num_drafts
    assert stats.draft_s > 0 and stats.verify_s > 0 and stats.wall_s >= stats.draft_s + stats.verify_s


@pytest.mark.parametrize("kind, n", [("dspark_run", 1), ("dspark_run", 4), ("dspark_run", 6), ("dflash", 3),
                                     ("dflash", 4), ("dflash", 7)])
def test_greedy_speculative_output_equals_plain_greedy(tiny_models, kind, n):
    root, model = tiny_models
    engine = ReferenceEngine(model, root / kind, eos_token_id=[])
    base = engine.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=40)
    spec = engine.run(PROMPTS, num_speculative_tokens=n, max_new_tokens=40)
    assert [len(o) for o in base.outputs] == [40, 40, 40]
    assert spec.outputs == base.outputs
    assert base.num_drafts == 0 and base.steps == 39 * 3 and base.tau is None
    _check_counters(spec, n)
    # committed tokens = first token from prefill + (accepted + bonus) per step, minus the overshoot at the cap
    assert spec.num_accepted_tokens + spec.num_drafts + 3 >= spec.output_tokens


def test_a_drafter_that_guesses_right_gets_tau_n_plus_one(tiny_models, monkeypatch):
    """Feed the engine the target's own continuation as drafts: every draft accepted, τ = n + 1 exactly."""
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    prompt = PROMPTS[0]
    truth = engine.run([prompt], num_speculative_tokens=None, max_new_tokens=60).outputs[0]

    def oracle(self, anchor, pos, ctx, n, temperature, gen):
        done = pos - len(prompt) + 1  # tokens committed so far, anchor included
        return truth[done:done + n], None

    monkeypatch.setattr(ReferenceEngine, "_draft", oracle)
    stats = engine.run([prompt], num_speculative_tokens=4, max_new_tokens=51)
    assert stats.outputs[0] == truth[:51]
    assert stats.num_drafts == 10 and stats.tau == 5.0
    assert stats.accepted_per_pos == [10, 10, 10, 10]


def test_wrong_drafts_accept_nothing_and_stay_lossless(tiny_models, monkeypatch):
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dflash", eos_token_id=[])
    truth = engine.run([PROMPTS[1]], num_speculative_tokens=None, max_new_tokens=20).outputs[0]
    vocab = model.config.vocab_size

    def wrong(self, anchor, pos, ctx, n, temperature, gen):
        done = pos - len(PROMPTS[1]) + 1
        return [(t + 1) % vocab for t in truth[done:done + n]] + [1] * max(0, n - len(truth[done:done + n])), None

    monkeypatch.setattr(ReferenceEngine, "_draft", wrong)
    stats = engine.run([PROMPTS[1]], num_speculative_tokens=3, max_new_tokens=20)
    assert stats.outputs[0] == truth
    assert stats.num_accepted_tokens == 0 and stats.tau == 1.0 and stats.num_drafts == 19


def test_eos_stops_generation(tiny_models):
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    out = engine.run([PROMPTS[2]], num_speculative_tokens=None, max_new_tokens=30).outputs[0]
    stop = out[9]
    stopped = ReferenceEngine(model, root / "dspark_run", eos_token_id=stop)
    first = out.index(stop)
    for n in (None, 3):
        got = stopped.run([PROMPTS[2]], num_speculative_tokens=n, max_new_tokens=30).outputs[0]
        assert got == out[:first + 1]


def test_rejection_step_is_lossless_in_distribution():
    """Draft ~ q, then the one-step rule: the committed token must be distributed as p, not as q."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.50, 0.05, 0.20, 0.05, 0.20])
    q = torch.tensor([0.10, 0.40, 0.20, 0.25, 0.05])
    assert (p - q).abs().sum() / 2 > 0.3  # a rule that keeps the draft would be far off
    trials = 20000
    drafts = torch.multinomial(q, trials, replacement=True, generator=gen)
    counts = torch.zeros(5)
    accepted = 0
    for d in drafts.tolist():
        ok, tok = rejection_step(p, q, d, gen)
        accepted += ok
        counts[d if ok else tok] += 1
    freq = counts / trials
    assert (freq - p).abs().max() < 0.015, freq
    # acceptance probability is sum(min(p, q)) = 1 - TV(p, q)
    assert abs(accepted / trials - float(torch.minimum(p, q).sum())) < 0.015


def test_sampled_speculative_decoding_matches_target_distribution(tmp_path):
    """End to end at temperature 1: the joint law of the first two tokens equals the target's.

    With 2000 runs over 25 cells the sampling noise is TV ~ 0.045. The drafter proposes from the target's
    distribution shifted by one token id, so keeping its drafts too often moves the law far past the 0.09 bound.
    """
    vocab = 5
    model = make_tiny_target(tmp_path / "t", vocab_size=vocab, hidden_size=32, num_hidden_layers=2, seed=3)
    drafter = make_tiny_drafter(None, model, kind="dflash", target_layer_ids=[0], block_size=3, seed=4)
    with torch.no_grad():  # a confident drafter that disagrees with the target
        drafter.lm_head.weight.copy_(torch.roll(model.lm_head.weight, 1, dims=0) * 2.0)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p0 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1], -1)
        joint = torch.stack([p0[a] * torch.softmax(model(torch.tensor([prompt + [a]])).logits[0, -1], -1)
                             for a in range(vocab)])
    engine = ReferenceEngine(model, drafter, eos_token_id=[])
    runs = 2000
    stats = engine.run([prompt] * runs, num_speculative_tokens=1, max_new_tokens=2, temperature=1.0, seed=11)
    emp = torch.zeros(vocab, vocab)
    for o in stats.outputs:
        emp[o[0], o[1]] += 1 / runs
    tv = float((emp - joint).abs().sum() / 2)
    assert tv < 0.09, tv
    assert 0.05 * runs < stats.num_accepted_tokens < 0.95 * stats.num_draft_tokens  # both branches exercised
    assert float((emp.sum(0) - joint.sum(0)).abs().sum() / 2) < 0.05  # second-token marginal


def test_sampling_is_reproducible_with_the_seed(tiny_models):
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    a = engine.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=20, temperature=0.8, seed=5)
    b = engine.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=20, temperature=0.8, seed=5)
    c = engine.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=20, temperature=0.8, seed=6)
    assert a.outputs == b.outputs and a.num_accepted_tokens == b.num_accepted_tokens
    assert a.outputs != c.outputs


def test_confidence_threshold_truncates_drafts(tiny_models):
    root, model = tiny_models
    full = ReferenceEngine(model, root / "dspark_run", eos_token_id=[])
    cut = ReferenceEngine(model, root / "dspark_run", eos_token_id=[], confidence_threshold=0.99)
    a = full.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=30)
    b = cut.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=30)
    assert b.outputs == a.outputs  # still lossless
    assert b.num_draft_tokens == b.num_drafts  # random head: sigmoid ~ 0.5 < 0.99 -> one token per step
    assert a.draft_tokens_per_step == 4.0


def test_engine_identity_and_errors(tiny_models):
    root, model = tiny_models
    engine = ReferenceEngine(root / "target", root / "dspark_run")
    assert engine.name == "reference" and engine.version.startswith("dsparkhub ")
    assert "torch" in engine.version and engine.device.startswith("cpu (")
    with pytest.raises(VerifyError, match="num_speculative_tokens"):
        engine.run(PROMPTS, num_speculative_tokens=0, max_new_tokens=4)
    with pytest.raises(VerifyError, match="empty"):
        engine.run([[]], num_speculative_tokens=None, max_new_tokens=4)
    with pytest.raises(VerifyError, match="no drafter"):
        ReferenceEngine(model).run(PROMPTS, num_speculative_tokens=2, max_new_tokens=4)
    dflash = ReferenceEngine(model, root / "dflash")
    with pytest.raises(VerifyError, match="confidence head"):
        ReferenceEngine(model, dflash.drafter, confidence_threshold=0.5)


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_drafters_decode_losslessly(tiny_models, tmp_path, kind, causal):
    """speculators' default drafters (every layer sliding_attention; causal, or bidirectional with is_causal: false)
    run in the reference engine: greedy output equals plain greedy, and the window changes the drafts."""
    root, model = tiny_models
    folder = tmp_path / kind
    make_tiny_drafter(folder, model, kind=kind, target_layer_ids=[0, 1], block_size=4, layout="flat")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention"], sliding_window=3, use_sliding_window=True, is_causal=causal)
    (folder / "config.json").write_text(json.dumps(cfg))
    sliding = ReferenceEngine(model, folder, eos_token_id=[])
    assert [(a.sliding_window, a.causal) for a in sliding.drafter.config.layer_attention] == [(3, causal)]
    base = sliding.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=30)
    spec = sliding.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=30)
    assert spec.outputs == base.outputs
    _check_counters(spec, 4)
    cfg.update(layer_types=["full_attention"], is_causal=None)
    (folder / "config.json").write_text(json.dumps(cfg))
    full = ReferenceEngine(model, folder, eos_token_id=[])
    prompt, anchor = PROMPTS[2], torch.tensor([PROMPTS[2][-1]])
    with torch.no_grad():
        drafts = []
        for engine in (sliding, full):
            d = engine.drafter
            out = model(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True)
            ctx = d.context_kv(target_features(out.hidden_states, d.config.target_layer_ids),
                               torch.arange(len(prompt) - 1).unsqueeze(0))
            ids, pos, first = d.block_query(anchor, 4, torch.tensor([len(prompt) - 1]))
            drafts.append(d.base_logits(d.backbone(ids, pos, ctx)))
    assert not torch.allclose(drafts[0], drafts[1], atol=1e-4), "the sliding window should change the draft logits"
