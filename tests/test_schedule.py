"""Confidence-scheduled verification (static / threshold / vLLM budget / SGLang SPS) in the reference engine, the
step costs and latency law, the SPS table, and `dsparkhub schedule` (issue 26)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.errors import OutputExistsError, VerifyError
from dsparkhub.verify.costs import StepCosts, latency_law, law_row
from dsparkhub.verify.reference.policies import (Policy, Scheduler, cost_table, parse_policies, read_temperatures,
                                                 sglang_budget, survival, topk_widths, vllm_budget)
from dsparkhub.verify.sps_table import SPS_FILE, build_table, table_problems, write_table
from dsparkhub.verify.stats import RunStats

PROMPTS = [[5, 7, 9, 11], [12, 3, 40], [8, 8, 8, 8, 8], [33, 21], [17, 19, 23]]


# ---- policies ---------------------------------------------------------------------------------------------------


def test_parse_policies_reads_every_kind_and_round_trips_labels():
    pols = parse_policies("static, threshold:0.5,budget,sps")
    assert pols == [Policy("static"), Policy("threshold", 0.5), Policy("budget"), Policy("sps")]
    assert ",".join(p.label for p in pols) == "static,threshold:0.5,budget,sps"


@pytest.mark.parametrize("text, words", [("greedy", "unknown verification policy 'greedy'"),
                                         ("threshold", "threshold:T"), ("threshold:1.5", "in [0, 1]"),
                                         ("budget:3", "takes no argument"), ("static,static", "given twice"),
                                         (" , ", "no verification policy")])
def test_parse_policies_refuses_bad_input(text, words):
    with pytest.raises(VerifyError) as err:
        parse_policies(text)
    assert words in err.value.message


def test_survival_applies_sts_temperatures_before_the_product():
    logits = torch.tensor([[2.0, -1.0, 0.0]])
    raw = survival(logits)
    assert raw[0].tolist() == pytest.approx(np.cumprod(1 / (1 + np.exp(-np.array([2.0, -1.0, 0.0])))).tolist())
    cal = survival(logits, [2.0, 0.5, 1.0])
    assert cal[0, 0] == pytest.approx(1 / (1 + np.exp(-1.0)))
    assert cal[0, 1] == pytest.approx(cal[0, 0] / (1 + np.exp(2.0)))


def test_topk_admits_the_globally_best_slots_as_prefixes():
    surv = torch.tensor([[0.9, 0.5, 0.1], [0.8, 0.7, 0.6], [0.2, 0.1, 0.05]], dtype=torch.float64)
    assert topk_widths(surv, 0) == [0, 0, 0]
    assert topk_widths(surv, 4) == [1, 3, 0]  # 0.9, 0.8, 0.7, 0.6
    assert topk_widths(surv, 9) == [3, 3, 3]
    assert topk_widths(surv, 20) == [3, 3, 3]  # capped per request at n


def test_topk_ties_follow_each_engine():
    tied = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    assert topk_widths(tied, 2, ties="request") == [2, 0]  # vLLM: ties handed out in request order
    assert topk_widths(tied, 2, ties="position") == [1, 1]  # SGLang: by position, then request
    tiny = torch.tensor([[0.9, 1e-7]], dtype=torch.float64)
    assert topk_widths(tiny, 2, ties="position") == [1]  # SGLang never admits a survival below 1e-6


def test_vllm_budget_maximises_expected_tokens_per_second():
    surv = torch.tensor([[0.9, 0.5, 0.1]], dtype=torch.float64)
    flat = np.full(10, 1.0)
    assert vllm_budget(surv, 0.0, flat) == 3  # verifying is free: take every draft
    steep = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # verify cost = tokens
    assert vllm_budget(surv, 0.0, steep) == 0  # 1/1 beats 1.9/2, 2.4/3, 2.5/4: only the bonus token
    assert vllm_budget(surv, 1.0, steep) == 1  # a draft cost to amortise: 1/2 < 1.9/3 > 2.4/4 > 2.5/5


def test_sglang_budget_reads_the_sps_table_at_the_floor_probe():
    surv = torch.tensor([[0.9, 0.5, 0.1]], dtype=torch.float64)
    # probes at 1 and 3 tokens: SPS 10 for 1-2 tokens, 5 from 3 on -> theta: 10, 19, 12, 12.5
    assert sglang_budget(surv, [1, 3], [10.0, 5.0]) == 1
    assert sglang_budget(surv, [1], [10.0]) == 3  # a flat table verifies everything (SGLang's "uninitialized")


def test_cost_table_prices_a_size_at_the_next_profiled_one_and_extrapolates():
    table = cost_table([(1, 1.0), (8, 3.0), (16, 4.0)], 20)
    assert table[0] == table[1] == 1.0
    assert table[2] == table[8] == 3.0
    assert table[20] == pytest.approx(4.5)
    assert cost_table([(1, 2.0), (4, 1.0)], 4)[4] == 2.0  # made non-decreasing


@pytest.mark.vllm
def test_cost_table_matches_vllms_builder():
    pytest.importorskip("vllm")
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import build_cost_tables_from_curves

    draft, verify = [(1, 0.5), (4, 0.9)], [(1, 1.0), (5, 0.8), (8, 3.0), (16, 4.0)]
    theirs = build_cost_tables_from_curves(draft, verify, 6, 30, 0)
    assert np.allclose(cost_table(draft, 6), theirs[0])
    assert np.allclose(cost_table(verify, 30), theirs[1])


def test_read_temperatures_checks_what_sglang_checks(tmp_path):
    path = tmp_path / "sts.json"
    path.write_text(json.dumps({"temperatures": [1.5, 0.8, 1.0]}))
    assert read_temperatures(path, 2) == [1.5, 0.8]
    with pytest.raises(VerifyError, match="3 temperatures but the run drafts 4"):
        read_temperatures(path, 4)
    path.write_text(json.dumps({"temperatures": [1.0, 0.0]}))
    with pytest.raises(VerifyError, match="> 0"):
        read_temperatures(path, 2)
    path.write_text("{")
    with pytest.raises(VerifyError, match="cannot read the STS sidecar"):
        read_temperatures(path, 2)


# ---- the engine ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_models):
    from dsparkhub.verify.reference.engine import ReferenceEngine

    root, model = tiny_models
    eng = ReferenceEngine(model, root / "dspark_run", ignore_eos=True)
    base = {c: eng.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=10, concurrency=c).outputs
            for c in (1, 3)}
    return eng, base


class _Costs:
    """A cost curve where verifying costs ``per_token`` s a token on top of a fixed step."""

    def __init__(self, per_token: float):
        self.per_token = per_token

    def draft_curve(self):
        return [(1, 0.001), (8, 0.001)]

    def verify_curve(self):
        return [(t, 0.001 + self.per_token * t) for t in (1, 2, 4, 8, 16, 32, 64)]

    def sps_probes(self):
        tokens = [1, 2, 4, 8, 16, 32, 64]
        return tokens, [1.0 / (0.002 + self.per_token * t) for t in tokens]


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("spec", ["static", "threshold:0.3", "threshold:1", "budget", "sps"])
def test_every_policy_is_lossless(engine, spec, concurrency):
    eng, base = engine
    eng.scheduler = Scheduler(parse_policies(spec)[0], 4, costs=_Costs(0.01))
    try:
        stats = eng.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=10, concurrency=concurrency)
    finally:
        eng.scheduler = None
    assert stats.outputs == base[concurrency]
    if spec == "threshold:1":  # a survival is never >= 1: one draft a step, the minimum
        assert stats.num_draft_tokens == stats.num_drafts
    if spec == "static":
        assert stats.num_draft_tokens == 4 * stats.num_drafts


def test_a_costly_verify_makes_the_budget_verify_less(engine):
    eng, base = engine
    verified = {}
    for per_token, label in ((0.0, "free"), (10.0, "costly")):
        eng.scheduler = Scheduler(Policy("budget"), 4, costs=_Costs(per_token))
        try:
            stats = eng.run(PROMPTS, num_speculative_tokens=4, max_new_tokens=10, concurrency=3)
        finally:
            eng.scheduler = None
        assert stats.outputs == base[3]
        verified[label] = stats.num_draft_tokens / stats.num_drafts
    assert verified["free"] == 4.0
    assert verified["costly"] < 1.0  # mostly width 0: only the bonus token, still the target's output


def test_step_costs_are_recorded_per_shape(engine):
    eng, _ = engine
    eng.step_costs = StepCosts()
    try:
        eng.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=6, concurrency=3)
        spec = dict(eng.step_costs.samples)
        eng.step_costs.clear()
        eng.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=6, concurrency=3)
        plain = dict(eng.step_costs.samples)
    finally:
        eng.step_costs = None
    assert (3, 3) in spec and all(w == 3 for _, w in spec)
    assert all(d > 0 and v > 0 for got in spec.values() for d, v in got)
    assert (3, None) in plain and all(w is None and d == 0.0 for (_, w), got in plain.items() for d, _ in got)


def test_step_costs_at_concurrency_1_come_from_the_batch_1_loop_with_their_context(engine):
    eng, base = engine
    eng.step_costs = StepCosts()
    try:
        stats = eng.run(PROMPTS, num_speculative_tokens=3, max_new_tokens=10)
        costs = eng.step_costs
    finally:
        eng.step_costs = None
    assert stats.outputs == base[1]
    assert stats.draft_s > 0  # the batch-1 loop's own counters (the batched path reports None)
    assert set(costs.samples) == {(1, 3)} and sum(map(len, costs.samples.values())) == stats.num_drafts
    # contexts 2 .. 14 tokens (prompts of 2-5 tokens, 10 new): the 16-token bucket only
    shapes = costs.context_shapes()
    assert [(s["requests"], s["width"], s["context"], s["steps"]) for s in shapes] == [(1, 3, 16, stats.num_drafts)]


@pytest.mark.parametrize("tokens, bucket", [(0, 16), (16, 16), (17, 32), (100, 128), (128, 128), (129, 256)])
def test_context_bucket_is_the_next_power_of_two(tokens, bucket):
    from dsparkhub.verify.costs import context_bucket

    assert context_bucket(tokens) == bucket


def test_verify_stores_step_costs_and_the_latency_law(engine, tiny_models, tmp_path):
    from dsparkhub.verify import runner
    from dsparkhub.verify.results.reading import read_results
    from dsparkhub.verify.results.table import format_summary_table
    from dsparkhub.verify.settings import LoadOptions, VerifySettings

    eng, _ = engine
    root, _ = tiny_models
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt_token_ids": {p}}}\n' for p in PROMPTS))
    out = tmp_path / "results.json"
    res = runner.run_verify(root / "dspark_run", root / "target", VerifySettings(
        num_speculative_tokens=[2, 3], datasets=[str(prompts)], max_new_tokens=10,
        load=LoadOptions(concurrency=(1, 3), repeats=2)), backend=eng, progress=False, check=False, out=out)
    assert eng.step_costs is None  # handed back
    rec = res.step_costs
    assert rec.source == "reference engine's own decoding steps"
    keys = {(s.num_speculative_tokens, s.concurrency, s.requests, s.width) for s in rec.shapes}
    assert {(None, 1, 1, None), (2, 1, 1, 2), (3, 1, 1, 3), (None, 3, 3, None), (3, 3, 3, 3)} <= keys
    assert all(s.context in (16, 32) and s.steps > 0 and s.verify_s > 0 for s in rec.shapes)
    assert all((s.draft_s > 0) == (s.width is not None) for s in rec.shapes)
    assert [(r.num_speculative_tokens, r.concurrency) for r in rec.law] == [(2, 1), (3, 1), (2, 3), (3, 3)]
    for r in rec.law:
        row = next(x for x in res.summary if (x.num_speculative_tokens, x.concurrency) ==
                   (r.num_speculative_tokens, r.concurrency))
        assert r.tau == row.mean_tau and r.measured == row.mean_speedup
        assert r.predicted == pytest.approx(r.t_target_s * r.tau / (r.t_draft_s + r.t_verify_s))
        assert r.ceiling == pytest.approx(r.predicted * (r.num_speculative_tokens + 1) / r.tau)
        assert r.measured_spread[0] <= r.measured <= r.measured_spread[1]
    again = read_results(out)
    assert again.step_costs == rec
    table = format_summary_table(again)
    assert "latency law L = (T_draft + T_verify) / tau" in table
    law = table[table.index("latency law"):].splitlines()
    assert law[3].split()[:2] == ["2", "1"] and f"{rec.law[0].predicted:.2f}x" in law[3]


def test_a_results_file_without_step_costs_has_no_such_key():
    from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings, VerifyResults

    res = VerifyResults("0", "d", "dspark", EngineInfo("vllm", "v", "gpu"), ModelRef("t", None), ModelRef("d", None),
                        Settings(0.0, 8, 0, [3]), [], [], None, None)
    assert "step_costs" not in res.to_dict()


def test_confidence_policies_on_a_drafter_without_head_are_refused_before_any_run(tiny_models):
    from dsparkhub.verify.schedule import run_schedule

    root, model = tiny_models
    with pytest.raises(VerifyError, match="policies threshold:0.5, sps read the confidence head") as err:
        run_schedule(root / "dflash", model, PROMPTS, policies=parse_policies("static,threshold:0.5,sps"),
                     concurrencies=[1], law_ns=[], law_concurrencies=[], sts=None,
                     progress=lambda line: pytest.fail(f"ran: {line}"))
    assert "--policy static" in err.value.hint


def test_a_budget_policy_without_costs_is_refused():
    with pytest.raises(VerifyError, match="needs measured step costs"):
        Scheduler(Policy("budget"), 4)


# ---- costs and the latency law ------------------------------------------------------------------------------------


def _costs(entries: dict) -> StepCosts:
    c = StepCosts()
    for (rows, width), (draft, verify, count) in entries.items():
        for _ in range(count):
            c.record(rows, width, draft, verify)
    return c


def test_latency_law_predicts_from_the_steady_steps():
    base = _costs({(2, None): (0.0, 0.010, 50)})
    spec = _costs({(2, 3): (0.004, 0.016, 20), (1, 3): (0.004, 0.5, 1)})  # the tail step is left out
    bstats = RunStats(outputs=[[0] * 100], wall_s=0.5)
    sstats = RunStats(outputs=[[0] * 100], wall_s=0.3, num_drafts=20, num_accepted_tokens=20,
                      accepted_per_pos=[12, 6, 2])
    row = latency_law(n=3, concurrency=2, base_costs=base, spec_costs=spec, base_stats=bstats, spec_stats=sstats)
    assert row.num_speculative_tokens == 3 and row.tau == pytest.approx(2.0)
    assert row.predicted == pytest.approx(0.010 * 2.0 / 0.020)
    assert row.ceiling == pytest.approx(0.010 * 4 / 0.020)
    assert row.measured == pytest.approx(0.5 / 0.3)
    assert row.flag == ""  # above the prediction, below the ceiling

def test_latency_law_flags_and_explains():
    base = _costs({(2, None): (0.0, 0.010, 50)})
    spec = _costs({(2, 3): (0.004, 0.016, 20)})
    bstats = RunStats(outputs=[[0] * 100], wall_s=0.5)
    fast = RunStats(outputs=[[0] * 100], wall_s=0.1, num_drafts=20, num_accepted_tokens=20,
                    accepted_per_pos=[12, 6, 2])
    row = latency_law(n=3, concurrency=2, base_costs=base, spec_costs=spec, base_stats=bstats, spec_stats=fast)
    assert row.measured == pytest.approx(5.0) and row.flag == "above ceiling"
    slow = RunStats(outputs=[[0] * 100], wall_s=2.0, num_drafts=20, num_accepted_tokens=20,
                    accepted_per_pos=[12, 6, 2])  # 0.4 s in steps of a 2 s run: the rest is outside the steps
    row = latency_law(n=3, concurrency=2, base_costs=base, spec_costs=spec, base_stats=bstats, spec_stats=slow)
    assert row.flag == "shortfall"
    assert row.note.startswith("time outside the steps (prefill, admission, bookkeeping): 80% of the speculative")
    # verify's rows carry the repeats' range: a shortfall is judged against it (none of 3 repeats reached 0.8x)
    kw = dict(n=3, concurrency=2, base_costs=base, spec_costs=_costs({(2, 3): (0.004, 0.016, 20), (1, 3):
                                                                       (0.004, 0.016, 30)}),
              tau=2.0, measured=0.75, base_wall_s=0.5, spec_wall_s=1.25)
    row = law_row(**kw, measured_spread=[0.7, 0.8])
    assert row.predicted == pytest.approx(1.0) and row.flag == "shortfall"
    assert row.note.startswith("steps with fewer than 2 requests (admission, the run's tail): 48% of the speculative")
    assert law_row(**kw, measured_spread=[0.7, 1.05]).flag == ""  # a repeat reached the prediction
    with pytest.raises(VerifyError, match="no steady steps recorded at concurrency 4"):
        latency_law(n=3, concurrency=4, base_costs=base, spec_costs=spec, base_stats=bstats, spec_stats=slow)


def test_sps_probes_merge_shapes_by_batch_tokens():
    c = _costs({(1, 3): (0.1, 0.1, 1), (2, 1): (0.1, 0.3, 1), (4, 0): (0.0, 1.0, 1), (4, None): (0.0, 9.0, 1)})
    assert c.sps_probes() == ([4], [pytest.approx(1 / 0.4)])  # median of 0.2, 0.4 and 1.0; plain steps ignored
    assert c.verify_curve() == [(4, pytest.approx(0.65))]  # median of 0.1, 0.3, 1.0 and the plain step's 9.0


# ---- the SPS table --------------------------------------------------------------------------------------------------


def test_build_table_refuses_what_sglang_refuses(tmp_path):
    table = build_table([4, 8], [100.0, 60.0], engine="reference", hardware="cpu", source="test")
    assert table["max_batch_tokens"] == 8 and table["hardware"] == "cpu"
    assert table_problems({**table, "sample_batch_tokens": [8, 4]})[0].startswith("`sample_batch_tokens` must be "
                                                                                  "strictly increasing")
    assert "below the largest probe" in table_problems({**table, "max_batch_tokens": 2})[0]
    with pytest.raises(VerifyError, match="1 entries for 2 probes"):
        build_table([4, 8], [1.0], engine="e", hardware="h", source="s")
    path = write_table(table, tmp_path / SPS_FILE)
    with pytest.raises(OutputExistsError):
        write_table(table, path)


_SGLANG_READERS = r"""
import importlib.util, json, sys, types
root = sys.argv[1]
for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.speculative.dspark_components"):
    sys.modules.setdefault(name, types.ModuleType(name))  # the package __init__ pulls in the whole server
