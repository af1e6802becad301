"""Tiny checkpoints of the decoder families beyond Qwen3, with their real names and config keys: a Gemma4 text target
and DeepSpec's ``Gemma4DSparkModel`` drafter, a Kimi K3 MLA DSpark drafter, and a DeepSeek-V4-style target (sharded,
optionally with its DSpark stages under ``mtp.*``). Same conventions as :mod:`dsparkhub.testing.factories.qwen3` (seeded
random weights at toy sizes); nothing here reads a layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dsparkhub.testing.factories.common import dense_mlp, random_tensors, write_checkpoint

GEMMA4_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")


def make_gemma4_target(folder: str | Path, *, hidden: int = 32, layers: int = 4, vocab: int = 128, heads: int = 4,
                       kv_heads: int = 2, head_dim: int = 8, intermediate: int = 64, dtype=torch.bfloat16,
                       seed: int = 7) -> Path:
    """A tiny Gemma4 text target (``Gemma4ForConditionalGeneration`` naming, ``text_config``), tied embeddings."""
    r = random_tensors(torch.Generator().manual_seed(seed), dtype)
    pre = "model.language_model."
    t = {pre + "embed_tokens.weight": r(vocab, hidden), pre + "norm.weight": torch.ones(hidden, dtype=dtype)}
    for i in range(layers):
        p = f"{pre}layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(heads * head_dim, hidden),
              p + "self_attn.k_proj.weight": r(kv_heads * head_dim, hidden),
              p + "self_attn.o_proj.weight": r(hidden, heads * head_dim),
              p + "self_attn.q_norm.weight": torch.ones(head_dim, dtype=dtype),
              p + "self_attn.k_norm.weight": torch.ones(head_dim, dtype=dtype),
              **dense_mlp(p, r, hidden, intermediate, dtype, GEMMA4_NORMS)}
    text = {"model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_global_key_value_heads": kv_heads,
            "head_dim": head_dim, "global_head_dim": head_dim, "intermediate_size": intermediate,
            "vocab_size": vocab, "rms_norm_eps": 1e-6, "attention_k_eq_v": True,
            "layer_types": ["full_attention"] * layers, "final_logit_softcapping": 30.0,
            "max_position_embeddings": 4096, "tie_word_embeddings": True}
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
              "tie_word_embeddings": True, "dtype": str(dtype).removeprefix("torch.")}
    return write_checkpoint(Path(folder), config, t)


def make_deepspec_gemma4_drafter(folder: str | Path, target: str | Path, *, layers: int = 2,
                                 target_layer_ids: tuple[int, ...] = (0, 1, 2), block_size: int = 7,
                                 markov_rank: int = 8, seed: int = 8) -> Path:
    """A DeepSpec ``Gemma4DSparkModel`` step folder (FORMATS §2 Gemma4 variant): built from the target's
    ``text_config``, every layer ``full_attention`` with ``attention_k_eq_v`` (no ``v_proj``), pre/post-feedforward
    norms, frozen embed / lm_head copies, Markov and confidence heads; mask token 4 as DeepSpec's Gemma4 configs."""
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    text = dict(tcfg["text_config"])
    tt = load_file(str(target / "model.safetensors"))
    emb = tt["model.language_model.embed_tokens.weight"]
    H, V = text["hidden_size"], text["vocab_size"]
    nh, nkv, hd, inter = (text["num_attention_heads"], text["num_global_key_value_heads"], text["global_head_dim"],
                          text["intermediate_size"])
    r = random_tensors(torch.Generator().manual_seed(seed), emb.dtype)
    t = {"embed_tokens.weight": emb.clone(), "lm_head.weight": emb.clone(),
         "fc.weight": r(H, len(target_layer_ids) * H), "hidden_norm.weight": torch.ones(H, dtype=emb.dtype),
         "norm.weight": torch.ones(H, dtype=emb.dtype), "markov_head.markov_w1.weight": r(V, markov_rank),
         "markov_head.markov_w2.weight": r(V, markov_rank),
         "confidence_head.proj.weight": r(1, H + markov_rank).float(), "confidence_head.proj.bias": torch.zeros(1)}
    for i in range(layers):
        p = f"layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(nh * hd, H), p + "self_attn.k_proj.weight": r(nkv * hd, H),
              p + "self_attn.o_proj.weight": r(H, nh * hd),
              p + "self_attn.q_norm.weight": torch.ones(hd, dtype=emb.dtype),
              p + "self_attn.k_norm.weight": torch.ones(hd, dtype=emb.dtype),
              **dense_mlp(p, r, H, inter, emb.dtype, GEMMA4_NORMS)}
    cfg = dict(text)
    cfg.update({"architectures": ["Gemma4DSparkModel"], "num_hidden_layers": layers,
                "num_target_layers": text["num_hidden_layers"], "block_size": block_size, "mask_token_id": 4,
                "target_layer_ids": list(target_layer_ids), "markov_rank": markov_rank,
                "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True,
                "tie_word_embeddings": False, "layer_types": ["full_attention"] * layers,
                "target_model_type": tcfg["model_type"], "target_text_model_type": text["model_type"],
                "num_anchors": 512, "_attn_implementation": "flex_attention"})
    return write_checkpoint(Path(folder), cfg, t)


