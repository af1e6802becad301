"""vLLM 0.34's Mistral Large 4 DSpark (``MistralLarge4DSparkModel``, registry.py:726-729): the drafter ships inside the
target's Mistral-native checkpoint (``params.json`` ``mtp.dspark`` block, ``mtp_dspark.*`` tensors in
``consolidated.safetensors``), with a vanilla or a recurrent (``rnn``) Markov head.

The fixture is built here, tiny, with the names and shapes of vLLM 0.34.0's own class: ``params.json`` keys as
``transformers_utils/configs/mistral.py:155-183,477-534`` reads them; tensor names inverted from ``_DSPARK_NAME_MAP``
(``models/mistral/mistral_large4/nvidia/dspark.py:44-55``) and ``_CHECKPOINT_NAME_MAP`` (``nvidia/model.py:296-316``);
shapes from ``MistralLarge4DSparkModel.__init__`` (:91-167), ``MistralMLAAttention`` (``models/mistral/nvidia/
attention.py:86-116``) and ``MistralMLP``. vLLM 0.34 cannot build the class on a CPU machine, so no fixture is made
by it: its package ``__init__`` raises "Mistral Large 4 is only supported on NVIDIA and AMD GPUs.", and with
``current_platform.is_cuda`` stood in, importing ``nvidia/dspark.py`` fails on a CUDA op the CPU build of ``vllm._C``
lacks (``cutlass_scaled_mm_supports_block_fp8``, via ``_custom_ops.py:745``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from dsparkhub.cli import main
from dsparkhub.errors import LayoutError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate import validate

H, V, NH, NOPE, ROPE, VHD, KV_LORA, I, R, DEPTH = 32, 128, 2, 8, 4, 8, 16, 64, 8, 4


def make_mistral_large4_dspark(folder: Path, *, head_type: str = "vanilla", draft_input: str = "shared_mask",
                               taps: str = "1,2", drop: tuple[str, ...] = (), n_layers: int = 1) -> Path:
    """A tiny Mistral Large 4 target folder with its DSpark drafter attached (``params.json`` + one
    ``consolidated.safetensors``); ``drop`` removes checkpoint tensors by name."""
    folder.mkdir(parents=True)
    params = {"dim": H, "n_layers": 4, "hidden_dim": I, "n_heads": NH, "n_kv_heads": NH, "norm_eps": 1e-5,
              "vocab_size": V, "kv_lora_rank": KV_LORA, "q_lora_rank": None, "qk_rope_head_dim": ROPE,
              "qk_nope_head_dim": NOPE, "v_head_dim": VHD, "max_position_embeddings": 4096,
              "moe": {"num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "expert_hidden_dim": 16},
              "dsa": {"index_topk": 64, "index_n_heads": 2, "index_head_dim": 16},
              "mtp": {"n_layers": n_layers, "depth": DEPTH, "target_activation_layers": taps,
                      "ragged_attention": None,
                      "dspark": {"markov_rank": R, "head_type": head_type, "draft_input": draft_input}}}
    (folder / "params.json").write_text(json.dumps(params))
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    n_taps = len(taps.split(","))
    tensors = {"tok_embeddings.weight": t(V, H), "norm.weight": t(H), "output.weight": t(V, H),
               "layers.0.attention_norm.weight": t(H)}  # the target's (a few): not the drafter's
    for i in range(n_layers):
        p = f"mtp_dspark.backbone.layers.{i}."
        tensors |= {p + "attention_norm.weight": t(H), p + "ffn_norm.weight": t(H),
                    p + "attention.wq.weight": t(NH * (NOPE + ROPE), H),
                    p + "attention.wkv_a_with_mqa.weight": t(KV_LORA + ROPE, H),
                    p + "attention.kv_a_norm.weight": t(KV_LORA),
                    p + "attention.wkv_b.weight": t(NH * (NOPE + VHD), KV_LORA),
                    p + "attention.wo.weight": t(H, NH * VHD),
                    p + "feed_forward.w1.weight": t(I, H), p + "feed_forward.w3.weight": t(I, H),
                    p + "feed_forward.w2.weight": t(H, I)}
    if n_taps > 1:
        tensors["mtp_dspark.backbone.target_projection.weight"] = t(H, n_taps * H)
    tensors |= {"mtp_dspark.backbone.target_norm.weight": t(H), "mtp_dspark.backbone.final_norm.weight": t(H),
                "mtp_dspark.backbone.mask_embedding": t(DEPTH - 1, H) if draft_input == "position_specific"
                else t(H),
                "mtp_dspark.autoregressive_head.embedding.weight": t(V, R),
                "mtp_dspark.autoregressive_head.output.weight": t(V, R)}
    if head_type == "rnn":
        tensors |= {"mtp_dspark.autoregressive_head.joint_proj.weight": t(3 * R, H + 2 * R),
                    "mtp_dspark.autoregressive_head.joint_proj.bias": t(3 * R)}
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(folder / "consolidated.safetensors"))
    return folder


@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_read_from_params_json_and_mtp_dspark_tensors(tmp_path, head_type):
    spec = open_draft(make_mistral_large4_dspark(tmp_path / "m", head_type=head_type)).spec
    assert (spec.layout, spec.family, spec.variant, spec.architecture) == (
        "mistral-large4", "mistral-large4", "dspark", "MistralLarge4DSparkModel")
    assert (spec.block_size, spec.target_layer_ids, spec.markov_rank, spec.markov_head_type) == (
        DEPTH, [1, 2], R, head_type)
    assert (spec.hidden_size, spec.vocab_size, spec.num_layers, spec.num_target_layers) == (H, V, 1, 4)
    assert spec.source_names["markov_head.markov_w1.weight"] == "mtp_dspark.autoregressive_head.embedding.weight"
    assert spec.source_names["layers.0.self_attn.q_proj.weight"] == "mtp_dspark.backbone.layers.0.attention.wq.weight"
    assert ("joint_proj.weight" in spec.tensors) == (head_type == "rnn")
    assert not any(n.startswith(("tok_embeddings", "output", "lm_head")) for n in spec.tensors)  # the target's


@pytest.mark.parametrize("head_type,draft_input", [("vanilla", "shared_mask"), ("rnn", "shared_mask"),
                                                   ("rnn", "position_specific")])
def test_a_complete_drafter_validates_clean(tmp_path, head_type, draft_input):
    report = validate(make_mistral_large4_dspark(tmp_path / "m", head_type=head_type, draft_input=draft_input),
                      num_speculative_tokens=DEPTH)
    assert report.ok and not report.warnings, [f.message for f in report.findings]
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "m")])
    assert res.exit_code == 0 and "mistral-large4" in res.output.lower(), res.output


@pytest.mark.parametrize("dropped,canonical", [
    ("mtp_dspark.autoregressive_head.joint_proj.bias", "joint_proj.bias"),
    ("mtp_dspark.autoregressive_head.output.weight", "markov_head.markov_w2.weight"),
    ("mtp_dspark.backbone.target_projection.weight", "fc.weight"),
    ("mtp_dspark.backbone.layers.0.feed_forward.w3.weight", "layers.0.mlp.up_proj.weight"),
])
def test_a_missing_drafter_tensor_is_an_error(tmp_path, dropped, canonical):
    """The rnn head's joint_proj (vLLM 0.34 load_weights refuses it missing), and what 0.34 does not check: the
    vanilla Markov head, which it would serve as zeros (dspark.py:377-386 requires the head for rnn only)."""
    report = validate(make_mistral_large4_dspark(tmp_path / "m", head_type="rnn", drop=(dropped,)))
    missing = [f for f in report.errors if f.code == "DSH201"]
    assert missing and canonical in missing[0].message and f"`{dropped}`" in missing[0].message, report.to_dict()


def test_wrong_mask_embedding_shape_for_position_specific_masks(tmp_path):
    folder = make_mistral_large4_dspark(tmp_path / "m", draft_input="position_specific")
    params = json.loads((folder / "params.json").read_text())
    params["mtp"]["dspark"]["draft_input"] = "shared_mask"  # the config says one shared mask row; [D-1, H] ships
    (folder / "params.json").write_text(json.dumps(params))
    report = validate(folder)
    assert any("mask_embedding" in f.message + str(f.location) for f in report.errors), report.to_dict()


def test_rnn_head_served_for_mistral_large4_only(tmp_path):
    """DSH105 reads the head types a family's table lists: rnn passes for Mistral Large 4 (vLLM 0.34 serves it),
    a `gru` head does not."""
    folder = make_mistral_large4_dspark(tmp_path / "m", head_type="rnn")
    assert "DSH105" not in validate(folder).codes
    params = json.loads((folder / "params.json").read_text())
    params["mtp"]["dspark"]["head_type"] = "gru"
    (folder / "params.json").write_text(json.dumps(params))
    (f105,) = [f for f in validate(folder).errors if f.code == "DSH105"]
    assert "vanilla / rnn" in f105.message and f105.found == "gru"


@pytest.mark.parametrize("taps", ["1,x", ""])
def test_target_activation_layers_not_comma_ints_is_refused(tmp_path, taps):
    folder = make_mistral_large4_dspark(tmp_path / "m")
    params = json.loads((folder / "params.json").read_text())
    params["mtp"]["target_activation_layers"] = taps
    (folder / "params.json").write_text(json.dumps(params))
    with pytest.raises(LayoutError, match="target_activation_layers|target layer ids"):
        open_draft(folder)


def test_validate_for_a_vllm_without_the_class_says_which_versions_serve_it(tmp_path):
    """`validate --vllm-version 0.32 / 0.33` (a node you are not on): DSH403 names 0.34, whose registry serves
    MistralLarge4DSparkModel (registry.py:726-729); judged for 0.34 (or a newer, unconfirmed 0.35) it is not."""
    folder = make_mistral_large4_dspark(tmp_path / "m", head_type="rnn")

    def codes(version):
        res = CliRunner().invoke(main, ["validate", str(folder), "--json", "--vllm-version", version])
        return res.exit_code, json.loads(res.output)

    for old in ("0.32.0", "0.33"):
        code, report = codes(old)
        (f403,) = [f for f in report["findings"] if f["code"] == "DSH403"]
        assert code == 1 and "does not serve MistralLarge4DSparkModel (vLLM 0.34 does)" in f403["message"]
    for new in ("0.34.0", "0.35.0"):
        code, report = codes(new)
        assert code == 0 and report["ok"] and report["vllm_contract"]["contract_line"] == "0.34", report
