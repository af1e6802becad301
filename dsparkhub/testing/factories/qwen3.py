"""Tiny Qwen3 checkpoints with their real names and config keys: the ``Qwen3ForCausalLM`` target and the
Qwen3-backbone drafters of DeepSpec (``run/step_<N>/`` + ``step_latest``, FORMATS §2) and z-lab (DFlash, and
DFlash2-style sliding layers). The drafter factories take the target folder so that frozen copies
(``embed_tokens`` / ``lm_head``) are byte-identical to the target's, exactly as DeepSpec saves them
(``deepspec/trainer/base_trainer.py`` build_models).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from dsparkhub.example.layouts import deepspec_draft_config, link_step_latest
from dsparkhub.testing.factories.common import dense_mlp, random_tensors, write_checkpoint


def make_qwen3_target(folder: str | Path, *, hidden: int = 32, layers: int = 4, vocab: int = 128, heads: int = 4,
                      kv_heads: int = 2, head_dim: int = 8, intermediate: int = 64, dtype=torch.bfloat16,
                      tie: bool = False, seed: int = 0) -> Path:
    """A Qwen3ForCausalLM-shaped target: HF names (``model.embed_tokens.weight``, ``lm_head.weight``, ...)."""
    r = random_tensors(torch.Generator().manual_seed(seed), dtype)
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
              **dense_mlp(p, r, hidden, intermediate, dtype)}
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "intermediate_size": intermediate, "vocab_size": vocab, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
              "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2,
              "dtype": str(dtype).removeprefix("torch.")}
    return write_checkpoint(Path(folder), config, t)


def qwen3_drafter_tensors(config: dict, *, target_layers: int, target_hidden: int, markov_rank: int,
                          confidence: bool, with_markov: bool, dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors of a Qwen3-backbone DSpark / DFlash drafter, vLLM / DeepSpec names (no embed / head)."""
    r = random_tensors(torch.Generator().manual_seed(seed), dtype)
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
              **dense_mlp(p, r, H, inter, dtype)}
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

    The config is :func:`dsparkhub.example.layouts.deepspec_draft_config` of the target's; tensors include the
    frozen embed / lm_head copies; ``train_config.py`` and ``training_state.rank0.pt`` are present as DeepSpec writes
    them.
    ``drop`` removes tensors; ``tensor_overrides`` replaces / adds tensors; ``config_overrides`` edits the config.

    Returns:
        the run folder.
    """
    target = Path(target)
    tcfg = json.loads((target / "config.json").read_text())
    tt = load_file(str(target / "model.safetensors"))
    cfg = deepspec_draft_config(tcfg, num_hidden_layers=layers, target_layer_ids=list(target_layer_ids),
                                block_size=block_size,
                                mask_token_id=tcfg["vocab_size"] - 1 if mask_token_id is None else mask_token_id,
                                markov_rank=markov_rank, confidence=confidence, with_markov=with_markov)
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
    step_dir = write_checkpoint(run / f"step_{step}", cfg, tensors)
    (step_dir / "train_config.py").write_text(f"block_size = {block_size}\nmarkov_rank = {markov_rank}\n")
    torch.save({"optimizer": {}, "next_micro_step": step}, step_dir / "training_state.rank0.pt")
    link_step_latest(step_dir)
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
    return write_checkpoint(Path(folder), cfg, tensors)


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
    return write_checkpoint(Path(folder), cfg, tensors)

