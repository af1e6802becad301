"""Tiny checkpoints with the layouts' *real* tensor names and config keys, for tests and benchmarks.

Every factory writes random weights (seeded) at toy sizes into a folder and returns its path. The drafter factories
take the target folder so that frozen copies (``embed_tokens`` / ``lm_head``) are byte-identical to the target's,
exactly as DeepSpec saves them (``deepspec/trainer/base_trainer.py`` build_models).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _write(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def make_qwen3_target(folder: str | Path, *, hidden: int = 32, layers: int = 4, vocab: int = 128, heads: int = 4,
                      kv_heads: int = 2, head_dim: int = 8, intermediate: int = 64, dtype=torch.bfloat16,
                      tie: bool = False, seed: int = 0) -> Path:
    """A Qwen3ForCausalLM-shaped target: HF names (``model.embed_tokens.weight``, ``lm_head.weight``, ...)."""
    r = _rand(torch.Generator().manual_seed(seed), dtype)
    t = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=dtype)}
    if not tie:
        t["lm_head.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(heads * head_dim, hidden),
              p + "self_attn.k_proj.weight": r(kv_heads * head_dim, hidden),
              p + "self_attn.v_proj.weight": r(kv_heads * head_dim, hidden),
              p + "self_attn.o_proj.weight": r(hidden, heads * head_dim),
              p + "self_attn.q_norm.weight": torch.ones(head_dim, dtype=dtype),
              p + "self_attn.k_norm.weight": torch.ones(head_dim, dtype=dtype),
              **_dense_mlp(p, r, hidden, intermediate, dtype)}
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "intermediate_size": intermediate, "vocab_size": vocab, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
              "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2,
              "dtype": str(dtype).removeprefix("torch.")}
    return _write(Path(folder), config, t)


def qwen3_drafter_tensors(config: dict, *, target_layers: int, target_hidden: int, markov_rank: int,
                          confidence: bool, with_markov: bool, dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors of a Qwen3-backbone DSpark / DFlash drafter, vLLM / DeepSpec names (no embed / head)."""
    r = _rand(torch.Generator().manual_seed(seed), dtype)
    H, V = config["hidden_size"], config["vocab_size"]
    nh, nkv, hd, inter = (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
                          config["intermediate_size"])
    t = {"fc.weight": r(H, target_layers * target_hidden), "hidden_norm.weight": torch.ones(H, dtype=dtype),
         "norm.weight": torch.ones(H, dtype=dtype)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(nh * hd, H), p + "self_attn.k_proj.weight": r(nkv * hd, H),
              p + "self_attn.v_proj.weight": r(nkv * hd, H), p + "self_attn.o_proj.weight": r(H, nh * hd),
              p + "self_attn.q_norm.weight": torch.ones(hd, dtype=dtype),
              p + "self_attn.k_norm.weight": torch.ones(hd, dtype=dtype),
              **_dense_mlp(p, r, H, inter, dtype)}
    if markov_rank:
        t["markov_head.markov_w1.weight"] = r(V, markov_rank)
        t["markov_head.markov_w2.weight"] = r(V, markov_rank)
        if confidence:
            t["confidence_head.proj.weight"] = r(1, H + (markov_rank if with_markov else 0)).float()
            t["confidence_head.proj.bias"] = torch.zeros(1)
    return t


