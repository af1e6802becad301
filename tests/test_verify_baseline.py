"""``dsparkhub verify --baseline``: none / a drafter baseline measured by the reference engine on the example,
MTP refusals before anything loads, and the schema /3 baseline identity (``/2`` files read as no speculation)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.verify.baseline import (
    BaselineChoice,
    baseline_n,
    check_baseline,
    parse_baseline,
)
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import SCHEMA, BaselineRef
from dsparkhub.verify.settings import (
    EngineOptionError,
    VerifyArgumentError,
    VerifySettings,
)

DATA = Path(__file__).parent / "data"


def _verify(example, out: Path, *extra: str):
    return CliRunner().invoke(main, ["verify", str(example.dspark_step), "--target", str(example.target), "-n", "3",
                                     "--datasets", f"heldout={example.prompts}", "--max-prompts", "2",
                                     "--max-new-tokens", "12", "--concurrency", "1,2", "--repeats", "1",
                                     "--out", str(out), "--quiet", *extra])


def test_a_drafter_baseline_is_measured_interleaved_lossless_and_named(example, tmp_path):
    """The example's DFlash drafter as baseline of its DSpark drafter (concurrency 1, 2): every speedup is against
    DFlash at n = 7 (the tokens one trained block of it proposes), both lossless, and the table, compare and card say
    so; ``--baseline none`` keeps today's identity."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path / "vs_dflash.json"
    res = _verify(example, out, "--baseline", str(example.dflash))
    assert res.exit_code == 0, res.output
    assert "speedups below are vs DFlash n=7" in res.output and "speedup vs DFlash n=7" in res.output
    assert "baseline DFlash n=7 lossless against the target alone: ok" in res.output
    r = read_results(out)
    assert r.schema == SCHEMA and r.baseline.kind == "drafter" and r.baseline.n == 7
    assert r.baseline.id == example.dflash.resolve().name and r.baseline.fingerprint
    assert r.lossless is True
    bases = r.datasets[0].baselines
    assert [b.concurrency for b in bases] == [1, 2] and all(b.kind == "drafter" and b.lossless for b in bases)
    assert all(run.lossless and run.baseline_tokens_per_s == r.datasets[0].baseline_at(run.concurrency).tokens_per_s
               for run in r.datasets[0].runs)

    plain = tmp_path / "vs_none.json"
    res = _verify(example, plain, "--baseline", "none")
    assert res.exit_code == 0, res.output
    p = read_results(plain)
    assert p.baseline == BaselineRef() and p.speedup_label == "speedup vs no speculation"
    assert all(b.kind == "none" and b.lossless is None for b in p.datasets[0].baselines)

    cmp = CliRunner().invoke(main, ["compare", str(out), str(plain)])
    assert cmp.exit_code == 0, cmp.output
    assert "DFlash n=7" in cmp.output and "no speculation" in cmp.output
    draft = tmp_path / "draft"


    shutil.copytree(example.dspark_step, draft, ignore=shutil.ignore_patterns("training_state*", "*.pt"))
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(out), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    assert "Speedup vs DFlash n=7 and acceptance length" in (draft / "README.md").read_text()


def test_mtp_is_refused_on_the_reference_engine_and_on_a_target_without_mtp_layers(example, tmp_path):
    """The refusals name the rule and its source, before anything loads."""
    from dsparkhub.verify.runner import run_verify

    with pytest.raises(EngineOptionError, match="no MTP implementation"):
        run_verify(example.dspark_step, example.target, VerifySettings(num_speculative_tokens=[3], baseline="mtp:1"))
    with pytest.raises(EngineOptionError, match="num_nextn_predict_layers or mtp_num_hidden_layers"):
        check_baseline(parse_baseline("mtp:2"), backend="vllm", target=example.target, interleaves=False)
    res = CliRunner().invoke(main, ["verify", str(example.dspark_step), "--target", str(example.target),
                                    "--baseline", "mtp:1", "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "no MTP implementation" in res.output and not (tmp_path / "r.json").exists()


def test_an_mtp_target_passes_the_layer_rule(tmp_path):
    """A config with num_nextn_predict_layers (DeepSeek-V3) in text_config passes vLLM's rule on a backend that
    starts the MTP configuration (the installed vLLM's own rules follow in its child: test_verify_mtp)."""
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_nextn_predict_layers": 1}}))
    check_baseline(parse_baseline("mtp:2"), backend="vllm", target=tmp_path, interleaves=False, runs_mtp=True)


def test_parse_baseline(example, tmp_path):
    assert parse_baseline(None) == parse_baseline("none") == BaselineChoice()
    assert parse_baseline("mtp:3") == BaselineChoice(kind="mtp", n=3)
    assert parse_baseline(f"{example.dflash}@5") == BaselineChoice(kind="drafter", path=str(example.dflash), n=5)
    assert baseline_n(parse_baseline(str(example.dflash)), [3]) == 7
    for bad, msg in [("mtp:x", "mtp:N"), (f"{example.dflash}@0", "after @"), (str(tmp_path / "nope"), "not a drafter")]:
        with pytest.raises(VerifyArgumentError, match=msg):
            parse_baseline(bad)
    with pytest.raises(EngineOptionError, match="reference engine"):
        check_baseline(parse_baseline(str(example.dflash)), backend="vllm", target=example.target, interleaves=False)


def test_a_v2_file_reads_as_v3_against_no_speculation():
    r = read_results(DATA / "card" / "results_reference.json")
    assert json.loads((DATA / "card" / "results_reference.json").read_text())["schema"].endswith("/2")
    assert r.schema == SCHEMA and r.baseline.kind == "none" and r.baseline.label == "no speculation"
    assert all(b.kind == "none" for ds in r.datasets for b in ds.baselines)
