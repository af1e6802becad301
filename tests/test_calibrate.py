"""Confidence calibration: the STS fitter on synthetic data with known temperatures, censoring, pooling, metrics,
the sidecar against SGLang 0.5.23's own reader and fitter, refusals, and the example drafter end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dsparkhub.validate.sidecar import STS_FILE, sidecar_problems
from dsparkhub.calibrate import (
    CalibrationError,
    build_sidecar,
    read_sidecar,
    write_sidecar,
)
from dsparkhub.cli import main
from dsparkhub.verify import calibration as cal

REPO = Path(__file__).resolve().parents[1]


def synthetic(n: int, temperatures, *, mu: float = 2.0, seed: int = 0, verified=None, datasets=("syn",)):
    """Steps whose true acceptance probability at position i is sigmoid(z_i) while the head reports z_i * T_i:
    dividing by T_i recovers a calibrated survival."""
    rng = np.random.default_rng(seed)
    gamma = len(temperatures)
    z = rng.normal(mu, 1.5, size=(n, gamma))
    ok = rng.random((n, gamma)) < 1.0 / (1.0 + np.exp(-z))
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    width = np.full(n, gamma) if verified is None else np.asarray(verified)
    logits = np.where(np.arange(gamma)[None, :] < width[:, None], z * np.asarray(temperatures)[None, :], np.nan)
    names = np.asarray([datasets[i % len(datasets)] for i in range(n)], dtype=object)
    return cal.ConfidenceRecords(logits, np.minimum(accepted, width).astype(np.int64), width.astype(np.int64), names,
                                 np.arange(n, dtype=np.int64) // 4)


def test_fitter_recovers_a_known_temperature():
    records = synthetic(20000, [2.0] * 4)  # DeepSeek's finding: raw confidences over-confident
    fit = cal.fit_sts(records)
    assert fit.pooled == [None] * 4 and fit.samples == [20000] * 4
    assert all(abs(t - 2.0) / 2.0 < 0.1 for t in fit.temperatures[:2]), fit.temperatures
    assert all(abs(t - 2.0) / 2.0 < 0.3 for t in fit.temperatures), fit.temperatures
    assert all(a < b / 3 for a, b in zip(fit.ece_after, fit.ece_before))
    refined = cal.fit_sts(records, refine=True)
    assert abs(refined.temperatures[0] - 2.0) < 0.1
    assert refined.ece_after[0] <= fit.ece_after[0]  # refinement is kept only when it lowers the fit ECE


def test_fitter_tells_temperatures_per_position_apart():
    fit = cal.fit_sts(synthetic(20000, [0.6, 2.5, 1.0], seed=3))
    assert abs(fit.temperatures[0] - 0.6) < 0.07 and abs(fit.temperatures[1] - 2.5) < 0.4


def test_calibrated_input_keeps_temperature_near_one():
    fit = cal.fit_sts(synthetic(20000, [1.0, 1.0], seed=5))
    assert all(0.85 < t < 1.15 for t in fit.temperatures)


def test_positions_beyond_the_verified_width_are_not_rejections():
    """A draft truncated to width 1 says nothing about position 2: the sample is left out, not counted as 0."""
    full = synthetic(8000, [1.5, 1.5], seed=1)
    width = np.where(np.arange(8000) % 2 == 0, 1, 2)
    cut = synthetic(8000, [1.5, 1.5], seed=1, verified=width)
    assert cal.fit_sts(cut).samples == [8000, 4000]
    assert cut.valid[:, 1].sum() == 4000 and not np.isnan(cut.logits[cut.valid]).any()
    # the labels that remain are the same as with full width, so position 2's acceptance is unbiased
    rows = cal.position_metrics(cut, [1.0, 1.0])
    assert abs(rows[1]["acceptance"] - cal.position_metrics(full, [1.0, 1.0])[1]["acceptance"]) < 0.03


def test_thin_positions_are_pooled_and_say_so():
    n = 3000
    width = np.where(np.arange(n) < 60, 4, 2)  # positions 3 and 4 verified in 60 steps only
    fit = cal.fit_sts(synthetic(n, [2.0] * 4, verified=width, mu=1.0), min_samples=100, min_class=5)
    assert fit.pooled[:2] == [None, None]
    assert fit.pooled[2] == fit.pooled[3] and "draft positions 3-4" in fit.pooled[2]
    assert fit.temperatures[2] == fit.temperatures[3]
    thin = cal.fit_sts(synthetic(n, [2.0] * 3, verified=np.where(np.arange(n) < 20, 3, 2)), min_samples=100)
    assert "carries draft position 2's temperature" in thin.pooled[2]
    assert thin.temperatures[2] == thin.temperatures[1]


def test_ece_brier_auroc_on_hand_checked_values():
    assert cal.expected_calibration_error(np.array([0.95, 0.95, 0.05, 0.05]), np.array([1, 0, 0, 0]), 15) == \
        pytest.approx((0.45 * 2 + 0.05 * 2) / 4)
    assert cal.brier_score(np.array([1.0, 0.0]), np.array([0, 0])) == 0.5
    assert cal.auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert cal.auroc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5  # ties share their rank
    assert cal.auroc(np.array([0.2, 0.3]), np.array([1, 1])) is None


def test_threshold_sweep():
    records = synthetic(4000, [1.0] * 5, mu=1.0)
    rows = cal.threshold_sweep(records, [1.0] * 5)
    assert [r["threshold"] for r in rows] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert rows[0]["draft_tokens_per_step"] == 5.0
    assert rows[0]["acceptance_rate"] == pytest.approx(records.accepted.sum() / (5 * 4000))
    widths = [r["draft_tokens_per_step"] for r in rows]
    rates = [r["acceptance_rate"] for r in rows]
    assert widths == sorted(widths, reverse=True) and widths[-1] >= 1.0
    assert rates[-1] > rates[0] + 0.2  # keeping only confident tokens raises their acceptance rate


def test_split_is_by_prompt_and_needs_two_prompts():
    records = synthetic(400, [1.0, 1.0], datasets=("a", "b"))
    fit, held = records.split(0.5, seed=0)
    assert len(fit) + len(held) == 400
    for name in ("a", "b"):
        assert not set(fit.prompt[fit.dataset == name]) & set(held.prompt[held.dataset == name])
    with pytest.raises(ValueError, match="at least 2"):
        records.subset(records.prompt == 0).split(0.5)


def _sidecar():
    records = synthetic(2000, [2.0] * 3, datasets=("code", "math"))
    fit_rec, held = records.split(0.5, seed=0)
    return build_sidecar(cal.fit_sts(fit_rec), fit_rec, held, fit_fraction=0.5, seed=0)


def test_sidecar_schema(tmp_path):
    data = _sidecar()
    assert data["dataset"] == "code,math" and data["gamma"] == 3 and len(data["temperatures"]) == 3
    assert set(data["per_dataset"]) == {"code", "math"} and set(data["sweep"]["calibrated"]) == {"all", "code", "math"}
    assert data["positions"][0]["samples"] + data["positions"][0]["fit_samples"] == 2000
    path = write_sidecar(data, tmp_path / STS_FILE)
    assert read_sidecar(path)["temperatures"] == data["temperatures"]
    with pytest.raises(FileExistsError):
        write_sidecar(data, path)


@pytest.mark.parametrize("data, problem", [
    ({"temperatures": []}, "non-empty"), ({"temperatures": [1.0, -2.0]}, "> 0"), ([1.0], "JSON object"),
    ({"temperatures": [1.0], "dataset": ["a"]}, "`dataset`"), ({"temperatures": [1.0], "num_samples": 2.5},
                                                                "`num_samples`"),
    ({"temperatures": [1.0], "ece_after": [None]}, "`ece_after`"),
])
def test_sidecar_problems_follow_sglangs_reader(data, problem, tmp_path):
    assert any(problem in p for p in sidecar_problems(data))
    with pytest.raises(CalibrationError):
        write_sidecar(data, tmp_path / STS_FILE)


# ---- SGLang 0.5.23's own reader and fitter ------------------------------------------------------------------

_SGLANG_SCRIPT = r"""
import importlib.util, json, sys, types
root = sys.argv[1]
for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.speculative.dspark_components",
             "sglang.benchmark"):
    sys.modules.setdefault(name, types.ModuleType(name))  # the package __init__ pulls in the whole server