def make_deepspec_drafter(run_dir: str | Path, target: str | Path, *, layers: int = 2,
                          target_layer_ids: tuple[int, ...] = (0, 1, 2), block_size: int = 7, markov_rank: int = 8,
                          confidence: bool = True, with_markov: bool = True, mask_token_id: int | None = None,
                          step: int = 100, seed: int = 1, drop: tuple[str, ...] = (),
                          config_overrides: dict | None = None, tensor_overrides: dict | None = None) -> Path:
    """A DeepSpec run folder ``run_dir/step_<step>/`` + ``step_latest`` for ``target`` (FORMATS §2).

    The config is a copy of the target's with DeepSpec's DSpark keys; tensors include the frozen embed / lm_head
    copies; ``train_config.py`` and ``training_state.rank0.pt`` are present as DeepSpec writes them.
    ``drop`` removes tensors; ``tensor_overrides`` replaces / adds tensors; ``config_overrides`` edits the config.

    Returns:
        the run folder.
    """
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    tt = load_file(str(target / "model.safetensors"))
    cfg = dict(tcfg)
    cfg.update({"architectures": ["Qwen3DSparkModel"], "num_hidden_layers": layers,
                "num_target_layers": tcfg["num_hidden_layers"], "block_size": block_size,
                "mask_token_id": tcfg["vocab_size"] - 1 if mask_token_id is None else mask_token_id,
                "target_layer_ids": list(target_layer_ids), "num_anchors": 512, "tie_word_embeddings": False,
                "layer_types": ["full_attention"] * layers, "_attn_implementation": "flex_attention",
                "enable_confidence_head": confidence})
    if markov_rank:
        cfg.update({"markov_rank": markov_rank, "markov_head_type": "vanilla"})
        if confidence:
            cfg["confidence_head_with_markov"] = with_markov
    cfg.update(config_overrides or {})
    tensors = qwen3_drafter_tensors(cfg, target_layers=len(target_layer_ids), target_hidden=tcfg["hidden_size"],
                                    markov_rank=markov_rank, confidence=confidence, with_markov=with_markov,
                                    dtype=tt["model.embed_tokens.weight"].dtype, seed=seed)
    tensors["embed_tokens.weight"] = tt["model.embed_tokens.weight"].clone()
    tensors["lm_head.weight"] = tt.get("lm_head.weight", tt["model.embed_tokens.weight"]).clone()
    tensors.update(tensor_overrides or {})
    for name in drop:
        tensors.pop(name)
    run = Path(run_dir)
    step_dir = _write(run / f"step_{step}", cfg, tensors)
    (step_dir / "train_config.py").write_text(f"block_size = {block_size}\nmarkov_rank = {markov_rank}\n")
    torch.save({"optimizer": {}, "next_micro_step": step}, step_dir / "training_state.rank0.pt")
    latest = run / "step_latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(step_dir.name)
    return run


def make_zlab_dflash_drafter(folder: str | Path, target: str | Path, *, layers: int = 1,
                             target_layer_ids: tuple[int, ...] = (0, 2), block_size: int = 8, seed: int = 2) -> Path:
    """A z-lab DFlash drafter (``DFlashDraftModel``, ``dflash_config``; no embed / lm_head) for ``target``."""
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    cfg = {k: v for k, v in tcfg.items() if k not in ("architectures", "tie_word_embeddings")}
    cfg.update({"architectures": ["DFlashDraftModel"], "num_hidden_layers": layers,
                "num_target_layers": tcfg["num_hidden_layers"], "block_size": block_size,
                "dflash_config": {"target_layer_ids": list(target_layer_ids),
                                  "mask_token_id": tcfg["vocab_size"] - 1}})
    dtype = getattr(torch, tcfg.get("dtype", "bfloat16"))
    tensors = qwen3_drafter_tensors(cfg, target_layers=len(target_layer_ids), target_hidden=tcfg["hidden_size"],
                                    markov_rank=0, confidence=False, with_markov=False, dtype=dtype, seed=seed)
    return _write(Path(folder), cfg, tensors)


# ---- layouts beyond DeepSpec Qwen3 (helper E) -------------------------------------------------------------------


def _rand(g, dtype):
    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    return r


QWEN3_NORMS = ("input_layernorm", "post_attention_layernorm")
GEMMA4_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")


def _dense_mlp(p: str, r, hidden: int, inter: int, dtype, norms: tuple[str, ...] = QWEN3_NORMS) -> dict:
    """One decoder layer's SwiGLU MLP (``mlp.{gate,up,down}_proj.weight``, random from ``r`` in that order) and its
    RMSNorm weights (ones, [hidden]), under prefix ``p``."""
    return {p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
            p + "mlp.down_proj.weight": r(hidden, inter),
            **{p + n + ".weight": torch.ones(hidden, dtype=dtype) for n in norms}}


