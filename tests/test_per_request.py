"""Per-request figures (issue 25): each request's τ and latency from the reference engine, the request-weighted τ
beside the token-weighted one, TPOT / E2E percentiles with their speedups, and the SPEED-Bench category matrix
from one run (results, terminal table, card)."""

from __future__ import annotations

import json

import pytest
import torch

from dsparkhub.verify import runner
from dsparkhub.verify.reference.engine import ReferenceEngine
from dsparkhub.verify.results.per_request import category_of, per_request_of
from dsparkhub.verify.results.reading import results_from_dict
from dsparkhub.verify.results.table import format_summary_table
from dsparkhub.verify.settings import LoadOptions, VerifySettings
from dsparkhub.verify.stats import RunStats

torch.set_num_threads(1)

PROMPTS = [[3, 4, 5, 6, 7], [10, 11], [20, 21, 22, 23, 24, 25, 26, 27], [30], [40, 41, 42]]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_request_counters_add_up_to_the_run_counters(tiny_models, concurrency):
    """Per-request drafts / accepted sum to the run's vLLM-style counters, one entry per prompt (batch-1 loop and
    batched engine)."""
    root, model = tiny_models
    engine = ReferenceEngine(model, root / "dflash", eos_token_id=0)
    st = engine.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=20, concurrency=concurrency)
    assert len(st.request_drafts) == len(st.request_accepted) == len(PROMPTS)
    assert sum(st.request_drafts) == st.num_drafts and sum(st.request_accepted) == st.num_accepted_tokens
    base = engine.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=20, concurrency=concurrency)
    assert base.request_drafts == [0] * len(PROMPTS) and per_request_of(base).tau == []


def test_request_weighted_tau_differs_from_token_weighted():
    """A long request with high acceptance outvotes a short one in the token-weighted τ, not in the request mean."""
    st = RunStats(outputs=[[1] * 40, [1] * 4], wall_s=1.0, num_drafts=12, num_accepted_tokens=32,
                  request_drafts=[10, 2], request_accepted=[30, 2], ttft_s=[0.1, 0.1], latency_s=[0.5, 0.2])
    pr = per_request_of(st)
    assert pr.tau == [4.0, 2.0] and pr.accepted_per_step == [3.0, 1.0]
    assert st.tau == pytest.approx(1 + 32 / 12)  # 3.67, token-weighted
    assert pr.e2e_ms == pytest.approx([500.0, 200.0]) and pr.tpot_ms[1] == pytest.approx(100 / 3)


def test_category_of_reads_speed_bench_sources_only():
    assert category_of("speed-bench:s.jsonl (sha256 0123) category math") == "math"
    assert category_of("alpha.jsonl (sha256 0123)") is None


@pytest.fixture(scope="module")
def speed_results(example, tmp_path_factory):
    """The example DFlash drafter at n=2, concurrency 1 and 2, on a two-category SPEED-Bench file (3 prompts each,
    16 new tokens): one run_verify with the reference engine."""
    tmp = tmp_path_factory.mktemp("speed")
    texts = [json.loads(line)["prompt"] for line in example.prompts.read_text().splitlines() if line.strip()]
    rows = [{"category": "first" if i < 3 else "second", "turns": [t[-200:]]} for i, t in enumerate(texts[:6])]
    path = tmp / "speed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = ReferenceEngine(example.target, example.dflash, ignore_eos=True)
    return runner.run_verify(example.dflash, example.target,
                             VerifySettings(num_speculative_tokens=[2], datasets=[f"speed-bench:{path}"],
                                            max_new_tokens=16, load=LoadOptions(concurrency=(1, 2))),
                             backend=engine, progress=False, check=False)


def test_reference_run_keeps_per_request_figures(speed_results):
    res = speed_results
    assert res.lossless is True and [ds.name for ds in res.datasets] == ["speed-bench/first", "speed-bench/second"]
    for ds in res.datasets:
        for c in (1, 2):
            run, base = ds.run(2, c), ds.baseline_at(c)
            pr = run.per_request
            assert len(pr.tau) == len(pr.accepted_per_step) == len(pr.e2e_ms) == len(pr.tpot_ms) == run.prompts == 3
            assert len(base.per_request.e2e_ms) == 3 and base.per_request.tau == []
            assert run.request_tau == pytest.approx(sum(pr.tau) / len(pr.tau))
            assert all(t >= 1.0 for t in pr.tau) and all(t == pytest.approx(1 + a) for t, a in
                                                         zip(pr.tau, pr.accepted_per_step))
            lat = run.latency
            assert 0 < lat.tpot_p50_ms <= lat.tpot_p95_ms <= lat.tpot_p99_ms
            assert 0 < lat.e2e_p50_ms <= lat.e2e_p95_ms <= lat.e2e_p99_ms
            assert run.latency_speedup.e2e_p95 == pytest.approx(base.latency.e2e_p95_ms / lat.e2e_p95_ms)
            assert run.latency_speedup.tpot_p99 == pytest.approx(base.latency.tpot_p99_ms / lat.tpot_p99_ms)
    for row in res.summary:
        runs = [ds.run(2, row.concurrency) for ds in res.datasets]
        assert row.mean_request_tau == pytest.approx(sum(r.request_tau for r in runs) / 2)
        assert row.mean_latency_speedup.e2e_p50 == pytest.approx(sum(r.latency_speedup.e2e_p50 for r in runs) / 2)