def load(name, rel):
    spec = importlib.util.spec_from_file_location(name, f"{root}/{rel}")
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod)
    return mod
sts = load("sglang.srt.speculative.dspark_components.dspark_sts", "srt/speculative/dspark_components/dspark_sts.py")
fitter = load("sglang.benchmark.dspark_sts_fit", "benchmark/dspark_sts_fit.py")
import torch
req = json.load(open(sys.argv[2]))
out = {}
if "sidecar" in req:
    c = sts.load_sts_calibration_from_path(req["sidecar"])
    out["loaded"] = {"temperatures": list(c.temperatures), "dataset": c.dataset, "num_samples": c.num_samples,
                     "ece_before": list(c.ece_before), "ece_after": list(c.ece_after)}
if "logits" in req:
    r = fitter.fit_sts_temperatures(logits=torch.tensor(req["logits"]), prefix_mask=torch.tensor(req["mask"]),
                                    grid=fitter.default_temperature_grid(), num_bins=15)
    out["fit"] = r
print(json.dumps(out))
"""


def _sglang_source() -> tuple[str, Path]:
    """(python, folder of the sglang package) from the repo's .venv-sglang (scripts/setup_sglang.sh), else from an
    unzipped sglang 0.5.23 wheel named by DSPARKHUB_SGLANG_SRC (run with this interpreter: needs msgspec)."""
    py = REPO / ".venv-sglang" / "bin" / "python"
    if py.exists():
        code = "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
        loc = subprocess.run([str(py), "-c", code],
                             capture_output=True, text=True, check=True).stdout.strip()
        return str(py), Path(loc)
    src = os.environ.get("DSPARKHUB_SGLANG_SRC")
    if src and (Path(src) / "sglang" / "srt").is_dir():
        pytest.importorskip("msgspec")
        return sys.executable, Path(src) / "sglang"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{py} is missing: CI builds it with scripts/setup_sglang.sh")
    pytest.skip("no .venv-sglang (scripts/setup_sglang.sh) and no DSPARKHUB_SGLANG_SRC")


def _run_sglang(tmp_path, request: dict) -> dict:
    python, root = _sglang_source()
    (tmp_path / "req.json").write_text(json.dumps(request))
    res = subprocess.run([python, "-c", _SGLANG_SCRIPT, str(root), str(tmp_path / "req.json")], capture_output=True,
                         text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_sglang_reader_loads_the_sidecar_unchanged(tmp_path):
    data = _sidecar()
    path = write_sidecar(data, tmp_path / STS_FILE)
    loaded = _run_sglang(tmp_path, {"sidecar": str(path)})["loaded"]
    assert loaded == {k: data[k] for k in ("temperatures", "dataset", "num_samples", "ece_before", "ece_after")}


def test_grid_fit_picks_sglangs_temperatures(tmp_path):
    records = synthetic(3000, [2.0, 0.7, 1.3], mu=1.0, seed=7)
    ours = cal.fit_sts(records, min_samples=1, min_class=1)
    theirs = _run_sglang(tmp_path, {"logits": records.logits.tolist(), "mask": records.labels.tolist()})["fit"]
    assert ours.temperatures == theirs["temperatures"]
    # their torch.tensor() holds the logits in float32
    assert ours.ece_after == pytest.approx(theirs["ece_after"], abs=1e-7)
    assert ours.ece_before == pytest.approx(theirs["ece_before"], abs=1e-7)


# ---- the command --------------------------------------------------------------------------------------------


def test_a_drafter_without_confidence_head_is_refused(tmp_path):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target, config_overrides={"enable_confidence_head": False},
                                drop=("confidence_head.proj.weight", "confidence_head.proj.bias"))
    res = CliRunner().invoke(main, ["calibrate", str(run), "--target", str(target), "--quiet"])
    assert res.exit_code == 1
    assert "no confidence head to calibrate (enable_confidence_head is false)" in res.output
    assert not list(Path(tmp_path / "run").rglob(STS_FILE))


def test_push_ships_the_sidecar(tmp_path):
    from dsparkhub.hub.files import local_files

    (tmp_path / "config.json").write_text("{}")
    write_sidecar(_sidecar(), tmp_path / STS_FILE)
    assert STS_FILE in local_files(tmp_path)


@pytest.mark.slow
def test_example_drafter_end_to_end(example, tmp_path):
    """calibrate on the example's DSpark drafter: per-position ECE before / after with counts, a sidecar SGLang
    loads, validate clean, and a card with the calibration section."""
    import torch

    torch.set_num_threads(1)
    draft = tmp_path / "draft"
    shutil.copytree(example.dspark_step, draft, ignore=shutil.ignore_patterns("training_state*", "*.pt"))
    res = CliRunner().invoke(main, ["calibrate", str(draft), "--target", str(example.target), "--datasets",
                                    f"heldout={example.prompts}", "--max-prompts", "8", "--max-new-tokens", "48",
                                    "--min-samples", "40", "--min-class", "4", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "ECE before  ECE after" in res.output and "wrote" in res.output
    data = read_sidecar(draft / STS_FILE)
    assert len(data["temperatures"]) == 7 == data["gamma"]  # the example's block size
    rows = data["positions"]
    assert all(r["samples"] > 0 and r["ece_before"] is not None and r["ece_after"] is not None for r in rows)
    assert data["num_samples"] == data["split"]["fit_steps"] > 0
    assert rows[0]["acceptance"] > rows[-1]["acceptance"]  # survival falls with the position
    from dsparkhub.validate import validate

    assert not {"DSH501", "DSH502"} & validate(draft, example.target).codes
    results = tmp_path / "results.json"
    verify = CliRunner().invoke(main, ["verify", str(draft), "--target", str(example.target), "-n", "7",
                                       "--datasets", f"heldout={example.prompts}", "--max-prompts", "1",
                                       "--max-new-tokens", "16", "--out", str(results), "--quiet"])
    assert verify.exit_code == 0, verify.output
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(results), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    text = (draft / "README.md").read_text()
    assert "## Confidence calibration" in text and "--speculative-dspark-confidence-sts-path" in text
    assert (draft / "assets" / "confidence_reliability.png").stat().st_size > 1000
    try:
        _sglang_source()
    except pytest.skip.Exception:
        return
    loaded = _run_sglang(tmp_path, {"sidecar": str(draft / STS_FILE)})["loaded"]
    assert loaded["temperatures"] == data["temperatures"]


def test_the_reference_engine_records_every_verify_step(tmp_path):
    """Raw logits per drafted position, accepted count and verified width; warm-up not recorded; outputs unchanged."""
    import torch

    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target
    from dsparkhub.verify.reference.engine import ReferenceEngine

    torch.set_num_threads(1)
    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    prompts = [[3, 5, 7, 9], [11, 4, 2]]
    for threshold in (None, 1.0):
        engine = ReferenceEngine(target, run, confidence_threshold=threshold)
        plain = engine.run(prompts, num_speculative_tokens=4, max_new_tokens=12)
        recorder = cal.ConfidenceRecorder(4)
        recorder.dataset = "toy"
        stats = engine.run(prompts, num_speculative_tokens=4, max_new_tokens=12, recorder=recorder)
        rec = recorder.records()
        assert stats.outputs == plain.outputs
        assert len(rec) == stats.num_drafts and set(rec.prompt.tolist()) == {0, 1}
        assert rec.accepted.sum() == stats.num_accepted_tokens and rec.verified.sum() == stats.num_draft_tokens
        assert (np.isnan(rec.logits) == ~rec.valid).all()
        if threshold is None:
            assert (rec.verified == 4).all()
        else:  # survival < 1 truncates every draft to one token: positions 2-4 censored, not rejected
            assert (rec.verified == 1).all() and rec.valid[:, 1:].sum() == 0
    no_head = make_deepspec_drafter(tmp_path / "nohead", target, config_overrides={"enable_confidence_head": False},
                                    drop=("confidence_head.proj.weight", "confidence_head.proj.bias"))
    from dsparkhub.errors import VerifyError

    with pytest.raises(VerifyError, match="confidence head"):
        ReferenceEngine(target, no_head).run(prompts, num_speculative_tokens=4, max_new_tokens=4,
                                             recorder=cal.ConfidenceRecorder(4))


def test_card_refuses_a_sidecar_fitted_on_other_weights_and_names_a_foreign_one(tmp_path):
    from dsparkhub.calibrate import card_context
    from dsparkhub.errors import ResultsError

    (tmp_path / "config.json").write_text("{}")
    assert card_context(tmp_path) is None
    data = {**_sidecar(), "provenance": {"drafter_fingerprint": "0" * 64}}
    write_sidecar(data, tmp_path / STS_FILE)
    with pytest.raises(ResultsError, match="fitted on drafter fingerprint 0000"):
        card_context(tmp_path)
    write_sidecar({"temperatures": [1.2, 0.9]}, tmp_path / STS_FILE, overwrite=True)  # SGLang's own fitter's file
    assert card_context(tmp_path) == {"foreign": True, "file": STS_FILE, "temperatures": [1.2, 0.9]}


def test_an_existing_sidecar_and_a_bad_device_stop_before_any_model_loads(tmp_path, monkeypatch):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    import dsparkhub.verify.reference.engine as reference

    monkeypatch.setattr(reference, "ReferenceEngine", lambda *a, **k: pytest.fail("a model was loaded"))
    bad = CliRunner().invoke(main, ["calibrate", str(run), "--target", str(target), "--device", "nonsense"])
    assert bad.exit_code == 2 and "not a torch device" in bad.output
    (run / "step_100" / STS_FILE).write_text('{"temperatures": [1.0]}')
    res = CliRunner().invoke(main, ["calibrate", str(run), "--target", str(target), "--quiet"])
    assert res.exit_code == 1 and "already exists" in res.output and "--overwrite" in res.output
