"""Tiny vllm-project/speculators drafters (FORMATS §3): DSpark / DFlash speculators (``transformer_layer_config``,
hidden-state-index ids, optional reduced draft vocab) and EAGLE-3, for a Qwen3 target of
:func:`dsparkhub.testing.factories.qwen3.make_qwen3_target`. Same conventions as :mod:`dsparkhub.testing.factories.qwen3`
(seeded random weights, the target's embedding / head copied); nothing here reads a layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from dsparkhub.testing.factories.common import dense_mlp, random_tensors, write_checkpoint
from dsparkhub.testing.factories.qwen3 import qwen3_drafter_tensors


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
    return write_checkpoint(Path(folder), cfg, tensors)


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
    r = random_tensors(torch.Generator().manual_seed(seed), dtype)
    p = "layers.0."
    t = {"embed_tokens.weight": tt["model.embed_tokens.weight"].clone(),
         "fc.weight": r(H, len(aux_hidden_state_layer_ids) * H), "norm.weight": torch.ones(H, dtype=dtype),
         p + "self_attn.q_proj.weight": r(nh * hd, 2 * H), p + "self_attn.k_proj.weight": r(nkv * hd, 2 * H),
         p + "self_attn.v_proj.weight": r(nkv * hd, 2 * H), p + "self_attn.o_proj.weight": r(H, nh * hd),
         **dense_mlp(p, r, H, inter, dtype), p + "hidden_norm.weight": torch.ones(H, dtype=dtype),
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
    return write_checkpoint(Path(folder), cfg, t)