def draft_vocab_table(vocab: int, draft_vocab: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A reduced draft vocab as speculators stores it: ``d2t`` int64 [Vd] offsets (target = draft + d2t[draft]),
    ``t2d`` bool [V] (speculators ``DraftVocabMixin``). Draft ids keep the target ids' order."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    d2t = (ids - torch.arange(draft_vocab)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def make_speculators_drafter(folder: str | Path, target: str | Path, *, variant: str = "dspark", layers: int = 1,
                             aux_hidden_state_layer_ids: tuple[int, ...] = (1, 2, 3), block_size: int = 8,
                             markov_rank: int = 8, confidence: bool = True, with_markov: bool = True,
                             draft_vocab: int | None = None, sample_from_anchor: bool | None = True,
                             verifier: str = "org/tiny-target", seed: int = 4,
                             config_overrides: dict | None = None) -> Path:
    """A vllm-project/speculators ``dspark`` / ``dflash`` drafter (FORMATS §3) for ``target``.

    ``transformer_layer_config`` holds the Qwen3 decoder config; ids are **hidden-state indices**
    (``aux_hidden_state_layer_ids``). With ``draft_vocab`` < V: ``lm_head`` [Vd, H] (rows of the target's head),
    ``markov_w2`` [Vd, r], ``d2t`` int64 [Vd], ``t2d`` bool [V]. ``sample_from_anchor=None`` leaves the key out.
    """
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    tt = load_file(str(target / "model.safetensors"))
    V, Ht = tcfg["vocab_size"], tcfg["hidden_size"]
    Vd = draft_vocab or V
    layer_cfg = {k: v for k, v in tcfg.items() if k not in ("architectures", "tie_word_embeddings")}
    layer_cfg["num_hidden_layers"] = layers
    dtype = tt["model.embed_tokens.weight"].dtype
    tensors = qwen3_drafter_tensors(layer_cfg, target_layers=len(aux_hidden_state_layer_ids), target_hidden=Ht,
                                    markov_rank=markov_rank if variant == "dspark" else 0, confidence=confidence,
                                    with_markov=with_markov, dtype=dtype, seed=seed)
    head = tt.get("lm_head.weight", tt["model.embed_tokens.weight"])
    tensors["embed_tokens.weight"] = tt["model.embed_tokens.weight"].clone()
    if Vd < V:
        d2t, t2d = draft_vocab_table(V, Vd, seed)
        tensors["lm_head.weight"] = head[torch.arange(Vd) + d2t].clone()
        tensors["d2t"], tensors["t2d"] = d2t, t2d
        if variant == "dspark":
            tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][:Vd].clone()
    else:
        tensors["lm_head.weight"] = head.clone()
    n_prop = block_size if sample_from_anchor else block_size - 1
    cfg = {"architectures": ["DSparkSpeculator" if variant == "dspark" else "DFlashSpeculator"],
           "speculators_model_type": variant, "speculators_version": "0.9.0",
           "transformer_layer_config": layer_cfg, "draft_vocab_size": Vd, "block_size": block_size,
           "target_hidden_size": Ht, "aux_hidden_state_layer_ids": list(aux_hidden_state_layer_ids),
           "mask_token_id": V - 1,
           "speculators_config": {"algorithm": variant,
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": n_prop}],
                                  "default_proposal_method": "greedy",
                                  "verifier": {"name_or_path": verifier, "architectures": tcfg["architectures"]}}}
    if sample_from_anchor is not None:
        cfg["sample_from_anchor"] = sample_from_anchor
    if variant == "dspark":
        cfg.update({"markov_rank": markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": confidence,
                    "confidence_head_with_markov": with_markov})
    cfg.update(config_overrides or {})
    return _write(Path(folder), cfg, tensors)


