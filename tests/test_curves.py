"""dsparkhub.verify.results.curves: per-user vs total tokens/s curves, the per-user speedup at matched total
throughput (inside / beyond the baseline's range), the SLA row (met on a point, on a segment, not met), the best
configuration per concurrency with its margin against the spread, and their place in `compare` and `card`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.verify.results.curves import (
    BEYOND_RANGE,
    NOT_MET,
    best_per_concurrency,
    curves,
    matched,
    sla_point,
)
from dsparkhub.verify.results.derive import build_results
from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings
from dsparkhub.verify.stats import RunStats

OUT = [list(range(2, 12))]  # one prompt, 10 output tokens: total tok/s = 10 / wall, per-user = 10 / latency


def _stats(wall, lat, n=0):
    d = 4 if n else 0
    return RunStats(outputs=OUT, wall_s=wall, num_drafts=d, num_draft_tokens=d * n, num_accepted_tokens=d * n // 2,
                    accepted_per_pos=[d // 2] * n, ttft_s=[lat / 10], latency_s=[lat])


def _results(base: dict, spec: dict, repeats: int = 1):
    """base: {c: [(wall, latency) per repeat]}; spec: {(n, c): [(wall, latency) per repeat]}."""
    ns, cs = sorted({n for n, _ in spec}), sorted(base)
    runs = [("math", "builtin:math", {c: [_stats(*x) for x in v] for c, v in base.items()},
             {k: [_stats(*x, n=k[0]) for x in v] for k, v in spec.items()})]
    return build_results(engine=EngineInfo("reference", "dsparkhub 0.1.0", "cpu"), method="dspark",
                         target=ModelRef("Qwen/Qwen3-8B", None), drafter=ModelRef("drafter", None),
                         settings=Settings(temperature=0.0, max_new_tokens=10, seed=0, num_speculative_tokens=ns,
                                           concurrency=cs, repeats=repeats),
                         runs=runs, date="2026-12-01T00:00:00+00:00")


# baseline (total, per-user): c1 (10, 10), c2 (20, 8), c4 (40, 5); n=3: c1 (12.5, 20), c2 (25, 10), c4 (50, 8)
SWEEP = _results({1: [(1.0, 1.0)], 2: [(0.5, 1.25)], 4: [(0.25, 2.0)]},
                 {(3, 1): [(0.8, 0.5)], (3, 2): [(0.4, 1.0)], (3, 4): [(0.2, 1.25)]})


def test_curves_per_configuration():
    base, n3 = curves(SWEEP)
    assert base.label == "no speculation" and base.n is None
    assert [(p.concurrency, p.total_tokens_per_s, p.per_user_tokens_per_s) for p in base.points] == \
        [(1, 10.0, 10.0), (2, 20.0, 8.0), (4, 40.0, 5.0)]
    assert n3.label == "n=3" and [p.total_tokens_per_s for p in n3.points] == [12.5, 25.0, 50.0]


def test_curves_name_a_drafter_baseline():
    """With ``verify --baseline PATH`` the baseline's curve and every table carry its name (``BaselineRef.label``),
    never "no speculation"."""
    import copy

    from dsparkhub.verify.results.curves import tables
    from dsparkhub.verify.results.schema import BaselineRef

    res = copy.deepcopy(SWEEP)
    res.baseline = BaselineRef(kind="drafter", id="dflash-drafter", n=7, method="dflash")
    assert curves(res)[0].label == "DFlash n=7"
    text = repr(tables(res, [8.0]))
    assert "DFlash n=7" in text and "no speculation" not in text


def test_matched_inside_range_is_linear_and_beyond_is_not_extrapolated():
    m = matched(SWEEP)
    # 12.5 tok/s lies a quarter of the way from (10, 10) to (20, 8): baseline per-user 9.5
    assert m[0].baseline_per_user_tokens_per_s == pytest.approx(9.5) and m[0].speedup == pytest.approx(20 / 9.5)
    assert m[1].baseline_per_user_tokens_per_s == pytest.approx(7.25) and m[1].speedup == pytest.approx(10 / 7.25)
    assert m[2].speedup is None and m[2].baseline_per_user_tokens_per_s is None and m[2].note == BEYOND_RANGE


def test_sla_met_on_a_segment_on_a_point_and_not_met():
    base, n3 = curves(SWEEP)
    s = sla_point(base, 9)  # crosses 9 halfway between c1 (10) and c2 (8)
    assert (s.total_tokens_per_s, s.concurrency, s.note) == (pytest.approx(15.0), pytest.approx(1.5), None)
    s = sla_point(n3, 9)  # met at c2 (25), crossed halfway to c4: 37.5 at concurrency 3
    assert (s.total_tokens_per_s, s.concurrency) == (pytest.approx(37.5), pytest.approx(3.0))
    assert sla_point(n3, 8).total_tokens_per_s == pytest.approx(50.0)  # met at the last point exactly
    s = sla_point(base, 30)
    assert (s.total_tokens_per_s, s.concurrency, s.note) == (None, None, NOT_MET)


def test_best_per_concurrency_margin_and_spread():
    base = {1: [(1.0, 1.0), (1.0, 1.0)]}
    # n=5 at 1.923x leads n=3 (median 1.909x, repeats 2.0x / 1.818x: spread 9.5%) by 0.7%: within the spread
    tie = best_per_concurrency(_results(base, {(3, 1): [(0.5, 0.5), (0.55, 0.5)], (5, 1): [(0.52, 0.5)] * 2}, 2))
    assert [(b.label, b.runner_up, b.within_spread) for b in tie] == [("n=5", "n=3", True)]
    assert tie[0].margin == pytest.approx(1 / 0.52 - (2.0 + 1 / 0.55) / 2)
    clear = best_per_concurrency(_results(base, {(3, 1): [(0.8, 0.5), (0.82, 0.5)], (5, 1): [(0.5, 0.5)] * 2}, 2))
    assert [(b.label, b.runner_up, b.within_spread) for b in clear] == [("n=5", "n=3", False)]
    # one repeat: no spread measured; the baseline leads where no n pays
    slow = best_per_concurrency(_results({1: [(1.0, 1.0)]}, {(3, 1): [(1.25, 1.0)]}))
    assert [(b.label, b.runner_up, b.within_spread) for b in slow] == [("no speculation", "n=3", None)]
    assert slow[0].margin == pytest.approx(0.2)
    # the pick is the results' own best_n, not recomputed
    assert best_per_concurrency(SWEEP)[0].label == f"n={SWEEP.best_n(1)[0]}"


def test_compare_cli_prints_matched_sla_and_best(tmp_path):
    p = SWEEP.save(tmp_path / "sweep.json")
    r = CliRunner().invoke(main, ["compare", str(p), "--sla-tokens-per-s", "9", "--sla-tokens-per-s", "30"])
    assert r.exit_code == 0, r.output
    assert "Per-user tokens/s at matched total throughput" in r.output and "2.11x" in r.output
    assert BEYOND_RANGE in r.output
    assert "max total tok/s at >= 9 tok/s per user (concurrency)" in r.output
    assert "37.5 (3)" in r.output and "15.0 (~1.5)" in r.output and NOT_MET in r.output
    assert "Best configuration per concurrency" in r.output
    bad = CliRunner().invoke(main, ["compare", str(p), "--sla-tokens-per-s", "0"])
    assert bad.exit_code == 2 and "--sla-tokens-per-s" in bad.output


def test_card_gets_matched_table_sla_row_and_pareto_plot(tmp_path):
    from test_compare import _drafter_folder

    from dsparkhub.verify.results.reading import read_results

    d, fp = _drafter_folder(tmp_path)
    p = SWEEP.save(tmp_path / "mine.json")
    res = read_results(p)
    res.drafter = ModelRef("drafter", fp)
    res.save(p)
    r = CliRunner().invoke(main, ["card", str(d), "--results", str(p), "--sla-tokens-per-s", "9"])
    assert r.exit_code == 0, r.output
    text = (d / "README.md").read_text()
    assert "Per-user tokens/s at matched total throughput" in text and "| 3 | 1 | 12.5 | 20.0 | 9.5 | 2.11x |" in text
    assert "| no speculation | 15.0 (~1.5) |" in text and "| n=3 | 37.5 (3) |" in text
    assert "![per-user vs total tokens/s](assets/per_user_vs_total.png)" in text
    assert (d / "assets" / "per_user_vs_total.png").stat().st_size > 10_000



def test_card_compare_draws_the_other_drafters_in_the_load_plots(tmp_path, monkeypatch):
    """With ``card --compare``, the per-user vs total plot and the speedup-vs-concurrency plot carry one line per n
    of each compared drafter (labelled by method and public id, never a local path); the card's own lines and its
    baseline are drawn once."""
    import copy

    from test_compare import _drafter_folder

    import dsparkhub.card.plots as plots
    from dsparkhub.verify.results.reading import read_results

    legends = {}
    save = plots._save_png

    def capture(fig, path):
        legends[path.name] = [t.get_text() for ax in fig.axes if ax.get_legend()
                              for t in ax.get_legend().get_texts()]
        return save(fig, path)

    monkeypatch.setattr(plots, "_save_png", capture)
    d, fp = _drafter_folder(tmp_path)
    mine = SWEEP.save(tmp_path / "mine.json")
    res = read_results(mine)
    res.drafter = ModelRef("drafter", fp)
    res.save(mine)
    other = copy.deepcopy(SWEEP)
    other.method, other.drafter = "eagle3", ModelRef(str(tmp_path / "models" / "eagle3-drafter"), None)
    other_path = other.save(tmp_path / "eagle3.json")
    r = CliRunner().invoke(main, ["card", str(d), "--results", str(mine), "--compare", str(other_path)])
    assert r.exit_code == 0, r.output
    pareto = legends["per_user_vs_total.png"]
    assert pareto == ["no speculation", "DSpark drafter n=3", "EAGLE-3 eagle3-drafter n=3"]
    assert "EAGLE-3 eagle3-drafter (best n)" in legends["speedup_vs_concurrency.png"]
    assert not any(str(tmp_path) in t for ts in legends.values() for t in ts)


@pytest.mark.slow
def test_real_reference_sweep_of_the_example(example, tmp_path):
    """The example's DSpark drafter on the CPU reference engine at concurrency 1, 2, 4: three points per curve, every
    matched-throughput cell either a speedup or the out-of-range note, and `compare` prints the tables."""
    import shutil

    import torch

    from dsparkhub.verify.results.reading import read_results

    torch.set_num_threads(1)
    draft = tmp_path / "draft"
    shutil.copytree(example.dspark_step, draft, symlinks=False,
                    ignore=shutil.ignore_patterns("training_state*", "*.pt"))
    out = tmp_path / "results.json"
    r = CliRunner().invoke(main, ["verify", str(draft), "--target", str(example.target), "-n", "3",
                                  "--concurrency", "1,2,4", "--datasets", f"heldout={example.prompts}",
                                  "--max-prompts", "4", "--max-new-tokens", "16", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    res = read_results(out)
    assert res.lossless is True
    assert [[p.concurrency for p in cv.points] for cv in curves(res)] == [[1, 2, 4], [1, 2, 4]]
    cells = matched(res)
    assert len(cells) == 3 and all((m.speedup is None) == (m.note == BEYOND_RANGE) for m in cells)
    assert all(m.speedup > 0 for m in cells if m.speedup is not None)
    r = CliRunner().invoke(main, ["compare", str(out), "--sla-tokens-per-s", "1"])
    assert r.exit_code == 0, r.output
    assert "Per-user tokens/s at matched total throughput" in r.output and "Best configuration" in r.output
