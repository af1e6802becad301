"""vLLM 0.34's Ricursive DFlash2 drafter (``DFlash2RicursiveDraftModel``, registry.py:690-693 ->
``ricursive_dflash2.py``): DFlash2 plus a top-level ``no_rope_layers`` list, no new tensors. The fixture is the
upstream-made ``dflash-dflash2`` one with the 0.34 architecture and key added (the class adds no tensors, and
building it from vLLM 0.34 costs a 0.34 import on every generator run)."""

from __future__ import annotations

import json

import pytest

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.recipes import get_recipe
from dsparkhub.layouts.writing import write_config
from dsparkhub.verify.vllm.contract import contract_for


def _ricursive(fixture_copy, no_rope_layers):
    folder = fixture_copy("dflash-dflash2")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["DFlash2RicursiveDraftModel"]
    cfg["no_rope_layers"] = no_rope_layers
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_ricursive_is_read_as_dflash2_with_its_nope_layers(fixture_copy):
    spec = open_draft(_ricursive(fixture_copy, [0])).spec
    assert (spec.layout, spec.variant, spec.architecture) == ("zlab-dflash", "dflash2", "DFlash2RicursiveDraftModel")
    assert spec.extras["no_rope_layers"] == [0]
    assert "no_rope_layers" not in spec.decoder_config


@pytest.mark.parametrize("bad", [[1], [-1], ["0"], [0, 0], 0])
def test_no_rope_layers_out_of_range_or_not_ints_is_refused(fixture_copy, bad):
    with pytest.raises(LayoutError, match=r"`no_rope_layers`.*\[0, 1\)"):
        open_draft(_ricursive(fixture_copy, bad))


def test_ricursive_is_never_written_back_as_plain_dflash2(fixture_copy):
    spec = open_draft(_ricursive(fixture_copy, [0])).spec
    cfg = write_config(spec, get_recipe("zlab-dflash"))
    assert cfg["architectures"] == ["DFlash2RicursiveDraftModel"] and cfg["no_rope_layers"] == [0]
    with pytest.raises(LayoutError, match="no_rope_layers"):
        write_config(spec, get_recipe("speculators"))


def test_plain_dflash2_still_written_as_dflash2(fixture_copy):
    spec = open_draft(fixture_copy("dflash-dflash2")).spec
    cfg = write_config(spec, get_recipe("zlab-dflash"))
    assert cfg["architectures"] == ["DFlash2DraftModel"] and "no_rope_layers" not in cfg


def test_contract_lists_ricursive_for_034_only():
    def classes(version):
        return contract_for(version).value("drafter_classes")["dflash"]
    assert classes("0.34")["DFlash2RicursiveDraftModel"] == ["ricursive_dflash2", "RicursiveDFlash2ForCausalLM"]
    assert "DFlash2RicursiveDraftModel" not in classes("0.32") and "DFlash2RicursiveDraftModel" not in classes("0.33")


def test_vllm_check_for_032_names_the_versions_with_the_class(fixture_copy, tmp_path):
    from dsparkhub.errors import EngineUnavailableError
    from dsparkhub.verify.vllm.checks import check_with_vllm
    folder = _ricursive(fixture_copy, [0])
    with pytest.raises(EngineUnavailableError, match=r"DFlash2RicursiveDraftModel.*vLLM 0\.32.*served by vLLM 0\.34"):
        check_with_vllm(folder, tmp_path, vllm_version="0.32")


def test_reference_engine_refuses_nope_layers(fixture_copy):
    from dsparkhub.verify.reference.loading import drafter_config_from_spec
    with pytest.raises(LayoutError, match="no_rope_layers=\\[0\\].*RoPE in every layer"):
        drafter_config_from_spec(open_draft(_ricursive(fixture_copy, [0])).spec)


@pytest.mark.vllm034
@pytest.mark.slow
def test_converted_ricursive_passes_034_config_and_load_weights(fixture_copy, toy_target, tmp_path):
    """`convert --to vllm` keeps the class and its NoPE layers; vLLM 0.34's own SpeculativeConfig and
    RicursiveDFlash2ForCausalLM.load_weights accept the result (engine stage: 0.34's x86 Triton refusal)."""
    from conftest import vllm034_check

    from dsparkhub.convert import convert

    out = tmp_path / "converted"
    convert(_ricursive(fixture_copy, [0]), out, toy_target)
    assert json.loads((out / "config.json").read_text())["no_rope_layers"] == [0]
    code, report = vllm034_check(out, toy_target)
    stages = {s["name"]: s for s in report["stages"]}
    assert code == 0 and report["ok"], json.dumps(report, indent=1)
    assert stages["config"]["details"]["architectures"] == ["DFlash2RicursiveDraftModel"]
    assert stages["load_weights"]["details"]["class"] == "RicursiveDFlash2ForCausalLM"
    assert stages["load_weights"]["details"]["missing"] == []
    assert stages["engine"]["details"]["reason"] == "x86_cpu_triton"