def make_eagle3_drafter(folder: str | Path, target: str | Path, *, aux_hidden_state_layer_ids=(1, 2, 3),
                        draft_vocab: int | None = 64, speculative_tokens: int = 3, seed: int = 5) -> Path:
    """A speculators EAGLE-3 drafter: one layer whose q/k/v read 2H, ``layers.0.hidden_norm``, fc [H, 3Ht],
    reduced draft vocab (``lm_head`` [Vd, H], ``d2t``, ``t2d``); ids in hidden-state numbering."""
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    tt = load_file(str(target / "model.safetensors"))
    V, H = tcfg["vocab_size"], tcfg["hidden_size"]
    nh, nkv, hd, inter = (tcfg["num_attention_heads"], tcfg["num_key_value_heads"], tcfg["head_dim"],
                          tcfg["intermediate_size"])
    Vd = draft_vocab or V
    dtype = tt["model.embed_tokens.weight"].dtype
    r = _rand(torch.Generator().manual_seed(seed), dtype)
    p = "layers.0."
    t = {"embed_tokens.weight": tt["model.embed_tokens.weight"].clone(),
         "fc.weight": r(H, len(aux_hidden_state_layer_ids) * H), "norm.weight": torch.ones(H, dtype=dtype),
         p + "self_attn.q_proj.weight": r(nh * hd, 2 * H), p + "self_attn.k_proj.weight": r(nkv * hd, 2 * H),
         p + "self_attn.v_proj.weight": r(nkv * hd, 2 * H), p + "self_attn.o_proj.weight": r(H, nh * hd),
         **_dense_mlp(p, r, H, inter, dtype), p + "hidden_norm.weight": torch.ones(H, dtype=dtype),
         "lm_head.weight": r(Vd, H)}
    if Vd < V:
        t["d2t"], t["t2d"] = draft_vocab_table(V, Vd, seed)
    layer_cfg = {k: v for k, v in tcfg.items() if k not in ("architectures", "tie_word_embeddings")}
    layer_cfg["num_hidden_layers"] = 1
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
           "transformer_layer_config": layer_cfg, "draft_vocab_size": Vd, "target_hidden_size": H,
           "eagle_aux_hidden_state_layer_ids": list(aux_hidden_state_layer_ids), "norm_before_residual": True,
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
               {"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
               "default_proposal_method": "greedy",
               "verifier": {"name_or_path": "org/tiny-target", "architectures": tcfg["architectures"]}}}
    return _write(Path(folder), cfg, t)


def make_zlab_dflash2_drafter(folder: str | Path, target: str | Path, *, layers: int = 3,
                              target_layer_ids: tuple[int, ...] = (0, 2), block_size: int = 16,
                              sliding_window: int = 64, seed: int = 6) -> Path:
    """A z-lab DFlash2-style drafter: ``DFlashDraftModel`` whose ``layer_types`` mix ``sliding_attention`` and
    ``full_attention`` (``sliding_window``, ``dflash_config.use_swa``), ``block_size`` inside ``dflash_config``."""
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    cfg = {k: v for k, v in tcfg.items() if k not in ("architectures", "tie_word_embeddings")}
    cfg.update({"architectures": ["DFlashDraftModel"], "num_hidden_layers": layers,
                "num_target_layers": tcfg["num_hidden_layers"], "sliding_window": sliding_window,
                "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"],
                "dflash_config": {"target_layer_ids": list(target_layer_ids), "mask_token_id": tcfg["vocab_size"] - 1,
                                  "block_size": block_size, "use_swa": True}})
    dtype = getattr(torch, tcfg.get("dtype", "bfloat16"))
    tensors = qwen3_drafter_tensors(cfg, target_layers=len(target_layer_ids), target_hidden=tcfg["hidden_size"],
                                    markov_rank=0, confidence=False, with_markov=False, dtype=dtype, seed=seed)
    return _write(Path(folder), cfg, tensors)