def test_speed_bench_run_yields_the_category_matrix(speed_results):
    res = speed_results
    got = [(r.category, r.num_speculative_tokens, r.concurrency) for r in res.categories]
    assert got == [("first", 2, 1), ("first", 2, 2), ("second", 2, 1), ("second", 2, 2)]
    for row in res.categories:
        run = next(ds for ds in res.datasets if ds.name == row.dataset).run(2, row.concurrency)
        assert (row.tau, row.request_tau, row.speedup, row.prompts) == (run.tau, run.request_tau, run.speedup, 3)
        assert row.speedup_reliable == (not run.unreliable)
    again = results_from_dict(json.loads(json.dumps(res.to_dict())))  # round trip through the strict reader
    assert again.categories == res.categories and again.datasets[0].runs[0].per_request == \
        res.datasets[0].runs[0].per_request
    text = format_summary_table(res)
    assert "tau request-weighted" in text and "category" in text and "E2E p50/p95/p99 speedup" in text


def test_v2_file_without_per_request_fields_still_reads(speed_results):
    data = speed_results.to_dict()
    data.pop("categories")
    for ds in data["datasets"]:
        for r in ds["runs"]:
            for key in ("request_tau", "per_request", "latency_speedup"):
                r.pop(key)
    again = results_from_dict(data)
    assert again.datasets[0].runs[0].request_tau is None and again.datasets[0].runs[0].per_request is None
    # the matrix of a file older than it is derived on reading, without the request-weighted τ
    assert [(r.category, r.tau, r.request_tau) for r in again.categories] == \
        [(r.category, r.tau, None) for r in speed_results.categories]


def test_card_shows_request_weighted_tau_latency_speedups_and_categories(tmp_path):
    """A SPEED-Bench file with per-request counters and timings: the card has the token- vs request-weighted τ
    table with TPOT / E2E percentile speedups, and the category matrix."""
    from dsparkhub.card.render import write_card
    from dsparkhub.io.hashing import checkpoint_fingerprint
    from dsparkhub.verify.results.derive import build_results
    from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings
    from test_card import make_drafter

    draft = make_drafter(tmp_path / "d")
    outs = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23]]

    def timed(e2e):
        return dict(ttft_s=[0.01, 0.01], latency_s=list(e2e))

    runs = []
    for cat, drafts, acc in (("math", [3, 1], [6, 1]), ("chat", [2, 2], [2, 2])):
        base = RunStats(outputs=outs, wall_s=2.0, request_drafts=[0, 0], request_accepted=[0, 0],
                        **timed([0.71, 0.31]))
        spec = RunStats(outputs=outs, wall_s=1.0, num_drafts=4, num_draft_tokens=12, num_accepted_tokens=sum(acc),
                        accepted_per_pos=[2, 1, 0] if cat == "chat" else [3, 2, 2], request_drafts=drafts,
                        request_accepted=acc, **timed([0.31, 0.21]))
        runs.append((f"speed-bench/{cat}", f"speed-bench:s.jsonl (sha256 0123) category {cat}", base, {3: spec}))
    res = build_results(engine=EngineInfo("reference", "dsparkhub 0.1.0", "cpu (1 threads)"), method="dspark",
                        target=ModelRef("Qwen/Qwen3-8B", None),
                        drafter=ModelRef(str(draft), checkpoint_fingerprint(draft)),
                        settings=Settings(0.0, 7, 13, [3]), runs=runs, date="2026-11-30T21:04:05+00:00")
    math = res.datasets[0].run(3)
    assert math.tau == pytest.approx(1 + 7 / 4) and math.request_tau == pytest.approx((3.0 + 2.0) / 2)
    text = write_card(draft, [res.save(tmp_path / "r.json")]).readme.read_text()
    assert "| tau token-weighted | tau request-weighted |" in text
    # τ (2.75 + 2.00) / 2 and (2.50 + 2.00) / 2; E2E p50 510 / 260 ms, p95 690 / 305, p99 706 / 309
    assert "| 1 | n=3 | 2.38 | 2.25 | 1.78x / 1.52x / 1.50x | 1.96x / 2.26x / 2.28x |" in text
    assert "Per SPEED-Bench category" in text and "| math | 2.75 / 2.00x |" in text and "| chat | 2.00 / 2.00x |" in text


def test_vllm_child_reads_request_output_figures():
    """The vLLM child's reading of one finished ``RequestOutput`` (vLLM 0.32 ``RequestSpecDecodeMetrics`` histogram,
    ``RequestStateStats`` timestamps), and the backend keeps per-request fields only when every request has them."""
    from types import SimpleNamespace as NS

    from dsparkhub.verify.vllm.child import _request_figures
    from dsparkhub.verify.vllm.offline import request_fields

    out = NS(outputs=[NS(spec_decode_metrics=NS(histogram=[2, 1, 3]))],
             metrics=NS(first_token_latency=0.05, first_token_ts=10.0, last_token_ts=10.2))
    fig = _request_figures(out)
    assert (fig["drafts"], fig["accepted"]) == (6, 7) and fig["e2e_s"] == pytest.approx(0.25)
    bare = _request_figures(NS(outputs=[NS()], metrics=None))
    assert bare == {"drafts": None, "accepted": None, "ttft_s": None, "e2e_s": None}
    assert request_fields([fig, fig]) == {"request_drafts": [6, 6], "request_accepted": [7, 7],
                                          "ttft_s": [0.05, 0.05], "latency_s": [fig["e2e_s"]] * 2}
    assert request_fields([fig, bare]) == {} and request_fields(None) == {}
