"""SGLang 0.5.23 as the second engine: the converted output both engines read, the legacy `DSparkDraftModel`
architecture (DSH115), and SGLang's own checks (`dsparkhub sglang-check`) run from `.venv-sglang`.

The real-SGLang tests need `.venv-sglang` (built by `bash scripts/setup_sglang.sh`, which `scripts/setup.sh --test`
calls). Locally they skip with a reason when it is missing; in CI (`CI=true`) they FAIL instead, so a broken SGLang
install cannot pass unnoticed. Each SGLang child costs ~30 s on 2 cores (importing SGLang).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dsparkhub.errors import EngineUnavailableError
from dsparkhub.verify.sglang.checks import check_with_sglang, find_sglang_python, sglang_algorithm


def _sglang_python() -> Path:
    python = find_sglang_python()
    if python is None:
        reason = ".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the SGLang checks, but {reason}")
        pytest.skip(reason)
    return python


# ------------------------------------------------------------------------------------------ item 1: both engines


def test_vllm_output_mirrors_the_dflash_config_keys_sglang_reads(models, tmp_path):
    from dsparkhub.convert import convert

    target, step = models
    out = tmp_path / "out"
    convert(step, out, target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    # the same values at top level (vLLM block_size) and under dflash_config (SGLang reads it first)
    assert cfg["dflash_config"] == {"block_size": cfg["block_size"], "mask_token_id": cfg["mask_token_id"],
                                    "target_layer_ids": cfg["target_layer_ids"],
                                    "num_target_layers": cfg["num_target_layers"]}
    assert cfg["target_layer_ids"] == [0, 1, 2]
    # keys whose defaults differ between the engines or that SGLang requires are explicit
    for key in ("sample_from_anchor", "markov_head_type", "confidence_head_with_markov", "enable_confidence_head"):
        assert key in cfg, key


def test_vllm_output_converts_back_without_carrying_dflash_config_twice(models, tmp_path):
    from dsparkhub.convert import convert
    from dsparkhub.layouts.reading import open_draft

    target, step = models
    convert(step, tmp_path / "a", target)
    convert(tmp_path / "a", tmp_path / "b", target)
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert a == b
    assert open_draft(tmp_path / "b").recipe.name == "vllm"


# ----------------------------------------------------------------------------- item 5: legacy DSparkDraftModel


@pytest.mark.parametrize("model_type, flagged", [("qwen3_dspark", True), (None, True), ("qwen3", False)])
def test_legacy_dsparkdraftmodel_is_flagged_unless_model_type_is_qwen3(models, tmp_path, model_type, flagged):
    from dsparkhub.testing.factories import make_deepspec_drafter
    from dsparkhub.validate import validate

    target, _ = models
    overrides = {"architectures": ["DSparkDraftModel"], "model_type": model_type}
    run = make_deepspec_drafter(tmp_path / "run", target, config_overrides=overrides)
    if model_type is None:
        cfg_path = run / "step_100" / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("model_type")
        cfg_path.write_text(json.dumps(cfg))
    report = validate(run / "step_100", target)
    assert ("DSH115" in report.codes) is flagged


def test_convert_writes_qwen3dsparkmodel_for_a_legacy_dsparkdraftmodel(models, tmp_path):
    from dsparkhub.convert import convert
    from dsparkhub.testing.factories import make_deepspec_drafter
    from dsparkhub.validate import validate

    target, _ = models
    run = make_deepspec_drafter(tmp_path / "run", target,
                                config_overrides={"architectures": ["DSparkDraftModel"], "model_type": "qwen3_dspark"})
    convert(run / "step_100", tmp_path / "out", target, force=True)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert "DSH115" not in validate(tmp_path / "out", target).codes


# ------------------------------------------------------------------------------ item 2: sglang-check (parent)


@pytest.mark.parametrize("config, algorithm", [
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 8}, "DSPARK"),
    ({"architectures": ["DSparkDraftModel"]}, "DSPARK"),
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {}}, "DFLASH"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 0}, "DSPARK"),
    ({"architectures": ["Qwen3ForCausalLM"], "markov_rank": 0}, "DFLASH"),
])
def test_sglang_algorithm_follows_the_drafter_config(config, algorithm):
    assert sglang_algorithm(config) == algorithm


def test_sglang_check_without_the_venv_names_the_setup_script(models, tmp_path, monkeypatch):
    target, _ = models
    draft = tmp_path / "d"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    monkeypatch.setenv("DSPARKHUB_SGLANG_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(EngineUnavailableError, match="setup_sglang.sh"):
        check_with_sglang(draft, target)


# --------------------------------------------------------------------------------------- real SGLang (slow)


@pytest.mark.slow
@pytest.mark.sglang
def test_example_drafter_converted_once_passes_sglang_check(example, converted_example):
    _sglang_python()
    report = check_with_sglang(converted_example, example.target)
    assert report.sglang_version == "0.5.23"
    assert report.algorithm == "DSPARK"
    assert report.ok, report.to_dict()
    cfg = report.stage("config").details
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert cfg["model_class"] == "sglang.srt.models.dspark.Qwen3DSparkModel"
    assert (cfg["gamma"], cfg["speculative_num_draft_tokens"]) == (7, 8)  # SGLang verifies gamma + 1
    assert cfg["target_layer_ids"] == [0, 1, 2]
    assert cfg["sample_from_anchor"] is True
    lw = report.stage("load_weights").details
    assert lw["missing"] == [] and lw["dropped_silently"] == [] and lw["mismatched"] == []
    assert lw["confidence_head_loaded"] is True
    assert lw["compared_bit_exact"] == lw["checkpoint_tensors"]
    engine = report.stage("engine")
    assert engine.status == "refused" and "CUDA" in engine.message


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_check_reports_a_missing_tensor_sglang_is_silent_about(example, converted_example, tmp_path):
    from safetensors.torch import load_file, save_file

    _sglang_python()
    broken = tmp_path / "broken"
    shutil.copytree(converted_example, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["layers.1.mlp.down_proj.weight"]
    tensors["d2t"] = tensors["norm.weight"].new_zeros(4).long()
    save_file(tensors, str(broken / "model.safetensors"))
    report = check_with_sglang(broken, example.target)
    assert not report.ok
    lw = report.stage("load_weights")
    assert lw.status == "failed"
    assert lw.details["missing"] == ["layers.1.mlp.down_proj.weight"]
    assert lw.details["dropped_silently"] == ["d2t"]


# ------------------------------------------------------------------------------ item 1: dspark/ subfolder attach


def test_attach_as_dspark_subfolder_links_the_target_and_converts_the_drafter(models, tmp_path):
    from dsparkhub.attach_subfolder import attach_subfolder

    target, step = models
    r = attach_subfolder(step, target, tmp_path / "out")
    out = tmp_path / "out"
    assert set(r.linked) == {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
    assert (out / "config.json").read_bytes() == (target / "config.json").read_bytes()  # target config untouched
    assert os.path.samefile(out / "model.safetensors", target / "model.safetensors")  # hard-linked, not rewritten
    cfg = json.loads((out / "dspark" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and "dflash_config" in cfg
    assert "model.safetensors" in r.draft_files


def test_attach_as_dspark_subfolder_refuses_a_target_that_has_one(models, tmp_path):
    from dsparkhub.attach_subfolder import attach_subfolder
    from dsparkhub.errors import ConversionRefusedError

    target, step = models
    attach_subfolder(step, target, tmp_path / "once")
    with pytest.raises(ConversionRefusedError, match="dspark/ subfolder"):
        attach_subfolder(step, tmp_path / "once", tmp_path / "twice")
    assert not (tmp_path / "twice").exists()


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_finds_the_dspark_subfolder_without_a_draft_path(example, tmp_path):
    from dsparkhub.attach_subfolder import attach_subfolder

    _sglang_python()
    attach_subfolder(example.deepspec_run, example.target, tmp_path / "t")
    report = check_with_sglang(None, tmp_path / "t")
    assert report.ok, report.to_dict()
    cfg = report.stage("config").details
    assert cfg["draft_path_given"] is False
    assert Path(cfg["speculative_draft_model_path"]) == (tmp_path / "t" / "dspark").resolve()


# -------------------------------------------------------------------------------------------- item 4: the card


@pytest.mark.parametrize("method, flag, block", [("dspark", "--speculative-dspark-block-size 5", 5),
                                                  ("dflash", "--speculative-dflash-block-size 6", 6)])
def test_sglang_launch_spells_gamma_against_gamma_plus_one(method, flag, block):
    from dsparkhub.card.engines import sglang_launch

    s = sglang_launch(method, 5, target="Qwen/Qwen3-8B", model="me/d", tensor_parallel_size=8, max_model_len=20000)
    assert s["cli"].split(" \\\n  ") == ["python -m sglang.launch_server --model-path Qwen/Qwen3-8B",
                                         f"--speculative-algorithm {method.upper()}",
                                         "--speculative-draft-model-path me/d", flag, "--tp-size 8",
                                         "--context-length 20000"]
    assert (s["block_size"], s["num_draft_tokens"]) == (block, 6)  # SGLang verifies n + 1 tokens either way
    assert sglang_launch("eagle3", 5, target="t", model="m") is None


def test_card_gives_the_sglang_command_and_the_engine_checks(tmp_path):
    from test_card import make_drafter, make_results

    from dsparkhub.card.render import write_card

    draft = make_drafter(tmp_path / "d")
    results = make_results(draft, tmp_path / "r.json")
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps({"vllm_version": "0.32.0", "ok": True, "stages": [
        {"name": "config", "status": "passed"}, {"name": "load_weights", "status": "passed"},
        {"name": "engine", "status": "refused"}]}))
    sglang = tmp_path / "sglang.json"
    sglang.write_text(json.dumps({"sglang_version": "0.5.23", "ok": False, "stages": [
        {"name": "config", "status": "passed"}, {"name": "load_weights", "status": "failed"}]}))
    text = write_card(draft, [results], repo_id="org/d", checks=[vllm, sglang]).readme.read_text()
    assert "## Use with SGLang" in text
    assert "--speculative-algorithm DSPARK" in text and "--speculative-draft-model-path org/d" in text
    assert "γ + 1" in text
    assert ("- **vLLM 0.32.0** (`dsparkhub vllm-check`): passed — config passed, load_weights passed, engine refused"
            in text)
    assert "- **SGLang 0.5.23** (`dsparkhub sglang-check`): FAILED — config passed, load_weights failed" in text


def test_card_refuses_a_check_report_that_is_not_one(tmp_path):
    from test_card import make_drafter, make_results

    from dsparkhub.card.render import write_card
    from dsparkhub.errors import CardError

    draft = make_drafter(tmp_path / "d")
    results = make_results(draft, tmp_path / "r.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stages": []}))
    with pytest.raises(CardError, match="names no engine version"):
        write_card(draft, [results], checks=[bad])
    assert not (draft / "README.md").exists()
