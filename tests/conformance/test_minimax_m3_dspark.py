"""vLLM 0.34's MiniMax-M3 DSpark drafter (``DSparkMiniMaxDraftModel``, registry.py:707-710 ->
``vllm/models/minimax_m3/common/dspark.py`` ``MiniMaxM3DSparkForCausalLM``), the standalone checkpoint a MiniMax-M3
target ships in its ``dspark/`` subfolder. Fixtures ``minimax-m3-dspark`` (made by 0.34's own class) and
``minimax-m3-target`` (a transformers 5.22 ``MiniMaxM3VLConfig`` skeleton):
tests/conformance/generators/make_minimax_m3_dspark_fixture.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.recipes import get_recipe
from dsparkhub.layouts.writing import write_config
from dsparkhub.validate import validate
from dsparkhub.verify.vllm.contract import contract_for

from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "language_model.model.dspark."


def _edit(folder: Path, config: dict | None = None, drop: tuple[str, ...] = (), put: dict | None = None) -> Path:
    """Change a fixture copy in place: config keys (None deletes), tensors dropped / replaced."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((folder / "config.json").read_text())
    for k, v in (config or {}).items():
        cfg.pop(k, None) if v is None else cfg.__setitem__(k, v)
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {n: t for n, t in load_file(str(folder / "model.safetensors")).items() if n not in drop}
    save_file({**tensors, **(put or {})}, str(folder / "model.safetensors"))
    return folder


def _reduced_vocab_without_lm_head(folder: Path) -> Path:
    """Draft vocab 64 of 128 with its d2t and a 64-row markov_w2, but no lm_head (0.34 no longer refuses this)."""
    import torch

    w2 = PREFIX + "markov_head.markov_w2.weight"
    from safetensors.torch import load_file
    rows = load_file(str(folder / "model.safetensors"))[w2][:64].clone()
    return _edit(folder, {"draft_vocab_size": 64}, put={w2: rows, PREFIX + "d2t": torch.zeros(64, dtype=torch.int64)})


def _codes(report) -> list[str]:
    return sorted(f.code for f in report.errors)


def test_read_as_minimax_m3_dspark_with_canonical_names(fixture_copy):
    d = open_draft(fixture_copy("minimax-m3-dspark"))
    spec = d.spec
    assert (spec.layout, spec.family, spec.variant, spec.architecture) == (
        "minimax-m3-dspark", "minimax-m3", "dspark", "DSparkMiniMaxDraftModel")
    assert (spec.block_size, spec.target_layer_ids, spec.markov_rank, spec.mask_token_id) == (4, [0, 2], 4, 127)
    assert spec.confidence_head and spec.confidence_head_with_markov and spec.causal == [False, False]
    assert spec.extras["dspark_ffn_hidden_size"] == 48 and spec.extras["dspark_use_dense_ffn"] is True
    assert spec.source_names["layers.1.self_attn.q_proj.weight"] == PREFIX + "layers.1.decoder_layer.self_attn.q_proj.weight"
    assert spec.source_names["norm.weight"] == PREFIX + "final_norm.weight"
    assert list(spec.tensors["layers.0.mlp.gate_proj.weight"].shape) == [48, 32]


def test_validates_against_its_minimax_m3_target(fixture_copy):
    report = validate(fixture_copy("minimax-m3-dspark"), FIXTURES / "minimax-m3-target")
    assert report.ok, [f"{f.code} {f.message}" for f in report.errors]


def test_a_qwen3_target_is_another_family(fixture_copy, toy_target):
    report = validate(fixture_copy("minimax-m3-dspark"), toy_target)
    assert "DSH311" in _codes(report)


@pytest.mark.parametrize("change, code, fragment", [
    ({"dspark_use_dense_ffn": False}, "DSH116", "dense FFN drafts only"),
    ({"dspark_use_dense_ffn": None}, "DSH116", "dense FFN drafts only"),
    ({"dspark_ffn_hidden_size": None}, "DSH116", "dspark_ffn_hidden_size"),
])
def test_configs_the_034_class_cannot_build_are_refused(fixture_copy, change, code, fragment):
    report = validate(_edit(fixture_copy("minimax-m3-dspark"), change), FIXTURES / "minimax-m3-target")
    hits = [f for f in report.errors if f.code == code]
    assert hits and fragment in hits[0].message, [f"{f.code} {f.message}" for f in report.errors]