def make_k3_dspark_drafter(folder: str | Path, *, hidden: int = 32, layers: int = 2, vocab: int = 128,
                           heads: int = 4, q_lora: int = 16, kv_lora: int = 8, nope: int = 8, rope: int = 4,
                           v_head: int = 8, intermediate: int = 64, target_hidden: int = 32,
                           target_num_hidden_layers: int = 8, target_layer_ids: tuple[int, ...] = (1, 3, 5),
                           block_size: int = 8, markov_rank: int = 8, seed: int = 9,
                           config_overrides: dict | None = None, embed: torch.Tensor | None = None) -> Path:
    """A Kimi K3 MLA DSpark drafter (``K3DSparkModel``, ``model_type k3_dspark``; FORMATS §5) at toy size:
    ``context_proj`` [H, A*Ht], ``context_norm``, ``final_norm``, MLA projections, Markov / confidence heads, a copy
    of the target embedding (``embed`` or random) and no ``lm_head``."""
    r = random_tensors(torch.Generator().manual_seed(seed), torch.bfloat16)
    bf = torch.bfloat16
    t = {"embed_tokens.weight": embed.clone() if embed is not None else r(vocab, hidden),
         "context_proj.weight": r(hidden, len(target_layer_ids) * target_hidden),
         "context_norm.weight": torch.ones(hidden, dtype=bf), "final_norm.weight": torch.ones(hidden, dtype=bf),
         "markov_head.markov_w1.weight": r(vocab, markov_rank), "markov_head.markov_w2.weight": r(vocab, markov_rank),
         "confidence_head.proj.weight": r(1, hidden + markov_rank).float(), "confidence_head.proj.bias": torch.zeros(1)}
    for i in range(layers):
        p = f"layers.{i}."
        t |= {p + "self_attn.q_a_proj.weight": r(q_lora, hidden),
              p + "self_attn.q_a_layernorm.weight": torch.ones(q_lora, dtype=bf),
              p + "self_attn.q_b_proj.weight": r(heads * (nope + rope), q_lora),
              p + "self_attn.kv_a_proj_with_mqa.weight": r(kv_lora + rope, hidden),
              p + "self_attn.kv_a_layernorm.weight": torch.ones(kv_lora, dtype=bf),
              p + "self_attn.kv_b_proj.weight": r(heads * (nope + v_head), kv_lora),
              p + "self_attn.o_proj.weight": r(hidden, heads * v_head),
              **dense_mlp(p, r, hidden, intermediate, bf)}
    cfg = {"architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "hidden_size": hidden,
           "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": heads, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope,
           "qk_rope_head_dim": rope, "v_head_dim": v_head, "vocab_size": vocab, "rms_norm_eps": 1e-6,
           "mla_use_nope": False, "mla_use_output_gate": False, "num_target_layers": len(target_layer_ids),
           "target_layer_ids": list(target_layer_ids), "target_hidden_size": target_hidden,
           "target_num_hidden_layers": target_num_hidden_layers, "mask_token_id": vocab - 2,
           "markov_rank": markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
           "confidence_head_with_markov": True, "block_size": block_size, "torch_dtype": "bfloat16"}
    cfg.update(config_overrides or {})
    return write_checkpoint(Path(folder), cfg, t)


