"""TorchSpec's EAGLE-3 export, as TorchSpec's own code writes it (deepinfra/TorchSpec 30189db:
``LlamaForCausalLMEagle3`` then ``tools/convert_to_hf.py``'s writers; ``generators/make_torchspec_eagle3_fixtures.py``
re-makes both fixtures): detected as ``torchspec-eagle3``, validated against the toy target, converted to the
speculators EAGLE-3 layout vLLM 0.32 / 0.34 and SGLang 0.5.23 load. The ``--prune-vocab`` export carries
convert_to_hf.py:313's ``lm_head[d2t]`` defect, checked here in the fixture's bytes, and is refused (DSH208).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from dsparkhub.convert import convert
from dsparkhub.errors import DsparkhubError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate import validate

from .conftest import FIXTURES

PLAIN = FIXTURES / "torchspec-eagle3"
PRUNED = FIXTURES / "torchspec-eagle3-pruned"
VERIFIER = "toy/toy-qwen3-target"


def _tensors(folder) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, toy_target):
    out = tmp_path_factory.mktemp("torchspec-eagle3") / "eagle3"
    convert(PLAIN, out, toy_target, to="speculators-eagle3", base_model=VERIFIER)
    return out


def test_fixtures_are_torchspec_made_and_small():
    for folder in (PLAIN, PRUNED):
        up = json.loads((folder / "UPSTREAM.json").read_text())
        assert (up["repository"], up["commit"]) == ("deepinfra/TorchSpec", "30189db21e1b58f08bac4c6e7397f0344c2d6dd6")
        assert sum(p.stat().st_size for p in folder.iterdir()) < 100_000
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["_torchspec_version"] == "0.1.0"


def test_the_pruned_export_holds_lm_head_rows_picked_by_the_d2t_offsets():
    """Upstream as it is: convert_to_hf.py:313 `lm_head[d2t]` with d2t offsets (preprocessing.py:482), not the rows
    k + d2t[k] the offsets name. Both fixtures are the same trained weights."""
    full, pruned = _tensors(PLAIN), _tensors(PRUNED)
    d2t = pruned["d2t"]
    assert d2t.dtype == torch.int64 and pruned["t2d"].dtype == torch.bool
    assert pruned["t2d"].nonzero().flatten().tolist() == (torch.arange(64) + d2t).tolist()
    assert pruned["lm_head.weight"].equal(full["lm_head.weight"][d2t])
    assert not pruned["lm_head.weight"].equal(full["lm_head.weight"][torch.arange(64) + d2t])


@pytest.mark.parametrize("folder", [PLAIN, PRUNED], ids=["plain", "pruned"])
def test_detected_as_torchspec_eagle3(folder):
    d = open_draft(folder)
    s = d.spec
    assert d.recipe.name == "torchspec-eagle3"
    assert (s.variant, s.family, s.block_layout, s.block_size) == ("eagle3", "qwen3", "anchor_first", 7)
    assert any("block size 7 assumed" in n for n in s.notes)
    assert s.target_layer_ids == [0, 1, 2]  # eagle_config.eagle_aux_hidden_state_layer_ids, layer indices
    assert (s.vocab_size, s.draft_vocab_size) == (128, 128 if folder == PLAIN else 64)
    # llama3_eagle.py:2400-2402: the residual is taken before hidden_norm; vLLM's speculators reader defaults true
    assert (s.extras["norm_before_residual"], s.extras["norm_output"]) == (False, False)


def test_the_plain_export_validates_and_converts_bit_identically(converted, toy_target):
    assert validate(PLAIN, toy_target).findings == []
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert (cfg["norm_before_residual"], cfg["norm_output"]) == (False, False)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # speculators' hidden-state numbering
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    src, out = _tensors(PLAIN), _tensors(converted)
    assert set(src) - set(out) == {"embed_tokens.weight"}  # byte-identical to the target's: shared
    for k, v in out.items():
        assert v.dtype == src[k].dtype and v.contiguous().view(torch.uint8).equal(src[k].contiguous().view(torch.uint8))
    assert validate(converted, toy_target).errors == []


def test_the_pruned_export_is_refused_naming_the_upstream_defect(toy_target, tmp_path):
    report = validate(PRUNED, toy_target)
    assert [f.code for f in report.errors] == ["DSH208"]
    f = report.errors[0]
    assert "convert_to_hf.py:313" in f.message and f.location == "tensor lm_head.weight"
    with pytest.raises(DsparkhubError, match="DSH208"):
        convert(PRUNED, tmp_path / "out", toy_target, to="speculators-eagle3", base_model=VERIFIER)
    assert not (tmp_path / "out").exists()


def test_a_correctly_trimmed_head_passes(fixture_copy, toy_target):
    """The rule reads the bytes, not the producer: the same export with rows k + d2t[k] is clean."""
    from safetensors.torch import save_file

    folder = fixture_copy("torchspec-eagle3-pruned")
    t = _tensors(folder)
    t["lm_head.weight"] = _tensors(PLAIN)["lm_head.weight"][torch.arange(64) + t["d2t"]].contiguous()
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert validate(folder, toy_target).errors == []


@pytest.mark.slow
@pytest.mark.vllm
def test_converted_torchspec_eagle3_passes_vllm_check(converted, toy_target):
    from conftest import vllm_check

    report = vllm_check(converted, toy_target)
    assert report.ok, report.to_dict()


@pytest.mark.slow
@pytest.mark.vllm034
def test_converted_torchspec_eagle3_passes_vllm034_config_and_load_weights(converted, toy_target):
    """vLLM 0.34.0 from .venv-vllm034 (its CPU platform refuses the engine stage without triton-cpu)."""
    from conftest import vllm034_check

    _, report = vllm034_check(converted, toy_target)
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert report["vllm_version"] == "0.34.0" and report["method"] == "eagle3"
    assert (stages["config"], stages["load_weights"]) == ("passed", "passed"), report


def test_sglang_check_picks_eagle3_for_both_eagle3_layouts():
    from dsparkhub.verify.sglang.checks import sglang_algorithm

    assert sglang_algorithm(json.loads((PLAIN / "config.json").read_text())) == "EAGLE3"
    assert sglang_algorithm({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}) == "EAGLE3"
    assert sglang_algorithm({"architectures": ["DFlashDraftModel"]}) == "DFLASH"


@pytest.mark.slow
@pytest.mark.sglang
def test_torchspec_eagle3_export_passes_sglang_check(toy_target):
    """SGLang 0.5.23 loads the EAGLE-3 HF layout TorchSpec writes (LlamaForCausalLMEagle3, llama_eagle3.py:387);
    its ModelRegistry has no Eagle3Speculator, so the speculators-eagle3 output is vLLM's layout, not SGLang's."""
    from dsparkhub.verify.sglang.checks import check_with_sglang, find_sglang_python

    if find_sglang_python() is None:
        pytest.skip(".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`")
    report = check_with_sglang(PLAIN, toy_target)
    stages = {s.name: s.status for s in report.stages}
    assert report.algorithm == "EAGLE3" and report.ok, report.to_dict()
    assert (stages["config"], stages["load_weights"]) == ("passed", "passed"), report.to_dict()
    assert report.stages[1].details["compared_bit_exact"] == 13
