"""dsparkhub.verify.reference.modeling / loading: DraftSpec -> module config (vLLM precedence, read by the recipes),
checkpoint names, loading, backbone semantics."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsparkhub.errors import CheckpointNotFoundError, IncompatibleTargetError, LayoutError
from dsparkhub.example.layouts import make_tiny_drafter, make_tiny_target
from dsparkhub.layouts.reading import spec_from_config as spec_of_config
from dsparkhub.verify.reference.loading import load_drafter, resolve_layer_attention
from dsparkhub.verify.reference.loading import drafter_config_of as drafter_config_from_dict
from dsparkhub.verify.reference.drafter_config import LayerAttention
from dsparkhub.verify.reference.layers import attention_mask
from dsparkhub.verify.reference.modeling import ContextCache, Drafter, target_features

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    model = make_tiny_target(folder, vocab_size=64, hidden_size=32, num_hidden_layers=3)
    return folder, model


def _vllm_cfg(**kw):
    """A vLLM-layout drafter config (``converters/vllm.yaml``) with ``kw`` in place of its ids and mask token."""
    cfg = _base_cfg(sample_from_anchor=True)
    del cfg["target_layer_ids"], cfg["mask_token_id"]
    cfg.update({"target_layer_ids": [0, 1], "mask_token_id": 63})
    cfg.update(kw)
    return {k: v for k, v in cfg.items() if v is not None}


@pytest.mark.parametrize("keys, expected", [
    ({"target_layer_ids": [0, 2]}, (0, 2)),
    ({"target_layer_ids": [-1, 0]}, (-1, 0)),
])
def test_target_layer_id_precedence_and_numbering(keys, expected):
    """Target layer ids as the vllm recipe reads them (layer-index numbering)."""
    assert drafter_config_from_dict(_vllm_cfg(**keys)).target_layer_ids == expected


@pytest.mark.parametrize("keys", [{"target_layer_ids": []}, {"target_layer_ids": "0,1"}])
def test_target_layer_ids_missing_or_bad(keys):
    with pytest.raises(LayoutError, match="target"):
        drafter_config_from_dict(_vllm_cfg(**keys))


@pytest.mark.parametrize("keys, expected", [
    ({"dflash_config": {"mask_token_id": 5}, "mask_token_id": 6}, 5),
    ({"mask_token_id": 6, "dspark_noise_token_id": 7}, 6),
    ({"mask_token_id": None, "dspark_noise_token_id": 7, "pard_token": 8}, 7),
    ({"mask_token_id": None, "pard_token": 8, "ptd_token_id": 9}, 8),
    ({"mask_token_id": None, "ptd_token_id": 9}, 9),
])
def test_mask_token_precedence(keys, expected):
    assert drafter_config_from_dict(_vllm_cfg(**keys)).mask_token_id == expected


def test_mask_token_missing():
    with pytest.raises(LayoutError, match="mask token"):
        drafter_config_from_dict(_vllm_cfg(mask_token_id=None))


def _base_cfg(**kw):
    cfg = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "intermediate_size": 64, "vocab_size": 64, "target_layer_ids": [0, 1],
           "mask_token_id": 63, "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "markov_rank": 4,
           "enable_confidence_head": True, "confidence_head_with_markov": True, "block_size": 7}
    cfg.update(kw)
    return cfg


def test_kind_and_layout_resolution():
    d = drafter_config_from_dict(_base_cfg())
    assert (d.kind, d.sample_from_anchor, d.block_size, d.markov_rank) == ("dspark", True, 7, 4)
    assert drafter_config_from_dict(_base_cfg(sample_from_anchor=False)).sample_from_anchor is False
    legacy = drafter_config_from_dict(_base_cfg(architectures=["DSparkDraftModel"]))
    assert legacy.kind == "dspark"
    f = drafter_config_from_dict(_base_cfg(architectures=["DFlashDraftModel"], markov_rank=None))
    assert (f.kind, f.sample_from_anchor, f.markov_rank, f.enable_confidence_head) == ("dflash", False, 0, False)
    with pytest.raises(LayoutError, match="DSparkDraftModel"):
        drafter_config_from_dict(_base_cfg(architectures=["DSparkDraftModel"], model_type="deepseek_v4"))
    with pytest.raises(LayoutError, match="no window size is set"):
        drafter_config_from_dict(_base_cfg(layer_types=["sliding_attention"], sliding_window=8))


def test_parameter_names_are_deepspec_names():
    d = Drafter(drafter_config_from_dict(_base_cfg(num_hidden_layers=2)))
    names = set(d.state_dict())
    per_layer = {f"layers.{i}.{n}" for i in range(2) for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")}
    expected = per_layer | {"fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight",
                            "lm_head.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                            "confidence_head.proj.weight", "confidence_head.proj.bias"}
    assert names == expected
    sd = d.state_dict()
    assert list(sd["fc.weight"].shape) == [32, 2 * 32]
    assert list(sd["markov_head.markov_w1.weight"].shape) == [64, 4]
    assert list(sd["markov_head.markov_w2.weight"].shape) == [64, 4]
    assert list(sd["confidence_head.proj.weight"].shape) == [1, 32 + 4]
    reduced = Drafter(drafter_config_from_dict(_base_cfg(draft_vocab_size=16)))
    assert list(reduced.state_dict()["d2t"].shape) == [16] and reduced.state_dict()["d2t"].dtype == torch.int64
    assert list(reduced.state_dict()["lm_head.weight"].shape) == [16, 32]
    dflash = Drafter(drafter_config_from_dict(_base_cfg(architectures=["DFlashDraftModel"])))
    assert not any(n.startswith(("markov_head", "confidence_head")) for n in dflash.state_dict())


def test_d2t_maps_draft_ids_to_target_ids():
    d = Drafter(drafter_config_from_dict(_base_cfg(draft_vocab_size=4)))
    d.d2t.copy_(torch.tensor([0, 9, 20, 59]))
    assert d.to_target_ids(torch.tensor([0, 1, 2, 3])).tolist() == [0, 10, 22, 62]


def test_load_deepspec_run_dir_round_trip(target, tmp_path):
    folder, model = target
    made = make_tiny_drafter(tmp_path / "run", model, kind="dspark", target_layer_ids=[0, 2])
    assert (tmp_path / "run" / "step_latest").is_symlink()
    loaded = load_drafter(tmp_path / "run", model)
    assert loaded.source.endswith("step_1")
    for name, tensor in made.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.config.target_layer_ids == (0, 2)


def test_folder_without_embed_and_head_shares_the_targets(target, tmp_path):
    folder, model = target
    make_tiny_drafter(tmp_path / "conv", model, kind="dspark", include_embed_head=False, layout="flat")
    names = set(load_file(str(tmp_path / "conv" / "model.safetensors")))
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    d = load_drafter(tmp_path / "conv", model)
    assert torch.equal(d.embed_tokens.weight, model.get_input_embeddings().weight)
    assert torch.equal(d.lm_head.weight, model.get_output_embeddings().weight)
    with pytest.raises(LayoutError, match="embed_tokens"):
        load_drafter(tmp_path / "conv", None)


def test_zlab_dflash_folder_loads(target, tmp_path):
    folder, model = target
    make_tiny_drafter(tmp_path / "dflash", model, kind="dflash", target_layer_ids=[0, 1], block_size=5)
    cfg = json.loads((tmp_path / "dflash" / "config.json").read_text())
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": 63}
    d = load_drafter(tmp_path / "dflash", model)
    assert d.config.kind == "dflash" and not d.config.sample_from_anchor and d.config.block_size == 5


def test_missing_unexpected_and_misshapen_tensors_are_all_listed(target, tmp_path):
    folder, model = target
    make_tiny_drafter(tmp_path / "bad", model, kind="dspark", layout="flat")
    path = tmp_path / "bad" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["fc.weight"]
    del tensors["markov_head.markov_w1.weight"]
    tensors["mtp.0.bogus"] = torch.zeros(2)
    tensors["norm.weight"] = torch.zeros(5)
    save_file(tensors, str(path))
    with pytest.raises(LayoutError) as err:
        load_drafter(tmp_path / "bad", model)
    text = str(err.value)
    for needle in ("fc.weight", "markov_head.markov_w1.weight", "mtp.0.bogus", "norm.weight: [5]"):
        assert needle in text


def test_incompatible_target_is_refused(target, tmp_path):
    folder, model = target
    make_tiny_drafter(tmp_path / "far", model, kind="dspark", target_layer_ids=[0, 3], layout="flat")
    with pytest.raises(IncompatibleTargetError, match=r"\[3\]"):
        load_drafter(tmp_path / "far", model)


def test_missing_folder_and_empty_run(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        load_drafter(tmp_path / "nope")
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="step_latest"):
        load_drafter(tmp_path / "run")


def test_target_features_use_layer_index_numbering():
    hs = tuple(torch.full((1, 2, 3), float(i)) for i in range(5))  # embeddings + 4 layers
    feats = target_features(hs, (-1, 0, 2))
    assert feats[0, 0].tolist() == [0.0] * 3 + [1.0] * 3 + [3.0] * 3


def test_cached_context_matches_masked_training_forward(target):
    """Inference (context K/V cached for positions < p, block at p..) equals the batched, masked training path."""
    _, model = target
    torch.manual_seed(0)
    d = make_tiny_drafter(None, model, kind="dspark", target_layer_ids=[0, 1])
    seq_len, block, anchor = 12, 4, 7
    feats = torch.randn(1, seq_len, d.config.num_context_features * d.config.target_hidden_size)
    ids = torch.randint(0, 60, (1, seq_len))
    with torch.no_grad():
        # inference: context = positions < anchor, appended in two chunks
        cache = d.context_kv(feats[:, :3], torch.arange(3).unsqueeze(0))
        d.extend_context(cache, feats[:, 3:anchor], torch.arange(3, anchor).unsqueeze(0))
        q_ids, q_pos, first = d.block_query(ids[:, anchor], block, torch.tensor([anchor]))
        h_inf = d.backbone(q_ids, q_pos, cache)
        # training: full context, mask hides positions >= anchor
        full = d.context_kv(feats, torch.arange(seq_len).unsqueeze(0))
        mask = torch.cat([torch.arange(seq_len) < anchor, torch.ones(block, dtype=torch.bool)]).view(1, 1, 1, -1)
        h_train = d.backbone(q_ids, q_pos, full, mask.expand(1, 1, block, -1))
        # a block that could see the future context differs (the mask matters)
        h_leak = d.backbone(q_ids, q_pos, full)
    assert first == 0 and q_ids[0].tolist() == [int(ids[0, anchor])] + [63] * 3
    assert torch.allclose(h_inf, h_train, atol=1e-5)
    assert not torch.allclose(h_inf, h_leak, atol=1e-3)


def test_block_query_layouts(target):
    _, model = target
    dspark = make_tiny_drafter(None, model, kind="dspark")
    dflash = make_tiny_drafter(None, model, kind="dflash")
    ids, pos, first = dspark.block_query(torch.tensor([5]), 3, torch.tensor([10]))
    assert ids.tolist() == [[5, 63, 63]] and pos.tolist() == [[10, 11, 12]] and first == 0
    ids, pos, first = dflash.block_query(torch.tensor([5]), 3, torch.tensor([10]))
    assert ids.tolist() == [[5, 63, 63, 63]] and pos.tolist() == [[10, 11, 12, 13]] and first == 1


def test_context_cache_length():
    assert ContextCache().length == 0


# ---- sliding-window and causal draft layers (vLLM 0.32 qwen3_dflash.py _resolve_layer_attention) --------------

SWA, FULL = "sliding_attention", "full_attention"


@pytest.mark.parametrize("keys, expected", [
    ({}, [(None, False)] * 2),
    # speculators' default drafter: every layer sliding -> causal unless is_causal says otherwise
    ({"layer_types": [SWA, SWA], "sliding_window": 8, "use_sliding_window": True}, [(8, True)] * 2),
    ({"layer_types": [SWA, SWA], "sliding_window": 8, "use_sliding_window": True, "is_causal": False},
     [(8, False)] * 2),
    ({"layer_types": [SWA, SWA], "sliding_window": 8, "use_sliding_window": True,
      "dflash_config": {"causal": False}}, [(8, False)] * 2),
    # is_causal wins over dflash_config.causal
    ({"is_causal": True, "dflash_config": {"causal": False}}, [(None, True)] * 2),
    # mixed layers (z-lab gemma-4 style): causal only where sliding
    ({"layer_types": [SWA, FULL], "sliding_window": 4, "use_sliding_window": True}, [(4, True), (None, False)]),
    # use_swa (MiMo): every layer sliding, non-causal; dflash_config.swa_window_size wins over sliding_window
    ({"dflash_config": {"use_swa": True, "swa_window_size": 6}, "sliding_window": 8, "use_sliding_window": True},
     [(6, False)] * 2),
    # transformers' Qwen3Config fills layer_types from max_window_layers when absent
    ({"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}, [(None, False), (5, True)]),
])
def test_layer_attention_resolution(keys, expected):
    cfg = _base_cfg(num_hidden_layers=2, sample_from_anchor=True, **keys)
    got = resolve_layer_attention(spec_of_config(cfg))
    assert [(a.sliding_window, a.causal) for a in got] == expected
    assert drafter_config_from_dict(cfg).layer_attention == got


@pytest.mark.parametrize("keys, match", [
    ({"layer_types": [SWA]}, "no window size"),
    ({"layer_types": [SWA], "sliding_window": 8}, "use_sliding_window"),  # transformers drops the window
    ({"dflash_config": {"use_swa": True, "swa_window_size": 0}}, "positive int"),
    ({"dflash_config": {"attention_sink_bias": True}}, "attention-sink"),
    ({"is_neox_style": False}, "interleaved RoPE"),
    ({"layer_types": [SWA, SWA]}, "not a valid Qwen3 config"),
])
def test_layer_attention_refusals(keys, match):
    with pytest.raises(LayoutError, match=match):
        drafter_config_from_dict(_base_cfg(sample_from_anchor=True, **keys))


def test_attention_mask_follows_flash_attention_windows():
    q = torch.tensor([[4, 5]])
    k = torch.arange(7).unsqueeze(0)  # context 0..3, block 4..5 plus one later key
    assert attention_mask(q, k, LayerAttention()) is None
    causal = attention_mask(q, k, LayerAttention(causal=True))[0, 0]
    assert causal.int().tolist() == [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]
    swa = attention_mask(q, k, LayerAttention(sliding_window=3, causal=True))[0, 0]  # keys p-2 .. p
    assert swa.int().tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0]]
    bidi = attention_mask(q, k, LayerAttention(sliding_window=2, causal=False))[0, 0]  # keys p-1 .. p+1
    assert bidi.int().tolist() == [[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]]


def _sliding(drafter: Drafter, **keys) -> Drafter:
    """``drafter`` with the same weights and a config whose draft layers follow ``keys``."""
    import dataclasses

    cfg = _base_cfg(num_hidden_layers=drafter.config.num_hidden_layers, sample_from_anchor=True, **keys)
    modes = resolve_layer_attention(spec_of_config(cfg))
    other = Drafter(dataclasses.replace(drafter.config, layer_attention=modes)).eval()
    other.load_state_dict(drafter.state_dict())
    return other


def test_sliding_window_backbone_matches_explicit_masks(target):
    """Cached-context inference of sliding / causal layers equals full attention under the hand-written mask."""
    _, model = target
    torch.manual_seed(0)
    d = make_tiny_drafter(None, model, kind="dspark", target_layer_ids=[0, 1], num_hidden_layers=2)
    feats = torch.randn(1, 9, d.config.num_context_features * d.config.target_hidden_size)
    anchor, block = 9, 4
    variants = {
        "causal_swa": ({"layer_types": [SWA, SWA], "sliding_window": 3, "use_sliding_window": True},
                       lambda qp, kp: (kp <= qp) & (kp >= qp - 2)),
        "bidi_swa": ({"layer_types": [SWA, SWA], "sliding_window": 3, "use_sliding_window": True,
                      "is_causal": False}, lambda qp, kp: (kp - qp).abs() <= 2),
        "causal_full": ({"is_causal": True}, lambda qp, kp: kp <= qp),
    }
    with torch.no_grad():
        cache = d.context_kv(feats[:, :5], torch.arange(5).unsqueeze(0))
        d.extend_context(cache, feats[:, 5:], torch.arange(5, 9).unsqueeze(0))
        assert cache.positions.tolist() == [list(range(9))]
        q_ids, q_pos, _ = d.block_query(torch.tensor([7]), block, torch.tensor([anchor]))
        full = d.backbone(q_ids, q_pos, cache)
        kp = torch.arange(anchor + block).view(1, 1, -1)
        for name, (keys, rule) in variants.items():
            s = _sliding(d, **keys)
            got = s.backbone(q_ids, q_pos, cache)
            want = d.backbone(q_ids, q_pos, cache, rule(q_pos.view(1, -1, 1), kp).unsqueeze(1))
            assert torch.allclose(got, want, atol=1e-6), name
            assert not torch.allclose(got, full, atol=1e-4), f"{name}: the mask should matter"
        # a bidirectional window wider than everything is full attention
        wide = _sliding(d, layer_types=[SWA, SWA], sliding_window=64, use_sliding_window=True, is_causal=False)
        assert torch.allclose(wide.backbone(q_ids, q_pos, cache), full, atol=1e-6)


def test_attention_value_scale_scales_context_and_block_values(target):
    """dflash_config.attention_value_scale multiplies V of context and block (vLLM 0.32 qwen3_dflash.py forward and
    precompute_and_store_context_kv)."""
    import dataclasses

    _, model = target
    d = make_tiny_drafter(None, model, kind="dflash", target_layer_ids=[0, 1])
    assert drafter_config_from_dict(_base_cfg(architectures=["DFlashDraftModel"], markov_rank=None, dflash_config={
        "attention_value_scale": 0.5})).value_scale == 0.5
    scaled = Drafter(dataclasses.replace(d.config, value_scale=0.5)).eval()
    scaled.load_state_dict(d.state_dict())
    x = torch.randn(1, 3, d.config.hidden_size)
    cos, sin = d.rope.cos_sin(torch.arange(3).unsqueeze(0), x.dtype)
    with torch.no_grad():
        k0, v0 = d.layers[0].self_attn.kv(x, cos, sin)
        k1, v1 = scaled.layers[0].self_attn.kv(x, cos, sin)
    assert torch.equal(k0, k1) and torch.allclose(v1, 0.5 * v0)