def v4_stage_tensors(prefix: str, *, hidden: int, experts: int, inter: int, g, last: bool, vocab: int,
                     markov_rank: int, aux: int, hc_head: bool = True) -> dict[str, torch.Tensor]:
    """Tensors of one DeepSeek-V4-style decoder layer at toy size, native V4 names (transformers 5.19
    ``conversion_mapping.py`` deepseek_v4: ``attn.*``, ``ffn.*``, ``attn_norm`` / ``ffn_norm``, ``hc_attn_*`` /
    ``hc_ffn_*``, ``attn.attn_sink``); with ``last`` the DSpark pieces of the last stage in vLLM 0.32's shapes
    (deepseek_v4/nvidia/dspark.py DSparkDeepseekV4Model: ``main_proj`` [H, A*H], ``main_norm``, ``norm``,
    ``hc_head_*`` [4, 4H] / [4] / [1] unless ``hc_head`` is False (V4.1 has none), Markov head [V, r] x 2, bias-less
    confidence head [1, H + r] F32)."""
    r = random_tensors(g, torch.bfloat16)
    bf = torch.bfloat16
    t = {prefix + "attn.wq_a.weight": r(hidden // 2, hidden), prefix + "attn.wq_b.weight": r(hidden, hidden // 2),
         prefix + "attn.wkv.weight": r(hidden // 4, hidden), prefix + "attn.wo_a.weight": r(hidden // 2, hidden),
         prefix + "attn.wo_b.weight": r(hidden, hidden // 2),
         prefix + "attn.attn_sink": torch.zeros(4, dtype=torch.float32),
         prefix + "attn_norm.weight": torch.ones(hidden, dtype=bf),
         prefix + "ffn_norm.weight": torch.ones(hidden, dtype=bf),
         prefix + "ffn.gate.weight": r(experts, hidden), prefix + "ffn.gate.bias": torch.zeros(experts),
         prefix + "hc_attn_fn": r(4, hidden).float(), prefix + "hc_ffn_fn": r(4, hidden).float()}
    for e in range(experts):
        t[prefix + f"ffn.experts.{e}.w1.weight"] = r(inter, hidden)
        t[prefix + f"ffn.experts.{e}.w2.weight"] = r(hidden, inter)
        t[prefix + f"ffn.experts.{e}.w3.weight"] = r(inter, hidden)
    for w, shape in (("w1", (inter, hidden)), ("w2", (hidden, inter)), ("w3", (inter, hidden))):
        t[prefix + f"ffn.shared_experts.{w}.weight"] = r(*shape)
    if last:
        t |= {prefix + "main_proj.weight": r(hidden, aux * hidden),
              prefix + "main_norm.weight": torch.ones(hidden, dtype=bf),
              prefix + "norm.weight": torch.ones(hidden, dtype=bf),
              prefix + "markov_head.markov_w1.weight": r(vocab, markov_rank),
              prefix + "markov_head.markov_w2.weight": r(vocab, markov_rank),
              prefix + "confidence_head.proj.weight": r(1, hidden + markov_rank).float()}
        if hc_head:
            t |= {prefix + "hc_head_fn": r(4, 4 * hidden).float(), prefix + "hc_head_base": torch.zeros(4),
                  prefix + "hc_head_scale": torch.ones(1)}
    return t


def make_v4_target(folder: str | Path, *, hidden: int = 32, layers: int = 4, vocab: int = 128, experts: int = 2,
                   inter: int = 16, dspark_stages: int = 0, dspark_target_layer_ids: tuple[int, ...] = (1, 2, 3),
                   markov_rank: int = 8, layers_per_shard: int = 2, model_type: str = "deepseek_v4",
                   num_nextn_predict_layers: int = 1, seed: int = 10) -> Path:
    """A tiny DeepSeek-V4-style target: native names (``embed.weight``, ``head.weight``, ``layers.{i}.attn.*``),
    sharded ``model-XXXXX-of-YYYYY.safetensors`` + index. With ``dspark_stages`` S > 0 it carries a DSpark drafter
    the way DeepSeek ships it: ``mtp.{0..S-1}.*`` in the last shard(s) and the ``dspark_*`` keys
    (``dspark_target_layer_ids`` in hidden-state numbering for ``deepseek_v4``); ``num_nextn_predict_layers`` stays
    as given (1), as in the real configs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    r = random_tensors(g, torch.bfloat16)
    shards: list[dict[str, torch.Tensor]] = [{"embed.weight": r(vocab, hidden)}]
    for i in range(layers):
        if i % layers_per_shard == 0 and i:
            shards.append({})
        shards[-1] |= v4_stage_tensors(f"layers.{i}.", hidden=hidden, experts=experts, inter=inter, g=g, last=False,
                                       vocab=vocab, markov_rank=markov_rank, aux=0)
    shards.append({"norm.weight": torch.ones(hidden, dtype=torch.bfloat16), "head.weight": r(vocab, hidden),
                   "hc_head_fn": r(4, 4 * hidden).float(), "hc_head_base": torch.zeros(4),
                   "hc_head_scale": torch.ones(1)})
    for s in range(dspark_stages):
        shards.append(v4_stage_tensors(f"mtp.{s}.", hidden=hidden, experts=experts, inter=inter, g=g,
                                       last=s == dspark_stages - 1, vocab=vocab, markov_rank=markov_rank,
                                       aux=len(dspark_target_layer_ids), hc_head=model_type != "deepseek_v41"))
    n = len(shards)
    weight_map = {}
    total = 0
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file({a: b.contiguous() for a, b in tensors.items()}, str(folder / name), metadata={"format": "pt"})
        for a, b in tensors.items():
            weight_map[a] = name
            total += b.numel() * b.element_size()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": model_type, "hidden_size": hidden,
           "num_hidden_layers": layers, "vocab_size": vocab, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 8, "n_routed_experts": experts, "num_experts_per_tok": 1, "moe_intermediate_size": inter,
           "num_nextn_predict_layers": num_nextn_predict_layers, "hc_mult": 4, "tie_word_embeddings": False,
           "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"}
    if dspark_stages:
        cfg.update({"dspark_block_size": 5, "dspark_noise_token_id": vocab - 1,
                    "dspark_target_layer_ids": list(dspark_target_layer_ids), "dspark_markov_rank": markov_rank,
                    "n_mtp_layers": dspark_stages, "enable_confidence_head": True})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {}}}')
    return folder