def load(name, rel):
    spec = importlib.util.spec_from_file_location(name, f"{root}/{rel}")
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod)
    return mod
sps = load("sglang.srt.speculative.dspark_components.dspark_sps", "srt/speculative/dspark_components/dspark_sps.py")
sts = load("sglang.srt.speculative.dspark_components.dspark_sts", "srt/speculative/dspark_components/dspark_sts.py")
table = sps.load_sps_table_from_path(sys.argv[2])
cal = sts.load_sts_calibration_from_path(sys.argv[3])
print(json.dumps({"type": type(table).__name__, "tokens": table.sample_batch_tokens,
                  "lookup": [table.lookup(t) for t in (1, 5, 8, 100)], "max": table.max_batch_tokens,
                  "temperatures": list(cal.temperatures)}))
"""


def _sglang_root() -> tuple[str, str]:
    """(python, folder of the sglang package) of .venv-sglang; skip (fail in CI) without it, as test_sglang.py."""
    import os

    from dsparkhub.verify.sglang.checks import find_sglang_python

    python = find_sglang_python()
    if python is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must run the SGLang checks, but .venv-sglang is missing")
        pytest.skip(".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`")
    code = "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
    loc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return str(python), loc


@pytest.mark.sglang
def test_sglangs_own_readers_load_the_sps_table_and_the_sts_file(tmp_path):
    from dsparkhub.calibrate import write_sidecar

    python, root = _sglang_root()
    table = write_table(build_table([1, 4, 8], [150.0, 90.0, 60.0], engine="reference", hardware="cpu (1 thread)",
                                    source="test"), tmp_path / SPS_FILE)
    sts = write_sidecar({"temperatures": [1.2, 0.9, 1.0], "dataset": "x", "num_samples": 10}, tmp_path / "sts.json")
    res = subprocess.run([python, "-c", _SGLANG_READERS, root, str(table), str(sts)], capture_output=True,
                         text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"type": "SpsCostTable", "tokens": [1, 4, 8], "lookup": [150.0, 90.0, 60.0, 60.0], "max": 8,
                   "temperatures": [1.2, 0.9, 1.0]}
    assert read_temperatures(sts, 3) == got["temperatures"]


# ---- the command ----------------------------------------------------------------------------------------------------


def test_schedule_command_prints_both_tables_and_writes_the_sps_table(tiny_models, tmp_path):
    root, _ = tiny_models
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [0.5, 0.5, 2.0, 2.0]}))
    out = tmp_path / "sps.json"
    args = ["schedule", str(root / "dspark_run"), "--target", str(root / "target"), "--datasets", str(prompts),
            "--max-new-tokens", "6", "--concurrency", "1,2", "--law-n", "2", "--law-concurrency", "2",
            "--sts", str(sts), "--sps-out", str(out), "--quiet"]
    res = CliRunner().invoke(main, args + ["--out", str(tmp_path / "schedule.json")])
    assert res.exit_code == 0, res.output
    from dsparkhub.verify.schedule import advice, read_report

    report, said = read_report(tmp_path / "schedule.json")  # the card's --schedule reads it back
    assert len(report.policies) == 14 and report.law[0].concurrency == 2 and said == advice(report)
    assert said in res.output and report.baseline_tokens_per_s.keys() == {1, 2}
    assert "latency law" in res.output and "predicted" in res.output
    for row in ("static          -       1", "threshold:0.5   raw     2", "threshold:0.5   sts     2",
                "budget          sts     1", "sps             raw     2"):
        assert row in res.output
    assert " NO" not in res.output  # every policy lossless
    table = json.loads(out.read_text())
    assert table_problems(table) == [] and table["engine"].startswith("reference") and table["hardware"]
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "already exists" in again.output
    assert CliRunner().invoke(main, args + ["--overwrite"]).exit_code == 0  # its own table: replaced
    mine = tmp_path / "mine.json"  # a user's JSON file, and a drafter's own config: never written over (issue 29)
    mine.write_text('{"todo": 1}')
    at = args.index("--sps-out") + 1
    refused = CliRunner().invoke(main, args[:at] + [str(mine)] + args[at + 1:] + ["--overwrite"])
    assert refused.exit_code == 1 and "not dsparkhub's to replace" in refused.output, refused.output
    config = tmp_path / "drafter" / "config.json"
    config.parent.mkdir()
    config.write_text('{"architectures": ["DSparkDraftModel"]}')
    before = config.read_bytes()
    refused = CliRunner().invoke(main, args[:at] + [str(config)] + args[at + 1:] + ["--overwrite"])
    assert refused.exit_code == 1 and "named like a checkpoint's own file" in refused.output, refused.output
    assert mine.read_text() == '{"todo": 1}' and config.read_bytes() == before


@pytest.mark.slow
def test_the_example_drafter_end_to_end(example, tmp_path):
    """The shipped DSpark drafter: every policy lossless with raw and calibrated confidences, the law's rows sane,
    and the budget policies verifying fewer draft tokens than static."""
    from dsparkhub.verify.schedule import schedule_release

    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.8, 10.0, 8.9, 2.0, 4.5, 0.22, 0.18]}))  # the example's own fit
    report, path = schedule_release(example.deepspec_run, example.target, datasets=[str(example.prompts)],
                                    max_prompts=8, sps_out=tmp_path / SPS_FILE, policies=parse_policies(
                                        "static,threshold:0.5,budget,sps"), concurrencies=[1, 4], law_ns=[3],
                                    law_concurrencies=[4], sts=sts, max_new_tokens=24)
    assert all(r.lossless for r in report.policies)
    assert {(r.policy, r.confidences) for r in report.policies} >= {("budget", "sts"), ("sps", "raw")}
    static = next(r for r in report.policies if r.policy == "static")
    assert static.verified == 7.0 and min(r.verified for r in report.policies) < 7.0
    (law,) = report.law
    assert 0 < law.predicted < law.ceiling and 1.0 < law.tau <= 4.0
    assert table_problems(json.loads(path.read_text())) == []


# ---- the report: advice, JSON --------------------------------------------------------------------------------------


def _report(rows):
    from dsparkhub.verify.schedule import PolicyRow, ScheduleReport

    return ScheduleReport(gamma=7, engine="reference (x)", hardware="cpu (1 thread)", baseline_tokens_per_s={1: 100.0},
                          policies=[PolicyRow(pol, conf, c, 50, verified, 7 - verified - 1, 0.0, tau, tps, 7 - verified,
                                              True) for pol, conf, c, verified, tau, tps in rows])


def test_advice_recommends_a_policy_only_where_it_pays():
    from dsparkhub.verify.schedule import advice

    flat = _report([("static", "-", 1, 7.0, 2.32, 120.0), ("budget", "sts", 1, 2.1, 2.31, 121.0),
                    ("threshold:0.5", "sts", 1, 1.0, 1.8, 110.0)])  # saves more, but loses τ: not the example
    text = advice(flat)
    assert text.startswith("Serve with a static n = 7 on this engine: budget (sts) saves 4.90 of 7 verify tokens")
    assert "no policy gains more than 5% tokens/s" in text
    paying = _report([("static", "-", 1, 7.0, 2.32, 120.0), ("static", "-", 4, 7.0, 2.32, 200.0),
                      ("sps", "raw", 4, 3.0, 2.25, 230.0)])
    assert advice(paying).startswith("From concurrency 4 on, serve with sps with raw confidences rather than a "
                                     "static n = 7: it verifies 3.00 draft tokens per request-step instead of 7.00")
    broken = _report([("static", "-", 4, 7.0, 2.32, 200.0), ("sps", "raw", 4, 3.0, 2.25, 230.0)])
    broken.policies[1].lossless = False  # never recommended
    assert advice(broken).startswith("No confidence policy beats a static n = 7")


def test_the_report_round_trips_and_a_wrong_file_is_refused(tmp_path):
    from dsparkhub.io.output import replace_json
    from dsparkhub.verify.schedule import read_report, report_dict

    rep = _report([("static", "-", 1, 7.0, 2.32, 120.0), ("budget", "raw", 1, 2.5, 2.3, 125.0)])
    rep.law = [latency_law(n=3, concurrency=2, base_costs=_costs({(2, None): (0.0, 0.010, 5)}),
                           spec_costs=_costs({(2, 3): (0.004, 0.016, 5)}),
                           base_stats=RunStats(outputs=[[0] * 100], wall_s=0.5),
                           spec_stats=RunStats(outputs=[[0] * 100], wall_s=0.3, num_drafts=20,
                                               num_accepted_tokens=20, accepted_per_pos=[12, 6, 2]))]
    path = replace_json(tmp_path / "schedule.json", report_dict(rep))
    again, said = read_report(path)
    assert again.policies == rep.policies and again.law == rep.law and again.baseline_tokens_per_s == {1: 100.0}
    assert said == report_dict(rep)["advice"]
    data = json.loads(path.read_text())
    data["policies"][1]["tau"] = "high"
    path.write_text(json.dumps(data))
    with pytest.raises(VerifyError, match=r"does not fit dsparkhub.schedule/1: policies\.1\.tau"):
        read_report(path)
    path.write_text(json.dumps({"sample_steps_per_sec": [1.0]}))
    with pytest.raises(VerifyError, match="not a `dsparkhub schedule --out` report"):
        read_report(path)