def make_gemma4_target(folder: str | Path, *, hidden: int = 32, layers: int = 4, vocab: int = 128, heads: int = 4,
                       kv_heads: int = 2, head_dim: int = 8, intermediate: int = 64, dtype=torch.bfloat16,
                       seed: int = 7) -> Path:
    """A tiny Gemma4 text target (``Gemma4ForConditionalGeneration`` naming, ``text_config``), tied embeddings."""
    r = _rand(torch.Generator().manual_seed(seed), dtype)
    pre = "model.language_model."
    t = {pre + "embed_tokens.weight": r(vocab, hidden), pre + "norm.weight": torch.ones(hidden, dtype=dtype)}
    for i in range(layers):
        p = f"{pre}layers.{i}."
        t |= {p + "self_attn.q_proj.weight": r(heads * head_dim, hidden),
              p + "self_attn.k_proj.weight": r(kv_heads * head_dim, hidden),
              p + "self_attn.o_proj.weight": r(hidden, heads * head_dim),
              p + "self_attn.q_norm.weight": torch.ones(head_dim, dtype=dtype),
              p + "self_attn.k_norm.weight": torch.ones(head_dim, dtype=dtype),
              **_dense_mlp(p, r, hidden, intermediate, dtype, GEMMA4_NORMS)}
    text = {"model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_global_key_value_heads": kv_heads,
            "head_dim": head_dim, "global_head_dim": head_dim, "intermediate_size": intermediate,
            "vocab_size": vocab, "rms_norm_eps": 1e-6, "attention_k_eq_v": True,
            "layer_types": ["full_attention"] * layers, "final_logit_softcapping": 30.0,
            "max_position_embeddings": 4096, "tie_word_embeddings": True}
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
              "tie_word_embeddings": True, "dtype": str(dtype).removeprefix("torch.")}
    return _write(Path(folder), config, t)


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
    r = _rand(torch.Generator().manual_seed(seed), emb.dtype)
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
              **_dense_mlp(p, r, H, inter, emb.dtype, GEMMA4_NORMS)}
    cfg = dict(text)
    cfg.update({"architectures": ["Gemma4DSparkModel"], "num_hidden_layers": layers,
                "num_target_layers": text["num_hidden_layers"], "block_size": block_size, "mask_token_id": 4,
                "target_layer_ids": list(target_layer_ids), "markov_rank": markov_rank,
                "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True,
                "tie_word_embeddings": False, "layer_types": ["full_attention"] * layers,
                "target_model_type": tcfg["model_type"], "target_text_model_type": text["model_type"],
                "num_anchors": 512, "_attn_implementation": "flex_attention"})
    return _write(Path(folder), cfg, t)


def make_k3_dspark_drafter(folder: str | Path, *, hidden: int = 32, layers: int = 2, vocab: int = 128,
                           heads: int = 4, q_lora: int = 16, kv_lora: int = 8, nope: int = 8, rope: int = 4,
                           v_head: int = 8, intermediate: int = 64, target_hidden: int = 32,
                           target_num_hidden_layers: int = 8, target_layer_ids: tuple[int, ...] = (1, 3, 5),
                           block_size: int = 8, markov_rank: int = 8, seed: int = 9,
                           config_overrides: dict | None = None, embed: torch.Tensor | None = None) -> Path:
    """A Kimi K3 MLA DSpark drafter (``K3DSparkModel``, ``model_type k3_dspark``; FORMATS §5) at toy size:
    ``context_proj`` [H, A*Ht], ``context_norm``, ``final_norm``, MLA projections, Markov / confidence heads, a copy
    of the target embedding (``embed`` or random) and no ``lm_head``."""
    r = _rand(torch.Generator().manual_seed(seed), torch.bfloat16)
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
              **_dense_mlp(p, r, hidden, intermediate, bf)}
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
    return _write(Path(folder), cfg, t)


def v4_stage_tensors(prefix: str, *, hidden: int, experts: int, inter: int, g, last: bool, vocab: int,
                     markov_rank: int, aux: int, hc_head: bool = True) -> dict[str, torch.Tensor]:
    """Tensors of one DeepSeek-V4-style decoder layer at toy size, native V4 names (transformers 5.19
    ``conversion_mapping.py`` deepseek_v4: ``attn.*``, ``ffn.*``, ``attn_norm`` / ``ffn_norm``, ``hc_attn_*`` /
    ``hc_ffn_*``, ``attn.attn_sink``); with ``last`` the DSpark pieces of the last stage in vLLM 0.32's shapes
    (deepseek_v4/nvidia/dspark.py DSparkDeepseekV4Model: ``main_proj`` [H, A*H], ``main_norm``, ``norm``,
    ``hc_head_*`` [4, 4H] / [4] / [1] unless ``hc_head`` is False (V4.1 has none), Markov head [V, r] x 2, bias-less
    confidence head [1, H + r] F32)."""
    r = _rand(g, torch.bfloat16)
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
    r = _rand(g, torch.bfloat16)
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
