#!/usr/bin/env python
"""Checkpoints the benchmarks measure against: sparse skeletons (real headers, holes for data, written with
``dsparkhub.skeleton.write_sparse_safetensors``), Kimi-K2.6 / Qwen3 / DeepSeek-V4 geometries, drafters of real random
bytes.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from bench_common import dsparkhub_cli, run_child

from dsparkhub.io.header import tensor_nbytes
from dsparkhub.skeleton import write_sparse_safetensors
from dsparkhub.skeleton_tensors import SkeletonTensor


def write_skeleton(folder: Path, config: dict, tensors: list[tuple[str, str, tuple[int, ...]]], shards: int, *,
                   single_name: bool = True) -> Path:
    """Write a checkpoint whose shards are a real safetensors header followed by a hole (sparse file), each shard
    through ``dsparkhub.skeleton.write_sparse_safetensors``.

    Tensors are split over ``shards`` files in order, by bytes (an exact shard count, so not a size cap:
    ``dsparkhub.io.sharding`` does not apply). ``model.safetensors.index.json`` is written when there is more than
    one shard (or ``single_name`` is False).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    total = sum(tensor_nbytes(d, s) for _, d, s in tensors)
    per = total / shards
    groups: list[list] = [[] for _ in range(shards)]
    acc = 0
    for t in tensors:
        i = min(int(acc / per), shards - 1) if per else 0
        groups[i].append(t)
        acc += tensor_nbytes(t[1], t[2])
    groups = [g for g in groups if g] or [[]]
    n = len(groups)
    weight_map = {}
    names = (["model.safetensors"] if n == 1 and single_name else
             [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
    for fname, group in zip(names, groups):
        write_sparse_safetensors(folder / fname, [SkeletonTensor(name, dtype, tuple(shape))
                                                  for name, dtype, shape in group])
        weight_map.update({name: fname for name, _, _ in group})
    if len(names) > 1 or not single_name:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return folder


KIMI_TEXT = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
             "num_hidden_layers": 61, "vocab_size": 163840, "intermediate_size": 18432,
             "moe_intermediate_size": 2048, "n_routed_experts": 384, "n_shared_experts": 1,
             "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_attention_heads": 64,
             "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
             "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
             "bos_token_id": 163584, "eos_token_id": 163585, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}


def kimi_target_tensors(layers: int = 61, experts: int = 384, moe_inter: int = 2048):
    """Kimi-K2.6 target tensor list (``kimi_k25`` wrapper names, compressed-tensors int4 routed experts).

    Routed experts are ``weight_packed`` I32 [out, in/8] + ``weight_scale`` BF16 [out, in/32] + ``weight_shape``
    I32 [2] per projection (compressed-tensors pack-quantized, group 32), everything else BF16.
    With the defaults: about 1.03T parameters, ~213k tensors.
    """
    H, V, I = 7168, 163840, 18432
    p = "language_model."
    out = [(p + "model.embed_tokens.weight", "BF16", (V, H))]
    for i in range(layers):
        L = f"{p}model.layers.{i}."
        out += [(L + "input_layernorm.weight", "BF16", (H,)), (L + "post_attention_layernorm.weight", "BF16", (H,)),
                (L + "self_attn.q_a_proj.weight", "BF16", (1536, H)),
                (L + "self_attn.q_a_layernorm.weight", "BF16", (1536,)),
                (L + "self_attn.q_b_proj.weight", "BF16", (64 * 192, 1536)),
                (L + "self_attn.kv_a_proj_with_mqa.weight", "BF16", (576, H)),
                (L + "self_attn.kv_a_layernorm.weight", "BF16", (512,)),
                (L + "self_attn.kv_b_proj.weight", "BF16", (64 * 256, 512)),
                (L + "self_attn.o_proj.weight", "BF16", (H, 64 * 128))]
        if i == 0:
            out += [(L + f"mlp.{w}.weight", "BF16", (I, H) if w != "down_proj" else (H, I))
                    for w in ("gate_proj", "up_proj", "down_proj")]
            continue
        out += [(L + "mlp.gate.weight", "BF16", (experts, H)), (L + "mlp.gate.e_score_correction_bias", "F32",
                                                                  (experts,))]
        out += [(L + f"mlp.shared_experts.{w}.weight", "BF16", (moe_inter, H) if w != "down_proj" else (H, moe_inter))
                for w in ("gate_proj", "up_proj", "down_proj")]
        for e in range(experts):
            for w in ("gate_proj", "up_proj", "down_proj"):
                o, n = (moe_inter, H) if w != "down_proj" else (H, moe_inter)
                E = f"{L}mlp.experts.{e}.{w}."
                out += [(E + "weight_packed", "I32", (o, n // 8)), (E + "weight_scale", "BF16", (o, n // 32)),
                        (E + "weight_shape", "I32", (2,))]
    out += [(p + "model.norm.weight", "BF16", (H,)), (p + "lm_head.weight", "BF16", (V, H))]
    # the vision tower and projector (MoonViT) are a few hundred small tensors; a representative slice
    for i in range(27):
        out += [(f"vision_tower.encoder.blocks.{i}.{w}", "BF16", (1152, 1152))
                for w in ("wqkv.weight", "wo.weight", "mlp.fc0.weight", "mlp.fc1.weight")]
    out += [("mm_projector.proj.0.weight", "BF16", (4608, 4608)), ("mm_projector.proj.2.weight", "BF16", (H, 4608))]
    return out


def kimi_target_config(layers: int = 61, experts: int = 384, moe_inter: int = 2048) -> dict:
    text = {**KIMI_TEXT, "num_hidden_layers": layers, "n_routed_experts": experts, "moe_intermediate_size": moe_inter}
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "tie_word_embeddings": False, "text_config": text}


def manifest_skeleton(work: Path, manifest: str, *, tiny: bool = False) -> Path | None:
    """The target skeleton ``dsparkhub.skeleton`` writes from ``manifests/targets/<manifest>.yaml`` (real names,
    shapes, dtypes and shard count), cached in ``work``; None when that module or manifest is not available."""
    folder = work / f"{manifest}-{'tiny' if tiny else 'skeleton'}"
    if (folder / "config.json").exists():
        return folder
    try:
        from dsparkhub.skeleton import write_skeleton as manifest_write
    except ImportError:
        return None
    try:
        manifest_write(manifest, folder, tiny=tiny)
    except Exception as exc:  # a manifest still being written must not stop the benchmark: fall back
        print(f"  (manifest skeleton {manifest!r} unavailable: {type(exc).__name__}: {exc}; using the built-in one)")
        return None
    return folder


def kimi_drafter(folder: Path, target_layers: int = 61, *, layers: int = 1) -> Path:
    """A real-size DSpark drafter for a Kimi-K2.6 target, DeepSpec layout (Qwen3 backbone at H 7168), sparse."""
    H, V, r = 7168, 163840, 256
    nh, nkv, hd, inter = 56, 8, 128, 18432
    ids = sorted({1, target_layers // 2, target_layers - 2}) if target_layers > 3 else [0]
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": H, "num_hidden_layers": layers,
           "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": inter,
           "vocab_size": V, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
           "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}, "attention_bias": False,
           "num_target_layers": target_layers, "block_size": 7, "mask_token_id": 163838, "target_layer_ids": ids,
           "markov_rank": r, "markov_head_type": "vanilla", "enable_confidence_head": True,
           "confidence_head_with_markov": True, "tie_word_embeddings": False,
           "layer_types": ["full_attention"] * layers, "dtype": "bfloat16", "sample_from_anchor": True}
    t = [("embed_tokens.weight", "BF16", (V, H)), ("lm_head.weight", "BF16", (V, H)),
         ("fc.weight", "BF16", (H, len(ids) * H)), ("hidden_norm.weight", "BF16", (H,)), ("norm.weight", "BF16", (H,)),
         ("markov_head.markov_w1.weight", "BF16", (V, r)), ("markov_head.markov_w2.weight", "BF16", (V, r)),
         ("confidence_head.proj.weight", "F32", (1, H + r)), ("confidence_head.proj.bias", "F32", (1,))]
    g = dict(H=H, I=inter, nh=nh, nkv=nkv, hd=hd)
    for i in range(layers):
        t += qwen3_layer(f"layers.{i}.", g)
    return write_skeleton(folder, cfg, t, 1)


def fill_random(folder: Path, seed: int = 0, chunk: int = 64 << 20) -> int:
    """Overwrite the data section of every shard in ``folder`` with random bytes (makes a skeleton real).

    Returns bytes written.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "r+b") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            fh.seek(8 + n)
            left = f.stat().st_size - 8 - n
            while left:
                k = min(chunk, left)
                fh.write(rng.bytes(k))
                left -= k
                total += k
    return total


def qwen3_geometry(size: str) -> dict:
    """Target / drafter geometry per benchmark size (full = Qwen3-8B target, a ~3.2 GB one-layer drafter)."""
    return {"tiny": dict(H=256, V=4096, I=768, nh=4, nkv=2, hd=64, layers=4, draft_layers=1),
            "small": dict(H=1536, V=32768, I=4608, nh=12, nkv=4, hd=128, layers=8, draft_layers=2),
            "full": dict(H=4096, V=151936, I=12288, nh=32, nkv=8, hd=128, layers=36, draft_layers=1)}[size]


def qwen3_layer(prefix: str, g: dict) -> list:
    H, I, nh, nkv, hd = g["H"], g["I"], g["nh"], g["nkv"], g["hd"]
    p = prefix
    return [(p + "self_attn.q_proj.weight", "BF16", (nh * hd, H)),
            (p + "self_attn.k_proj.weight", "BF16", (nkv * hd, H)),
            (p + "self_attn.v_proj.weight", "BF16", (nkv * hd, H)),
            (p + "self_attn.o_proj.weight", "BF16", (H, nh * hd)),
            (p + "self_attn.q_norm.weight", "BF16", (hd,)), (p + "self_attn.k_norm.weight", "BF16", (hd,)),
            (p + "mlp.gate_proj.weight", "BF16", (I, H)), (p + "mlp.up_proj.weight", "BF16", (I, H)),
            (p + "mlp.down_proj.weight", "BF16", (H, I)), (p + "input_layernorm.weight", "BF16", (H,)),
            (p + "post_attention_layernorm.weight", "BF16", (H,))]


def qwen3_target_config(g: dict) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": g["H"],
            "num_hidden_layers": g["layers"], "num_attention_heads": g["nh"], "num_key_value_heads": g["nkv"],
            "head_dim": g["hd"], "intermediate_size": g["I"], "vocab_size": g["V"], "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "attention_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16"}


def make_qwen3_pair(work: Path, size: str) -> tuple[Path, Path]:
    """A sparse Qwen3 target skeleton and a DeepSpec-layout drafter holding real random bytes (cached in ``work``).

    The drafter ships its own (random, so not target-identical) embed_tokens / lm_head: convert keeps them, which
    makes the largest tensor [V, H] and the drafter as large as a real DeepSpec export.
    """
    g = qwen3_geometry(size)
    target, draft = work / f"qwen3-target-{size}", work / f"deepspec-drafter-{size}"
    if not (target / "config.json").exists():
        t = [("model.embed_tokens.weight", "BF16", (g["V"], g["H"]))]
        for i in range(g["layers"]):
            t += qwen3_layer(f"model.layers.{i}.", g)
        t += [("model.norm.weight", "BF16", (g["H"],)), ("lm_head.weight", "BF16", (g["V"], g["H"]))]
        write_skeleton(target, qwen3_target_config(g), t, max(1, g["layers"] // 8))
    if not (draft / ".complete").exists():
        shutil.rmtree(draft, ignore_errors=True)
        n, L, H, V, r = g["draft_layers"], g["layers"], g["H"], g["V"], 256
        ids = sorted({1, L // 2, L - 2})
        cfg = {**qwen3_target_config(g), "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": n,
               "num_target_layers": L, "block_size": 7, "mask_token_id": g["V"] - 2, "target_layer_ids": ids,
               "num_anchors": 512, "markov_rank": r, "markov_head_type": "vanilla", "enable_confidence_head": True,
               "confidence_head_with_markov": True, "layer_types": ["full_attention"] * n,
               "_attn_implementation": "flex_attention"}
        t = [("embed_tokens.weight", "BF16", (V, H))]
        for i in range(n):
            t += qwen3_layer(f"layers.{i}.", g)
        t += [("fc.weight", "BF16", (H, len(ids) * H)), ("hidden_norm.weight", "BF16", (H,)),
              ("norm.weight", "BF16", (H,)), ("markov_head.markov_w1.weight", "BF16", (V, r)),
              ("markov_head.markov_w2.weight", "BF16", (V, r)), ("confidence_head.proj.weight", "F32", (1, H + r)),
              ("confidence_head.proj.bias", "F32", (1,)), ("lm_head.weight", "BF16", (V, H))]
        write_skeleton(draft, cfg, t, 1)
        fill_random(draft)
        (draft / ".complete").write_text("")
    return target, draft


def v4_geometry(size: str) -> dict:
    return {"tiny": dict(H=256, V=4096, layers=4, experts=8, moe=256, shards=4, I=768, nh=4, nkv=2, hd=64,
                         draft_layers=1),
            "small": dict(H=4096, V=129280, layers=43, experts=256, moe=2048, shards=48, I=4096, nh=32, nkv=8,
                          hd=128, draft_layers=1),
            "full": dict(H=4096, V=129280, layers=43, experts=256, moe=2048, shards=48, I=12288, nh=32, nkv=8,
                         hd=128, draft_layers=2)}[size]


def make_v4_pair(work: Path, size: str) -> tuple[Path, Path]:
    """A sparse DeepSeek-V4-Flash-sized target (FP8 attention, FP4 routed experts, 48 shards, ~150 GB) without a
    drafter, and a DeepSpec-layout Qwen3 drafter for it with real random bytes and no embed / LM-head copies
    (what ``convert`` leaves when they equal the target's), so that attaching never needs target bytes."""
    g = v4_geometry(size)
    target, draft = work / f"v4-target-{size}", work / f"v4-drafter-{size}"
    if size != "tiny" and (manifest := manifest_skeleton(work, "deepseek-v4-flash")) is not None:
        target = manifest
        cfg = json.loads((target / "config.json").read_text())
        cfg = {**cfg, **(cfg.get("text_config") or {})}
        g = dict(g, H=cfg["hidden_size"], V=cfg["vocab_size"], layers=cfg["num_hidden_layers"])
    H, V, L = g["H"], g["V"], g["layers"]
    if not (target / "config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        t = [("embed.weight", "BF16", (V, H))]
        for i in range(L):
            p = f"layers.{i}."
            t += [(p + "attn_norm.weight", "BF16", (H,)), (p + "ffn_norm.weight", "BF16", (H,))]
            for w, shape in (("wq_a", (1024, H)), ("wq_b", (64 * 192, 1024)), ("wkv", (512, H)), ("wo_a", (1024, H)),
                             ("wo_b", (H, 64 * 128))):
                t += [(p + f"attn.{w}.weight", "F8_E4M3", shape),
                      (p + f"attn.{w}.scale", "F8_E8M0", (shape[0] // 128, max(1, shape[1] // 128)))]
            t += [(p + "ffn.gate.weight", "BF16", (g["experts"], H)), (p + "ffn.gate.bias", "F32", (g["experts"],))]
            for e in range(g["experts"]):
                for w in ("w1", "w2", "w3"):
                    o, n = (g["moe"], H) if w != "w2" else (H, g["moe"])
                    t += [(p + f"ffn.experts.{e}.{w}.weight", "F4", (o, n)),
                          (p + f"ffn.experts.{e}.{w}.scale", "F8_E8M0", (o, n // 32))]
        t += [("norm.weight", "BF16", (H,)), ("head.weight", "BF16", (V, H))]
        cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": H,
               "num_hidden_layers": L, "vocab_size": V, "n_routed_experts": g["experts"],
               "moe_intermediate_size": g["moe"], "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}
        write_skeleton(target, cfg, t, g["shards"], single_name=False)
    if not (draft / ".complete").exists():
        shutil.rmtree(draft, ignore_errors=True)
        n, r = g["draft_layers"], 256
        ids = [L - 4, L - 3, L - 2]
        cfg = {**qwen3_target_config(dict(g, layers=n)), "architectures": ["Qwen3DSparkModel"],
               "num_hidden_layers": n, "num_target_layers": L, "block_size": 5, "mask_token_id": V - 2,
               "target_layer_ids": ids, "markov_rank": r, "markov_head_type": "vanilla",
               "enable_confidence_head": True, "confidence_head_with_markov": True,
               "layer_types": ["full_attention"] * n, "sample_from_anchor": True}
        t = []
        for i in range(n):
            t += qwen3_layer(f"layers.{i}.", g)
        t += [("fc.weight", "BF16", (H, len(ids) * H)), ("hidden_norm.weight", "BF16", (H,)),
              ("norm.weight", "BF16", (H,)), ("markov_head.markov_w1.weight", "BF16", (V, r)),
              ("markov_head.markov_w2.weight", "BF16", (V, r)), ("confidence_head.proj.weight", "F32", (1, H + r)),
              ("confidence_head.proj.bias", "F32", (1,))]
        write_skeleton(draft, cfg, t, 1)
        fill_random(draft, seed=3)
        (draft / ".complete").write_text("")
    return target, draft


def v4_attached_skeleton(work: Path) -> Path | None:
    """DeepSeek-V4-Flash with its DSpark drafter attached (``mtp.*`` in the last 3 of 48 shards), sparse, from the
    manifest (cached); None when the skeleton module or manifest is unavailable."""
    v4 = work / "deepseek-v4-flash-dspark-skeleton"
    if not (v4 / "config.json").exists():
        try:
            from dsparkhub.skeleton import write_skeleton as manifest_write

            manifest_write("deepseek-v4-flash", v4, with_drafter=True)
        except Exception as exc:  # optional: the benchmark still runs its built-in geometries
            print(f"  (V4-Flash skeleton with drafter unavailable: {type(exc).__name__}: {exc})")
            return None
    return v4


def v4_real_drafter(work: Path) -> Path | None:
    """A drafter with the real geometry of DeepSeek's V4-Flash DSpark drafter (3 stages of FP8 attention and FP4
    routed experts, 4,704 tensors, ~10.9 GB) and random bytes: the ``mtp.*`` tensors of
    :func:`v4_attached_skeleton`, detached into a standalone folder (``deepseek-v4`` layout), then filled. Cached;
    None when the skeleton is unavailable."""
    folder = work / "v4-flash-drafter-real"
    if (folder / ".complete").exists():
        return folder
    attached = v4_attached_skeleton(work)
    if attached is None:
        return None
    from dsparkhub.attach import detach

    print("  building the real-size V4-Flash drafter (once; ~11 GB of random bytes)", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    detach(attached, folder)
    fill_random(folder, seed=5)
    (folder / ".complete").write_text("")
    return folder


def converted_drafter(work: Path, size: str) -> Path:
    """The vLLM-layout drafter ``convert`` makes from :func:`make_qwen3_pair` (cached)."""
    out = work / f"converted-{size}"
    if not (out / "config.json").exists():
        target, draft = make_qwen3_pair(work, size)
        shutil.rmtree(out, ignore_errors=True)
        run_child(dsparkhub_cli("convert", draft, "--target", target, "--out", out, "--allow-different-embeddings"))
    return out
