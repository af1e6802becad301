"""What dsparkhub says about, and writes from, checkpoints made by the real upstream trainers (issue 12 items
1, 2, 3, 9, 10, 12). The fixtures were written by speculators 0.9.0 / dflash 0.1.0 (see fixtures/MANIFEST.json);
these tests need no upstream package (test_upstream_loaders.py loads the outputs with the upstream code)."""

from __future__ import annotations

import json

import pytest

from dsparkhub.convert import convert
from dsparkhub.convert.plan import plan_conversion
from dsparkhub.errors import ConversionRefusedError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate import validate

from .conftest import FIXTURES


def _config(folder):
    return json.loads((folder / "config.json").read_text())


#: fixtures of a Kimi K3 drafter (MLA attention, K3 layer ids): they validate against the Kimi K3 manifest and a K3
#: skeleton in test_torchspec_k3_conformance.py, never against the toy Qwen3 target (DSH311 there is right)
K3_FIXTURES = ("torchspec-k3-dspark", "torchspec-k3-dspark-pruned")

#: vLLM 0.34's MiniMax-M3 DSpark and its MiniMax-M3 target skeleton: validated against each other in
#: test_minimax_m3_dspark.py (against the toy Qwen3 target DSH311 is right, and a target is no drafter)
MINIMAX_FIXTURES = ("minimax-m3-dspark", "minimax-m3-target")


#: fixtures that keep an upstream export defect on purpose; test_torchspec_eagle3_conformance.py checks the refusal
DEFECTIVE_FIXTURES = ("torchspec-eagle3-pruned",)  # convert_to_hf.py:313 lm_head[d2t]: DSH208


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()
                                        if p.is_dir() and p.name not in K3_FIXTURES + MINIMAX_FIXTURES + DEFECTIVE_FIXTURES))
def test_every_upstream_fixture_validates_clean(name, toy_target):
    """Items 9 / 10: speculators' default EAGLE-3 (input_norm) and dflash's DFlash2 (conv, selector) are no DSH202."""
    report = validate(FIXTURES / name, toy_target)
    assert report.errors == [], [(f.code, f.message) for f in report.errors]


