"""Every layout the seeds ship: read into a DraftSpec, convert to the vLLM layout and back bit for bit, and the
layout-specific findings (Kimi K3 config rules, DeepSeek-V4 stage counts, hidden-state numbering mistakes)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.convert import convert
from dsparkhub.convert.plan import plan_conversion
from dsparkhub.errors import ConversionRefusedError, LayoutError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.recipes import get_recipe, load_recipes
from dsparkhub.testing import factories as F
from dsparkhub.validate import validate

torch.set_num_threads(1)


@pytest.fixture()
def target(tmp_path):
    return F.make_qwen3_target(tmp_path / "target")


def _tensor_bytes(folder) -> dict[str, tuple[str, tuple, str]]:
    ck = open_checkpoint(folder)
    return {n: (i.dtype, i.shape, ck.tensor_sha256(n)) for n, i in ck.tensors.items()}


def _round_trip(src, tmp_path, via: str, expect_via_layout: str, target=None, base_model=None):
    d = open_draft(src)
    mid, back = tmp_path / "mid", tmp_path / "back"
    # the toy target has no Hub id: a layout that names its verifier (speculators) is written with --base-model
    base_model = base_model or (d.spec.target_ref.get("name_or_path") or "org/tiny-target" if target else None)
    r1 = convert(src, mid, target, to=via, keep_embeddings=True, base_model=base_model)
    assert r1.plan.recipe.name == expect_via_layout
    convert(mid, back, target, to=d.recipe.name, keep_embeddings=True, base_model=base_model)
    assert open_draft(back).recipe.name == d.recipe.name
    before, after = _tensor_bytes(d.checkpoint.path), _tensor_bytes(back)
    assert sorted(before) == sorted(after)
    assert before == after  # names, dtypes, shapes and sha256 of every tensor's bytes
    return d, open_draft(mid), open_draft(back)


CASES = {
    # name: (factory(tmp, target) -> folder, --to for the middle step, recipe expected there)
    "speculators-dspark-reduced-vocab": (
        lambda tmp, t: F.make_speculators_drafter(tmp / "s", t, draft_vocab=64), "vllm", "vllm"),
    "speculators-dspark-one-plus-n": (
        lambda tmp, t: F.make_speculators_drafter(tmp / "s", t, sample_from_anchor=False), "speculators",
        "speculators"),
    "speculators-dflash": (
        lambda tmp, t: F.make_speculators_drafter(tmp / "s", t, variant="dflash", sample_from_anchor=False),
        "zlab-dflash", "zlab-dflash"),
    "speculators-eagle3": (lambda tmp, t: F.make_eagle3_drafter(tmp / "e", t), "vllm", "speculators-eagle3"),
    "zlab-dflash2": (lambda tmp, t: F.make_zlab_dflash2_drafter(tmp / "z", t), "speculators", "speculators"),
    "deepspec-gemma4": (lambda tmp, t: F.make_deepspec_gemma4_drafter(tmp / "g", F.make_gemma4_target(tmp / "gt")),
                        "vllm", "vllm"),
    "k3-dspark": (lambda tmp, t: F.make_k3_dspark_drafter(tmp / "k3"), "vllm", "k3-dspark"),
    "deepseek-v4-detached": (lambda tmp, t: _detached_v4(tmp), "vllm", "deepseek-v4"),
}


NEEDS_TARGET = {"speculators-dflash", "zlab-dflash2", "speculators-dspark-reduced-vocab"}


def _detached_v4(tmp):
    from dsparkhub.attach import detach

    v4 = F.make_v4_target(tmp / "v4", dspark_stages=3)
    detach(v4, tmp / "v4-drafter")
    return tmp / "v4-drafter"


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_to_vllm_and_back_is_bit_identical(case, tmp_path, target):
    make, via, expect = CASES[case]
    # z-lab needs num_target_layers and speculators a verifier, which only the target gives (issue 12 items 1, 3)
    _round_trip(make(tmp_path, target), tmp_path, via, expect, target if case in NEEDS_TARGET else None)


def test_speculators_reader_converts_numbering_and_keeps_reduced_vocab(tmp_path, target):
    src = F.make_speculators_drafter(tmp_path / "s", target, aux_hidden_state_layer_ids=(1, 2, 3), draft_vocab=64,
                                     verifier="org/the-target")
    d, mid, back = _round_trip(src, tmp_path, "vllm", "vllm", target)  # the vllm layout names no verifier
    s = d.spec
    assert (s.layout, s.variant, s.family, s.block_layout) == ("speculators", "dspark", "qwen3", "anchor_first")
    assert s.target_layer_ids == [0, 1, 2]  # hidden-state index - 1
    assert (s.vocab_size, s.draft_vocab_size) == (128, 64)
    assert s.tensors["markov_head.markov_w2.weight"].shape == (64, 8)
    assert s.target_ref["name_or_path"] == "org/the-target"
    vcfg = json.loads((tmp_path / "mid" / "config.json").read_text())
    assert vcfg["target_layer_ids"] == [0, 1, 2] and vcfg["sample_from_anchor"] is True
    assert vcfg["draft_vocab_size"] == 64
    assert "t2d" not in mid.spec.tensors  # vLLM drops it; the speculators writer derives it again
    back_cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back_cfg["aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert back_cfg["sample_from_anchor"] is True
    assert back_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 8
    assert back_cfg["transformer_layer_config"]["hidden_size"] == 32
    t2d = load_file(str(tmp_path / "back" / "model.safetensors"))["t2d"]
    assert t2d.dtype == torch.bool and int(t2d.sum()) == 64


def test_speculators_without_sample_from_anchor_is_read_as_vllm_reads_it(tmp_path, target):
    src = F.make_speculators_drafter(tmp_path / "s", target, sample_from_anchor=None)
    spec = open_draft(src).spec
    assert spec.block_layout == "one_plus_n" and spec.proposals_per_block == 7
    assert any("sample_from_anchor" in n for n in spec.notes)
    assert "DSH113" in validate(src).codes


@pytest.mark.parametrize("value", ["false", 0, None])
def test_sample_from_anchor_must_be_a_json_boolean(tmp_path, target, value):
    """"false" as a string is truthy: read naively it would flip a 1+N drafter to anchor-first without a word."""
    src = F.make_speculators_drafter(tmp_path / "s", target, sample_from_anchor=False)
    cfg = json.loads((src / "config.json").read_text())
    cfg["sample_from_anchor"] = value
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LayoutError, match="'sample_from_anchor' must be true or false"):
        open_draft(src)


def test_dflash2_keeps_sliding_window_layers(tmp_path, target):
    src = F.make_zlab_dflash2_drafter(tmp_path / "z", target, layers=3)
    d = open_draft(src)
    assert d.spec.block_size == 16 and d.spec.block_layout == "one_plus_n"
    convert(src, tmp_path / "out", None, to="zlab-dflash")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    assert cfg["sliding_window"] == 64 and cfg["dflash_config"]["target_layer_ids"] == [0, 2]


def test_gemma4_expected_tensors_have_no_v_proj_and_feedforward_norms(tmp_path):
    g = F.make_gemma4_target(tmp_path / "gt")
    src = F.make_deepspec_gemma4_drafter(tmp_path / "g", g)
    assert validate(src, g).ok
    save = load_file(str(src / "model.safetensors"))
    save["layers.0.self_attn.v_proj.weight"] = torch.zeros(16, 32, dtype=torch.bfloat16)
    del save["layers.1.pre_feedforward_layernorm.weight"]
    save_file(save, str(src / "model.safetensors"))
    codes = {(f.code, f.location) for f in validate(src, g).findings}
    assert ("DSH202", "tensor layers.0.self_attn.v_proj.weight") in codes
    assert ("DSH201", "tensor layers.1.pre_feedforward_layernorm.weight") in codes


def test_k3_reader_renames_context_pieces(tmp_path):
    src = F.make_k3_dspark_drafter(tmp_path / "k3", target_num_hidden_layers=8)
    s = open_draft(src).spec
    assert (s.layout, s.family, s.block_layout) == ("k3-dspark", "k3-mla", "anchor_first")
    assert s.source_names["fc.weight"] == "context_proj.weight"
    assert s.source_names["hidden_norm.weight"] == "context_norm.weight"
    assert s.source_names["norm.weight"] == "final_norm.weight"
    assert s.num_target_layers == 8 and s.target_layer_ids == [1, 3, 5]
    assert validate(src).ok


@pytest.mark.parametrize("override,fragment", [
    ({"mla_use_nope": True}, "mla_use_nope"),
    ({"mla_use_output_gate": True}, "mla_use_output_gate"),
    ({"dspark_bonus_anchor": True}, "dspark_bonus_anchor"),
    ({"q_lora_rank": None}, "q_lora_rank"),
    ({"num_target_layers": 5}, "num_target_layers"),
    ({"draft_vocab_size": 64}, "draft_vocab_size"),
])
def test_k3_config_rules_of_vllm_are_findings(tmp_path, override, fragment):
    src = F.make_k3_dspark_drafter(tmp_path / "k3", config_overrides=override)
    found = [f for f in validate(src).findings if f.code == "DSH109"]
    assert found and any(fragment in f.message or fragment in f.location for f in found)


def test_k3_layout_refuses_a_reduced_draft_vocab(tmp_path):
    src = F.make_k3_dspark_drafter(tmp_path / "k3", config_overrides={"draft_vocab_size": 64})
    tensors = load_file(str(src / "model.safetensors"))
    tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][:64].clone()
    save_file(tensors, str(src / "model.safetensors"))
    assert open_draft(src).spec.draft_vocab_size == 64
    with pytest.raises(ConversionRefusedError, match="reduced draft vocab"):
        plan_conversion(src, None, to="k3-dspark", force=True)


def test_v4_stage_count_comes_from_tensors(tmp_path):
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3, num_nextn_predict_layers=1)
    d = open_draft(v4)
    assert d.recipe.name == "deepseek-v4" and d.spec.num_layers == 3
    assert d.spec.target_layer_ids == [0, 1, 2]  # dspark_target_layer_ids [1, 2, 3] are hidden-state indices
    assert d.spec.source_names["fc.weight"] == "mtp.2.main_proj.weight"
    assert d.spec.source_names["layers.0.attn.wq_a.weight"] == "mtp.0.attn.wq_a.weight"
    assert not any(n.startswith("layers.") and not d.spec.source_names[n].startswith("mtp.") for n in d.spec.tensors)
    report = validate(d)
    assert report.ok and "DSH110" in report.codes
    cfg = json.loads((v4 / "config.json").read_text())
    cfg["n_mtp_layers"] = 2
    (v4 / "config.json").write_text(json.dumps(cfg))
    f = [x for x in validate(v4).findings if x.code == "DSH111"]
    assert f and f[0].expected == "3" and f[0].found == "2"


def test_v41_ids_are_taken_as_is(tmp_path):
    v41 = F.make_v4_target(tmp_path / "v41", dspark_stages=2, model_type="deepseek_v41",
                           dspark_target_layer_ids=(1, 2))
    assert open_draft(v41).spec.target_layer_ids == [1, 2]


def test_v4_stage_missing_a_parameter_and_shared_piece_on_wrong_stage(tmp_path):
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3)
    index = json.loads((v4 / "model.safetensors.index.json").read_text())
    shard = v4 / index["weight_map"]["mtp.1.attn.wkv.weight"]
    tensors = load_file(str(shard))
    del tensors["mtp.1.attn.wkv.weight"]
    del index["weight_map"]["mtp.1.attn.wkv.weight"]
    save_file(tensors, str(shard))
    (v4 / "model.safetensors.index.json").write_text(json.dumps(index))
    f = [x for x in validate(v4).findings if x.code == "DSH112"]
    assert f and "stage 1" in f[0].message and "attn.wkv.weight" in f[0].message
    tensors["mtp.1.main_norm.weight"] = torch.ones(32, dtype=torch.bfloat16)
    index["weight_map"]["mtp.1.main_norm.weight"] = shard.name
    save_file(tensors, str(shard))
    (v4 / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LayoutError, match="last stage 2"):
        open_draft(v4)


def test_hidden_state_index_zero_is_named(tmp_path, target):
    src = F.make_speculators_drafter(tmp_path / "s", target, aux_hidden_state_layer_ids=(0, 1, 2))
    f = [x for x in validate(src, target).findings if x.code == "DSH308"]
    assert f and "[1, 2, 3]" in f[0].hint


def test_ids_shifted_by_one_against_a_manifest_target_are_named(tmp_path):
    from dsparkhub.skeleton import sparse_drafter

    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": 4096,
           "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 1024, "vocab_size": 151936, "block_size": 7, "mask_token_id": 151669,
           "target_layer_ids": [2, 10, 18, 26, 34], "num_target_layers": 36, "markov_rank": 16,
           "markov_head_type": "vanilla", "enable_confidence_head": False, "sample_from_anchor": True}
    src = sparse_drafter(tmp_path / "d", cfg)
    report = validate(src, "qwen3-8b")
    f = [x for x in report.findings if x.code == "DSH309"]
    assert f and f[0].expected == "[1, 9, 17, 25, 33]" and "shifted by +1" in f[0].message
    cfg["target_layer_ids"] = [1, 9, 17, 25, 33]
    src2 = sparse_drafter(tmp_path / "d2", cfg)
    assert "DSH309" not in validate(src2, "qwen3-8b").codes


def test_verifier_naming_another_target_is_a_warning(tmp_path, target):
    src = F.make_speculators_drafter(tmp_path / "s", target, verifier="moonshotai/Kimi-K2.6")
    from dsparkhub.target import target_spec_from_manifest

    t = target_spec_from_manifest("kimi-k3")
    assert "DSH310" in validate(src, t).codes


def test_anchor_first_to_one_plus_n_needs_the_explicit_flag(tmp_path, target):
    run = F.make_deepspec_drafter(tmp_path / "run", target, markov_rank=0, confidence=False)
    with pytest.raises(ConversionRefusedError, match="shift every draft slot") as exc:
        plan_conversion(run, target, to="zlab-dflash")
    assert "--declare-block-layout" in str(exc.value)
    plan = plan_conversion(run, target, to="zlab-dflash", declare_block_layout="one_plus_n")
    result = convert(run, tmp_path / "out", target, plan=plan)
    assert result.provenance["options"]["declare_block_layout"] == "one_plus_n"
    assert open_draft(tmp_path / "out").spec.proposals_per_block == 6
    assert any("proposals per block change from 7" in n for n in plan.draft.spec.notes)
    from click.testing import CliRunner

    from dsparkhub.cli import main

    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(target), "--to", "zlab-dflash",
                                    "--declare-block-layout", "one_plus_n", "--dry-run", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0 and "note: block layout declared one_plus_n" in res.output, res.output


def test_layouts_that_cannot_hold_a_family_refuse_with_the_alternatives(tmp_path, target):
    k3 = F.make_k3_dspark_drafter(tmp_path / "k3")
    with pytest.raises(ConversionRefusedError, match="cannot hold a k3-mla dspark") as exc:
        plan_conversion(k3, None, to="deepspec")
    assert "k3-dspark" in str(exc.value)


def test_every_recipe_parses_and_has_a_round_trip_case():
    names = {r.name for r in load_recipes()}
    covered = {"deepspec", "vllm", "zlab-dflash", "speculators", "speculators-eagle3", "k3-dspark", "deepseek-v4",
               "torchspec", "torchspec-k3", "torchspec-eagle3", "torchspec-dflash", "mistral-large4",
               "minimax-m3-dspark", "eagle3-hf"}
    # read-only: tests/conformance/test_torchspec{,_k3,_eagle3,_dflash}_conformance.py,
    # tests/conformance/test_mistral_large4_dspark.py;
    # minimax-m3-dspark: tests/conformance/test_minimax_m3_dspark.py (written back as itself); eagle3-hf: test_eagle3_hf.py
    assert names == covered
    assert get_recipe("deepseek-v4").stages["prefix"] == "mtp."