def test_reduced_vocab_without_lm_head_is_refused(fixture_copy):
    report = validate(_reduced_vocab_without_lm_head(fixture_copy("minimax-m3-dspark")), FIXTURES / "minimax-m3-target")
    assert any("lm_head.weight" in f"{f.message} {f.location}" for f in report.errors), [f"{f.code} {f.message}" for f in report.errors]


def test_declared_confidence_head_without_tensors_is_refused(fixture_copy):
    folder = _edit(fixture_copy("minimax-m3-dspark"),
                   drop=(PREFIX + "confidence_head.proj.weight", PREFIX + "confidence_head.proj.bias"))
    report = validate(folder, FIXTURES / "minimax-m3-target")
    assert any("confidence_head.proj.weight" in f"{f.message} {f.location}" for f in report.errors), \
        [f"{f.code} {f.message}" for f in report.errors]


def test_written_back_as_itself_with_its_checkpoint_names(fixture_copy, tmp_path):
    from safetensors import safe_open

    from dsparkhub.convert import convert

    src = fixture_copy("minimax-m3-dspark")
    cfg = write_config(open_draft(src).spec, get_recipe("minimax-m3-dspark"))
    assert cfg["architectures"] == ["DSparkMiniMaxDraftModel"]
    assert (cfg["dspark_block_size"], cfg["dspark_markov_rank"], cfg["dspark_target_layer_ids"]) == (4, 4, [0, 2])
    assert cfg["dspark_use_dense_ffn"] is True and cfg["dspark_ffn_hidden_size"] == 48
    out = tmp_path / "converted"
    convert(src, out, FIXTURES / "minimax-m3-target")  # --to vllm: the layout vLLM 0.34 serves this family in
    with safe_open(str(src / "model.safetensors"), "pt") as a, safe_open(str(out / "model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DSparkMiniMaxDraftModel"]


def test_contract_lists_minimax_for_034_only(fixture_copy, tmp_path):
    from dsparkhub.errors import EngineUnavailableError
    from dsparkhub.verify.vllm.checks import check_with_vllm

    def classes(version):
        return contract_for(version).value("drafter_classes")["dspark"]
    assert classes("0.34")["DSparkMiniMaxDraftModel"] == ["vllm.models.minimax_m3.common.dspark",
                                                          "MiniMaxM3DSparkForCausalLM"]
    assert "DSparkMiniMaxDraftModel" not in classes("0.32") and "DSparkMiniMaxDraftModel" not in classes("0.33")
    with pytest.raises(EngineUnavailableError, match=r"DSparkMiniMaxDraftModel.*vLLM 0\.32.*served by vLLM 0\.34"):
        check_with_vllm(fixture_copy("minimax-m3-dspark"), tmp_path, vllm_version="0.32")


# ----------------------------------------------------------------------------------------------- vLLM 0.34 itself

@pytest.mark.vllm034
@pytest.mark.slow
def test_034_config_and_load_weights_pass_on_the_fixture(fixture_copy):
    """vLLM 0.34's SpeculativeConfig resolves the drafter (minimax_m3_dspark) against the MiniMax-M3 target skeleton
    and MiniMaxM3DSparkForCausalLM's own load_weights sets every parameter bit-exact (embedding / LM head borrowed:
    full vocab); the engine stage meets 0.34's x86 Triton refusal."""
    from conftest import vllm034_check

    code, report = vllm034_check(fixture_copy("minimax-m3-dspark"), FIXTURES / "minimax-m3-target")
    stages = {s["name"]: s for s in report["stages"]}
    assert code == 0 and report["ok"], json.dumps(report, indent=1)
    assert stages["config"]["details"]["architectures"] == ["DSparkMiniMaxDraftModel"]
    assert stages["config"]["details"]["draft_model_type"] == "minimax_m3_dspark"
    load = stages["load_weights"]["details"]
    assert load["class"] == "MiniMaxM3DSparkForCausalLM" and load["missing"] == [] and load["mismatched"] == []
    assert load["compared_bit_exact"] == load["checkpoint_tensors"]
    assert sorted(load["borrowed_from_target"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert stages["engine"]["details"]["reason"] == "x86_cpu_triton"
    assert "processors.minimax_m3" in report["stand_in"]


@pytest.mark.vllm034
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["reduced_vocab_without_lm_head", "confidence_head_without_tensors"])
def test_034_load_weights_fails_the_variants_its_loader_lets_through(fixture_copy, variant):
    from conftest import vllm034_check

    folder = fixture_copy("minimax-m3-dspark")
    if variant == "reduced_vocab_without_lm_head":
        _reduced_vocab_without_lm_head(folder)
        expected = "lm_head.weight (not borrowed"
    else:
        _edit(folder, drop=(PREFIX + "confidence_head.proj.weight", PREFIX + "confidence_head.proj.bias"))
        expected = "confidence_head.* (enable_confidence_head is true"
    code, report = vllm034_check(folder, FIXTURES / "minimax-m3-target")
    load = next(s for s in report["stages"] if s["name"] == "load_weights")
    assert code == 1 and load["status"] == "failed", json.dumps(report, indent=1)
    assert any(m.startswith(expected) and "0.34" in m for m in load["details"]["missing"]), load["details"]["missing"]


@pytest.mark.vllm034
@pytest.mark.slow
def test_034_finds_the_dspark_subfolder_of_a_minimax_m3_target(fixture_copy, tmp_path):
    """`convert --attach T --attach-as dspark-subfolder` of the MiniMax drafter into the MiniMax-M3 target skeleton;
    vLLM 0.34's DSparkSpeculatorConfig.default_model (v1/worker/gpu/spec_decode/dspark/config.py:41-45 ->
    config/speculative.py:137-155), given the target's config as transformers 5.22 parses it, returns OUT/dspark,
    which holds the drafter in the layout 0.34 loads."""
    from dsparkhub.attach_subfolder import SUBFOLDER, attach_subfolder

    python = ROOT / ".venv-vllm034" / "bin" / "python"
    if not python.exists():
        pytest.skip(".venv-vllm034 is missing: build it with `bash scripts/setup_vllm034.sh`")
    out = tmp_path / "attached"
    attach_subfolder(fixture_copy("minimax-m3-dspark"), FIXTURES / "minimax-m3-target", out)
    code = ("import json, sys\nfrom types import SimpleNamespace as N\nfrom transformers import AutoConfig\n"
            "from vllm.v1.worker.gpu.spec_decode.dspark.config import DSparkSpeculatorConfig as C\n"
            "hf = AutoConfig.from_pretrained(sys.argv[1])\n"
            "t = N(model=sys.argv[1], revision=None, hf_config=hf)\n"
            "print(json.dumps([hf.model_type, C.default_model(N(target_model_config=t, draft_load_config=None))]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("VLLM_TARGET_DEVICE", None)
    proc = subprocess.run([str(python), "-c", code, str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_type, found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert model_type == "minimax_m3_vl" and Path(found) == out / SUBFOLDER
    assert json.loads((Path(found) / "config.json").read_text())["architectures"] == ["DSparkMiniMaxDraftModel"]
    assert open_draft(found).spec.layout == "minimax-m3-dspark"


def test_stand_in_placeholders_reach_child_interpreters(tmp_path):
    """vllm-check's 0.34 stand-in (contract cpu_stand_in.import_stubs): where the needed package is absent, the module
    imports as placeholders here and in a child interpreter (vLLM's registry inspects a class in a subprocess)."""
    import sys

    code = ("import json, os, subprocess, sys\n"
            "from dsparkhub.verify.vllm.stand_in import _stub_imports\n"
            "made = _stub_imports({'needs': 'dsparkhub_absent_pkg', 'modules': {'json.dsparkhub_stub': ['Proc']}})\n"
            "kept = _stub_imports({'needs': 'json', 'modules': {'json.dsparkhub_other': ['X']}})\n"
            "from json.dsparkhub_stub import Proc\n"
            "child = subprocess.run([sys.executable, '-c', 'from json.dsparkhub_stub import Proc; print(Proc.__name__)'],"
            " capture_output=True, text=True)\n"
            "try:\n    Proc()\n    refused = False\nexcept RuntimeError:\n    refused = True\n"
            "print(json.dumps([made, kept, child.stdout.strip(), refused]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [["json.dsparkhub_stub"], [], "Proc", True]