def test_eagle3_input_norm_needs_norm_before_fc(fixture_copy, toy_target):
    """input_norm.weight is expected exactly when norm_before_fc (vLLM 0.32 llama_eagle3.py:223, 464)."""
    src = fixture_copy("speculators-eagle3")
    cfg = _config(src)
    cfg["norm_before_fc"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    report = validate(src, toy_target)
    assert [(f.code, f.location) for f in report.errors] == [("DSH202", "tensor input_norm.weight")]


def test_dflash2_codebooks_get_vllm_names_and_shapes(fixture_copy, toy_target):
    """dflash saves nn.Embedding codebooks as `.weight`; vLLM 0.32 qwen3_dflash2.py:326 registers bare Parameters."""
    d = open_draft(FIXTURES / "dflash-dflash2")
    assert d.spec.variant == "dflash2"
    assert "candidate_selector.predecessor_codebook" in d.spec.tensors
    assert d.spec.source_names["candidate_selector.predecessor_codebook"] == \
        "candidate_selector.predecessor_codebook.weight"
    src = fixture_copy("dflash-dflash2")
    cfg = _config(src)
    cfg["dflash_config"]["conv_kernel_size"] = 3  # base_kernel is [2, 2, 32] on disk
    (src / "config.json").write_text(json.dumps(cfg))
    codes = {(f.code, f.location) for f in validate(src, toy_target).errors}
    assert ("DSH203", "tensor layers.0.attention_conv.base_kernel") in codes
    assert ("DSH203", "tensor layers.0.mlp_conv.kernel_projection.weight") in codes


#: the toy target's Hub id for outputs that name their verifier (it has no `_name_or_path` of its own)
HUB_ID = "dsparkhub-test/toy-qwen3-target"


def test_speculators_output_names_the_verifier_from_the_target(tmp_path, toy_target):
    """Item 1: a source without a verifier gets --target's architectures (speculators 0.9.0 VerifierConfig) and its
    Hub id (issue 29 item 2: speculators' load_verifier_weights and vLLM read name_or_path; never a local path): the
    toy target has none, so the conversion is refused naming --base-model, and --base-model is written."""
    with pytest.raises(ConversionRefusedError, match="Hub repo id") as err:
        convert(FIXTURES / "dflash-dflash", tmp_path / "s", toy_target, to="speculators")
    assert "--base-model" in err.value.hint and not (tmp_path / "s").exists()
    out = convert(FIXTURES / "dflash-dflash", tmp_path / "s", toy_target, to="speculators", base_model=HUB_ID).out
    verifier = _config(out)["speculators_config"]["verifier"]
    assert verifier["architectures"] == ["Qwen3ForCausalLM"]
    assert verifier["name_or_path"] == HUB_ID


def test_speculators_output_without_any_verifier_is_refused(tmp_path):
    with pytest.raises(ConversionRefusedError, match="verifier"):
        plan_conversion(FIXTURES / "dflash-dflash", None, to="speculators")


def test_zlab_output_carries_num_target_layers(tmp_path, toy_target):
    """Item 3: dflash 0.1.0 DFlashDraftModel.__init__ reads config.num_target_layers (dflash/model.py)."""
    out = convert(FIXTURES / "speculators-dflash", tmp_path / "z", toy_target, to="zlab-dflash").out
    assert _config(out)["num_target_layers"] == 4


def test_zlab_output_without_a_layer_count_is_refused():
    with pytest.raises(ConversionRefusedError, match="num_target_layers"):
        plan_conversion(FIXTURES / "speculators-dflash", None, to="zlab-dflash")


@pytest.mark.parametrize("name, to", [("speculators-dspark-noncausal", "vllm"),
                                      ("speculators-dflash2", "zlab-dflash")])
def test_bidirectional_sliding_layers_stay_bidirectional(tmp_path, toy_target, name, to):
    """Item 2: speculators' sliding_window_non_causal=true (DFlash2's default) becomes is_causal=false, which
    vLLM 0.32 qwen3_dflash.py:86 _dflash_layer_causal and dflash's Qwen3DFlashAttention read first."""
    out = convert(FIXTURES / name, tmp_path / "o", toy_target, to=to).out
    cfg = _config(out)
    assert cfg["layer_types"] == ["sliding_attention"] and cfg["is_causal"] is False
    back = convert(out, tmp_path / "back", toy_target, to="speculators", base_model=HUB_ID).out
    assert _config(back)["sliding_window_non_causal"] is True


def test_causal_sliding_layers_stay_causal(tmp_path, toy_target):
    out = convert(FIXTURES / "speculators-dflash", tmp_path / "z", toy_target, to="zlab-dflash").out
    cfg = _config(out)
    assert cfg["layer_types"] == ["sliding_attention"] and cfg.get("is_causal", True) is True
    back = convert(out, tmp_path / "back", toy_target, to="speculators", base_model=HUB_ID).out
    assert _config(back)["sliding_window_non_causal"] is False


def test_causality_speculators_cannot_express_is_refused(fixture_copy, toy_target):
    """speculators runs full-attention layers bidirectionally always (speculators models/dflash/attention.py:43)."""
    src = fixture_copy("dflash-dflash")
    cfg = _config(src)
    cfg["is_causal"] = True  # a full-attention layer run causally
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionRefusedError, match="causal"):
        plan_conversion(src, toy_target, to="speculators")


@pytest.mark.parametrize("name, arch", [("speculators-dflash", "DFlashDraftModel"),
                                        ("dflash-dflash2", "DFlash2DraftModel")])
def test_default_output_of_a_dflash_drafter_is_what_vllm_loads(tmp_path, toy_target, name, arch):
    """Item 12: `convert` (default --to vllm) of a DFlash drafter writes the z-lab layout vLLM 0.32 registers
    (registry.py: DFlashDraftModel -> qwen3_dflash, DFlash2DraftModel -> qwen3_dflash2)."""
    res = convert(FIXTURES / name, tmp_path / "o", toy_target)
    assert res.plan.recipe.name == "zlab-dflash"
    assert _config(res.out)["architectures"] == [arch]


def test_speculators_dspark_with_bidirectional_sliding_layers_warns_that_vllm_runs_them_causally():
    """vLLM 0.32 speculators/algos.py update_dspark sets no dflash_config.causal (update_dflash does), so
    qwen3_dflash.py:86 follows layer_types: the conformance suite sees vLLM build these layers causal."""
    report = validate(FIXTURES / "speculators-dspark-noncausal")
    assert [f.location.rsplit(" ", 1)[-1] for f in report.findings if f.code == "DSH114"] == \
        ["sliding_window_non_causal"]
    assert "DSH114" not in validate(FIXTURES / "speculators-dflash").codes
