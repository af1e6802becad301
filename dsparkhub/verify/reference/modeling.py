"""A DSpark / DFlash drafter as a plain PyTorch module, and a loader for the layouts dsparkhub reads.

This module owns the *numerics* of a Qwen3-style parallel drafter: the DFlash backbone (context projection ``fc`` +
``hidden_norm`` over concatenated target hidden states, non-causal attention of a query block over cached context K/V),
the DSpark low-rank Markov head and the confidence head. Parameter names are exactly the ones DeepSpec saves and vLLM
0.32 ``qwen3_dspark.py`` / ``qwen3_dflash.py`` load (no ``model.`` prefix), so ``Drafter.state_dict()`` *is* a
checkpoint.

Semantics follow vLLM 0.32 (the engine whose τ the reference engine predicts):

- context states = ``hidden_norm(fc(concat(h[id + 1] for id in target_layer_ids)))``; every draft layer projects
  them with its own ``k_proj`` / ``v_proj`` (no ``input_layernorm``), ``k_norm``, RoPE at the context positions
  (``qwen3_dflash.py``, ``precompute_and_store_context_kv``; DeepSpec ``Qwen3DSparkAttention``).
- the query block ``[anchor, mask, ...]`` sits at positions ``p, p + 1, ...`` right after the last context position;
  each draft layer attends over context + block with its own (sliding window, causal) pair, resolved from the config
  exactly as vLLM 0.32 ``qwen3_dflash.py`` ``_resolve_layer_attention`` / ``_dflash_layer_causal`` (lines 86-180)
  do it, masked as vLLM's FlashAttention backend masks it (:func:`attention_mask`). Default: full, non-causal.
- block layout: anchor-first (DSpark, ``sample_from_anchor`` true: slot i predicts position p + i + 1, n queries) or
  1+N fill-in (DFlash, slots 1..n predict their own positions) — ``v1/worker/gpu/spec_decode/dspark/speculator.py``.
- Markov bias ``markov_w2(markov_w1[prev])`` is added position by position, ``prev`` being the token chosen at the
  previous slot (the anchor for the first one), in target vocab; base and bias logits are both scaled by
  ``logit_scale`` (vLLM ``LogitsProcessor``).
- confidence = ``sigmoid(proj([h ; markov_w1[prev]]))`` (or ``[h]`` when ``confidence_head_with_markov`` is false).

What it deliberately does not do: attention-sink bias, interleaved (non-neox) RoPE, non-default RoPE scaling,
Gemma4 / K3 / DeepSeek-V4 drafters (they raise :class:`~dsparkhub.errors.LayoutError`), speculators-format folders
(convert them first), and anything about decoding policy — that is ``dsparkhub.verify.reference.engine``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
import torch
import torch.nn.functional as F
from torch import nn

from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    IncompatibleTargetError,
    LayoutError,
    UnsafeCheckpointError,
)

__all__ = [
    "DrafterConfig",
    "Drafter",
    "load_drafter",
    "resolve_target_layer_ids",
    "resolve_mask_token_id",
    "drafter_config_from_dict",
    "target_features",
    "ContextCache",
    "LayerAttention",
    "attention_mask",
    "resolve_layer_attention",
]

DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")
DFLASH_ARCHITECTURES = ("DFlashDraftModel",)


# ---- configuration --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerAttention:
    """How one draft layer's query block attends over [context ; block].

    Attributes:
        sliding_window: w, or None for full attention. A query at position p sees keys at positions
            ``p - w + 1 .. p`` (causal) or ``p - w + 1 .. p + w - 1`` (non-causal): vLLM 0.32 turns w into the
            FlashAttention window ``(w - 1, 0)`` (``v1/attention/backends/flash_attn.py:1077-1082``) and makes it
            symmetric for non-causal attention (``_maybe_symmetrize_window``, same file, 581-592).
        causal: the query at position p sees no key after p (block slots after it included).
    """

    sliding_window: int | None = None
    causal: bool = False


@dataclass(frozen=True)
class DrafterConfig:
    """Everything the drafter's numerics depend on, resolved from a checkpoint config.

    Attributes:
        kind: ``"dspark"`` (Markov head, optional confidence head) or ``"dflash"`` (backbone only).
        hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
        rms_norm_eps, rope_theta, hidden_act: Qwen3 decoder geometry of the drafter.
        vocab_size: input vocab V (embedding, ``markov_w1``).
        draft_vocab_size: output vocab Vd (``lm_head``, ``markov_w2``); Vd < V needs ``d2t``.
        target_hidden_size: Ht, width of each target feature; ``fc`` is [H, A·Ht].
        target_layer_ids: target layers feeding the drafter, **layer-index numbering** (feature = HF
            ``hidden_states[id + 1]``; -1 = embedding output).
        mask_token_id: id fed at the masked slots of a block.
        block_size: trained block size (None if the config has none); only a default for ``num_speculative_tokens``.
        sample_from_anchor: True = anchor-first (n queries), False = 1+N fill-in (n + 1 queries).
        markov_rank: r, 0 for none.
        enable_confidence_head, confidence_head_with_markov: confidence head presence and input.
        logit_scale: multiplies base and Markov logits (vLLM ``LogitsProcessor`` scale).
    """

    kind: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int | None
    sample_from_anchor: bool
    markov_rank: int = 0
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    hidden_act: str = "silu"
    logit_scale: float = 1.0
    attention_bias: bool = False
    layer_attention: tuple[LayerAttention, ...] = ()
    value_scale: float | None = None

    @property
    def num_context_features(self) -> int:
        """A, the number of target layers concatenated into ``fc``'s input."""
        return len(self.target_layer_ids)

    def attention_of(self, layer: int) -> LayerAttention:
        """Draft layer ``layer``'s attention mode (full and non-causal when ``layer_attention`` is empty)."""
        return self.layer_attention[layer] if self.layer_attention else LayerAttention()


def resolve_target_layer_ids(cfg: dict, *, path: str | Path | None = None) -> tuple[int, ...]:
    """Target layer ids in **layer-index numbering**, with vLLM 0.32's precedence.

    vLLM ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` (``get_eagle3_aux_layers_from_config``) reads, first found
    wins: ``eagle_aux_hidden_state_layer_ids`` (hidden-state index), ``dflash_config.target_layer_ids`` (layer index),
    ``dspark_target_layer_ids`` (layer index for dense models), ``target_layer_ids`` (layer index),
    ``dflash_config.layer_ids`` / ``eagle_config.layer_ids`` (hidden-state index). Hidden-state indices are converted
    by subtracting 1.

    Raises:
        LayoutError: no key is present, or the value is not a non-empty list of ints.
    """

    def _ints(value, key):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
            raise LayoutError(f"config key `{key}` must be a list of ints, found {value!r}", path=path)
        return tuple(int(v) for v in value)

    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(i - 1 for i in _ints(cfg["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids"))
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    if dflash.get("target_layer_ids"):
        return _ints(dflash["target_layer_ids"], "dflash_config.target_layer_ids")
    if cfg.get("dspark_target_layer_ids"):
        return _ints(cfg["dspark_target_layer_ids"], "dspark_target_layer_ids")
    if cfg.get("target_layer_ids"):
        return _ints(cfg["target_layer_ids"], "target_layer_ids")
    for name in ("dflash_config", "eagle_config"):
        sub = cfg.get(name)
        if isinstance(sub, dict) and sub.get("layer_ids"):
            return tuple(i - 1 for i in _ints(sub["layer_ids"], f"{name}.layer_ids"))
    raise LayoutError(
        "drafter config names no target layers: expected one of `eagle_aux_hidden_state_layer_ids`, "
        "`dflash_config.target_layer_ids`, `dspark_target_layer_ids`, `target_layer_ids`", path=path,
        hint="add `target_layer_ids` (layer-index numbering) to config.json")


def resolve_mask_token_id(cfg: dict, *, path: str | Path | None = None) -> int:
    """The mask (noise) token id, first found wins as in vLLM 0.32 ``v1/worker/gpu/spec_decode/utils.py``.

    Order: ``dflash_config.mask_token_id``, ``mask_token_id``, ``dspark_noise_token_id``, ``pard_token``,
    ``ptd_token_id``.

    Raises:
        LayoutError: none of the keys is present.
    """
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    if "mask_token_id" in dflash:
        return int(dflash["mask_token_id"])
    if cfg.get("mask_token_id") is not None:
        return int(cfg["mask_token_id"])
    for key in ("dspark_noise_token_id", "pard_token", "ptd_token_id"):
        if key in cfg:
            return int(cfg[key])
    raise LayoutError("drafter config has no mask token: expected `dflash_config.mask_token_id`, `mask_token_id`, "
                      "`dspark_noise_token_id`, `pard_token` or `ptd_token_id`", path=path)


def _rope_theta(cfg: dict, path) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if rope_type not in ("default", None):
        raise LayoutError(f"RoPE type {rope_type!r} is not supported by the reference drafter (only 'default')",
                          path=path)
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is None:
        theta = cfg.get("rope_theta", 1_000_000.0)  # vLLM set_default_rope_theta(default_theta=1e6)
    return float(theta)


_SLIDING = "sliding_attention"


def resolve_layer_attention(cfg: dict, *, path: str | Path | None = None) -> tuple[LayerAttention, ...]:
    """Per-layer (sliding window, causal) of a Qwen3 DSpark / DFlash drafter, resolved as vLLM 0.32 resolves it.

    vLLM reads the drafter config through transformers' ``Qwen3Config``, which drops ``sliding_window`` unless
    ``use_sliding_window`` is true and fills ``layer_types`` (sliding from ``max_window_layers`` on) when absent
    (transformers ``models/qwen3/configuration_qwen3.py:87-95``); then ``qwen3_dflash.py`` decides per layer:

    - sliding: ``layer_types[i] == "sliding_attention"``; ``dflash_config.use_swa`` makes every layer sliding when
      no layer is (``_resolve_layer_attention``, lines 145-167). Window: ``dflash_config.swa_window_size``, else
      the (transformers-filtered) ``sliding_window`` (lines 169-178).
    - causal: ``is_causal`` if set, else ``dflash_config.causal`` if set, else "this layer is sliding" per
      ``layer_types`` (``_dflash_layer_causal``, lines 86-97). So speculators' default drafters (every layer
      ``sliding_attention``) are causal unless the config says ``is_causal: false`` (their
      ``sliding_window_non_causal``, carried by ``dsparkhub convert``).

    Mixed sliding / full layers are resolved too (vLLM's V2 model runner serves them; V1 refuses, line 152).

    Args:
        cfg: the drafter's ``config.json`` dict.
        path: the config file, for error messages.

    Returns:
        One :class:`LayerAttention` per draft layer.

    Raises:
        LayoutError: a sliding layer without a window size, a window that is not a positive int, or an attention
            sink bias (``dflash_config.attention_sink_bias`` / ``add_swa_attention_sink_bias``), which the
            reference drafter does not implement.
    """
    from transformers import Qwen3Config

    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    if dflash.get("attention_sink_bias", cfg.get("add_swa_attention_sink_bias", False)):
        raise LayoutError("attention-sink bias draft layers (dflash_config.attention_sink_bias) are not supported "
                          "by the reference drafter", path=path, hint="measure this drafter with --backend vllm")
    keys = {k: cfg[k] for k in ("num_hidden_layers", "use_sliding_window", "sliding_window", "max_window_layers",
                                "layer_types") if k in cfg}
    from huggingface_hub.errors import StrictDataclassError

    try:
        hf = Qwen3Config(**keys)  # transformers' own defaults and filtering, as vLLM sees the config
    except (ValueError, TypeError, StrictDataclassError) as exc:  # transformers validates configs with these
        raise LayoutError(f"draft attention keys {sorted(keys)} are not a valid Qwen3 config: {exc}",
                          path=path) from exc
    layer_types = list(hf.layer_types or [])
    if len(layer_types) != cfg["num_hidden_layers"]:
        raise LayoutError(f"layer_types has {len(layer_types)} entries, expected num_hidden_layers = "
                          f"{cfg['num_hidden_layers']}", path=path)
    any_sliding = any(t == _SLIDING for t in layer_types)
    use_swa = bool(dflash.get("use_swa", False))
    window = dflash.get("swa_window_size", hf.sliding_window)
    out = []
    for i, layer_type in enumerate(layer_types):
        sliding = use_swa if (use_swa and not any_sliding) else layer_type == _SLIDING
        if cfg.get("is_causal") is not None:
            causal = bool(cfg["is_causal"])
        elif dflash.get("causal") is not None:
            causal = bool(dflash["causal"])
        else:
            causal = layer_type == _SLIDING
        if sliding and window is None:
            raise LayoutError(
                f"draft layer {i} is sliding_attention but no window size is set: vLLM 0.32 reads "
                "dflash_config.swa_window_size, else sliding_window (which transformers' Qwen3Config keeps only "
                "with use_sliding_window: true)", path=path,
                hint="set use_sliding_window: true next to sliding_window in config.json")
        if sliding and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise LayoutError(f"sliding window must be a positive int, found {window!r}", path=path)
        out.append(LayerAttention(sliding_window=int(window) if sliding else None, causal=causal))
    return tuple(out)


def drafter_config_from_dict(cfg: dict, *, path: str | Path | None = None) -> DrafterConfig:
    """Resolve a drafter ``config.json`` dict into a :class:`DrafterConfig`.

    Kind: ``DFlashDraftModel`` -> dflash (1+N; vLLM's DFlash refuses ``sample_from_anchor``); ``Qwen3DSparkModel`` /
    ``Qwen3OmniDSparkModel`` / ``DSparkDraftModel`` with ``model_type: qwen3`` -> dspark, ``sample_from_anchor``
    default True (vLLM ``dspark/speculator.py``).

    Raises:
        LayoutError: unknown architecture, a missing required key, or a draft-attention option the reference
            drafter does not implement (attention sinks, interleaved RoPE; see :func:`resolve_layer_attention`).
    """
    archs = cfg.get("architectures") or []
    if any(a in DFLASH_ARCHITECTURES for a in archs):
        kind = "dflash"
    elif any(a in DSPARK_ARCHITECTURES for a in archs) or ("DSparkDraftModel" in archs
                                                           and cfg.get("model_type") == "qwen3"):
        kind = "dspark"
    else:
        raise LayoutError(f"architectures {archs!r} is not a Qwen3 DSpark or DFlash drafter", path=path,
                          hint="expected Qwen3DSparkModel or DFlashDraftModel; convert other layouts first")
    if "speculators_config" in cfg:
        raise LayoutError("speculators-format config; the reference engine reads vLLM-layout drafters", path=path,
                          hint="run `dsparkhub convert` first")
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    if not cfg.get("is_neox_style", True):
        raise LayoutError("is_neox_style: false (interleaved RoPE) is not supported by the reference drafter",
                          path=path)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(cfg.get(key), int):
            raise LayoutError(f"config key `{key}` missing or not an int (found {cfg.get(key)!r})", path=path)
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    markov_rank = int(cfg.get("markov_rank") or 0) if kind == "dspark" else 0
    if kind == "dspark" and "markov_rank" not in cfg:
        raise LayoutError("DSpark config lacks `markov_rank` (vLLM 0.32 reads it unconditionally)", path=path)
    sample_from_anchor = bool(cfg.get("sample_from_anchor", True)) if kind == "dspark" else False
    if kind == "dflash" and dflash.get("sample_from_anchor", False):
        raise LayoutError("dflash_config.sample_from_anchor=true is not supported for DFlash (vLLM refuses it)",
                          path=path)
    layer_attention = resolve_layer_attention(cfg, path=path)
    value_scale = dflash.get("attention_value_scale")
    block_size = cfg.get("block_size", cfg.get("dspark_block_size", dflash.get("block_size")))
    enable_conf = bool(cfg.get("enable_confidence_head", False)) if kind == "dspark" else False
    return DrafterConfig(
        kind=kind,
        hidden_size=hidden,
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
        target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
        target_layer_ids=resolve_target_layer_ids(cfg, path=path),
        mask_token_id=resolve_mask_token_id(cfg, path=path),
        block_size=int(block_size) if block_size is not None else None,
        sample_from_anchor=sample_from_anchor,
        markov_rank=markov_rank,
        enable_confidence_head=enable_conf,
        confidence_head_with_markov=bool(cfg.get("confidence_head_with_markov", False)) and enable_conf,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, path),
        hidden_act=str(cfg.get("hidden_act", "silu")),
        logit_scale=float(cfg.get("logit_scale", 1.0)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        layer_attention=layer_attention,
        value_scale=float(value_scale) if value_scale is not None else None,
    )


# ---- modules --------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm (computed in float32, weight applied in the input dtype), parameter ``weight`` [D]."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rope:
    """Neox-style rotary embedding (Qwen3 / vLLM ``is_neox_style`` default), cos/sin computed on demand."""

    def __init__(self, head_dim: int, theta: float):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` [..., T] int64 -> cos, sin [..., T, hd] in ``dtype``."""
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` [B, heads, T, hd]; cos/sin [B, T, hd]."""
        return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def attention_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                   mode: LayerAttention) -> torch.Tensor | None:
    """Which keys each block query may see under ``mode``, as vLLM 0.32's FlashAttention backend masks them.

    Positions stand in for FlashAttention's bottom-right-aligned indices: vLLM's draft KV cache holds the context at
    positions ``0 .. p - 1`` and the block at ``p ..``, so index and position agree. Causal: key position <= query
    position. Sliding window w: key position >= query position - (w - 1), and for non-causal layers also <= query
    position + (w - 1) (``flash_attn.py:1077-1082`` window ``(w - 1, 0)``, made symmetric by
    ``_maybe_symmetrize_window``, lines 581-592).

    Args:
        query_positions: [B, Q] int64 positions of the block slots.
        key_positions: [B, K] int64 positions of the keys (context then block).
        mode: the layer's :class:`LayerAttention`.

    Returns:
        bool [B, 1, Q, K] (True = attend), or None when every query sees every key (full, non-causal).
    """
    if mode.sliding_window is None and not mode.causal:
        return None
    delta = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)  # [B, Q, K]: how far back the key is
    allowed = torch.ones_like(delta, dtype=torch.bool)
    if mode.causal:
        allowed &= delta >= 0
    if mode.sliding_window is not None:
        allowed &= delta <= mode.sliding_window - 1
        if not mode.causal:
            allowed &= delta >= -(mode.sliding_window - 1)
    return allowed.unsqueeze(1)


class Attention(nn.Module):
    """DFlash attention: Q from the block, K/V from [context states ; block hidden], masked per
    :func:`attention_mask` (full and non-causal by default)."""

    def __init__(self, cfg: DrafterConfig, layer: int = 0):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.mode = cfg.attention_of(layer)
        self.value_scale = cfg.value_scale
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of ``x`` [B, T, H] -> two [B, nkv, T, hd].

        V is multiplied by ``dflash_config.attention_value_scale`` when set, for context and block alike (vLLM 0.32
        ``qwen3_dflash.py`` ``forward`` and ``precompute_and_store_context_kv``).
        """
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.value_scale is not None:
            v = v * self.value_scale
        return Rope.apply(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        """``x`` [B, Q, H] block hidden; ctx_k/ctx_v [B, nkv, T, hd]; mask None or bool [B, 1, Q, T + Q]."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        q = Rope.apply(q, cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)
        v = torch.cat([ctx_v, v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """Qwen3 gated MLP: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        if cfg.hidden_act != "silu":
            raise LayoutError(f"hidden_act {cfg.hidden_act!r} is not supported by the reference drafter (silu)")

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer whose attention also reads the context K/V."""

    def __init__(self, cfg: DrafterConfig, layer: int = 0):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Vanilla low-rank Markov head: ``markov_w1`` [V, r] (embedding of the previous token, target vocab) and
    ``markov_w2`` [Vd, r] (bias projection to the draft vocab). DeepSpec ``markov_head.py`` / vLLM ``DSparkMarkovHead``."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)


class ConfidenceHead(nn.Module):
    """``proj``: Linear(H (+ r), 1) with bias; returns the logit, the caller applies the sigmoid."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)


@dataclass
class ContextCache:
    """The drafter's cached context K/V, one (K, V) pair of [B, nkv, T, hd] per draft layer (post norm + RoPE), and
    the positions they were computed at (what sliding-window and causal masks compare against).

    Mirrors the context part of vLLM's draft KV cache: appended after every verify step, cropped implicitly because
    only accepted positions are ever appended (the query block is never cached).
    """

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None  # [B, T] int64 context positions (None: 0 .. T - 1)

    @property
    def length(self) -> int:
        """Number of cached context positions."""
        return self.keys[0].shape[2] if self.keys else 0


class Drafter(nn.Module):
    """A Qwen3 DSpark / DFlash drafter whose ``state_dict`` names are DeepSpec / vLLM checkpoint names.

    Args:
        config: the resolved :class:`DrafterConfig`.

    Parameters (no ``model.`` prefix): ``layers.{i}.*``, ``fc.weight`` [H, A·Ht], ``hidden_norm.weight`` [H],
    ``norm.weight`` [H], ``embed_tokens.weight`` [V, H], ``lm_head.weight`` [Vd, H], and for DSpark
    ``markov_head.markov_w1.weight`` [V, r], ``markov_head.markov_w2.weight`` [Vd, r],
    ``confidence_head.proj.weight`` [1, H (+r)] / ``.bias`` [1]; buffer ``d2t`` int64 [Vd] when Vd < V.
    """

    def __init__(self, config: DrafterConfig):
        super().__init__()
        cfg = self.config = config
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(cfg.num_context_features * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.markov_head = (MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank)
                            if cfg.markov_rank > 0 else None)
        self.confidence_head = None
        if cfg.enable_confidence_head:
            dim = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
            self.confidence_head = ConfidenceHead(dim)
        if cfg.draft_vocab_size < cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        else:
            self.d2t = None
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)

    # -- backbone ----------------------------------------------------------------------------------------------

    def context_states(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` [B, T, A·Ht] (concatenated target hidden states) -> context states [B, T, H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextCache:
        """Per-layer context K/V of ``features`` [B, T, A·Ht] at ``positions`` [B, T] (int64)."""
        states = self.context_states(features)
        cos, sin = self.rope.cos_sin(positions, states.dtype)
        cache = ContextCache(positions=positions.expand(states.shape[0], -1))
        for layer in self.layers:
            k, v = layer.self_attn.kv(states, cos, sin)
            cache.keys.append(k)
            cache.values.append(v)
        return cache

    def extend_context(self, cache: ContextCache, features: torch.Tensor, positions: torch.Tensor) -> ContextCache:
        """Append the context K/V of new positions to ``cache`` (in place) and return it."""
        new = self.context_kv(features, positions)
        if not cache.keys:
            cache.keys, cache.values, cache.positions = new.keys, new.values, new.positions
        else:
            old = cache.positions if cache.positions is not None else self._default_positions(cache)
            cache.keys = [torch.cat([a, b], dim=2) for a, b in zip(cache.keys, new.keys)]
            cache.values = [torch.cat([a, b], dim=2) for a, b in zip(cache.values, new.values)]
            cache.positions = torch.cat([old.expand(new.positions.shape[0], -1), new.positions], dim=1)
        return cache

    @staticmethod
    def _default_positions(cache: ContextCache) -> torch.Tensor:
        """``0 .. T - 1`` per batch row, for a cache built without positions."""
        keys = cache.keys[0]
        return torch.arange(keys.shape[2], device=keys.device).unsqueeze(0).expand(keys.shape[0], -1)

    def backbone(self, block_ids: torch.Tensor, positions: torch.Tensor, cache: ContextCache,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the query block through the draft layers.

        Args:
            block_ids: [B, Q] int64 token ids (anchor and mask tokens).
            positions: [B, Q] int64 absolute positions of the block slots.
            cache: context K/V (``ContextCache``) over T positions.
            mask: None, or bool [B, 1, Q, T + Q] (True = attend) for training-style blocks; it is combined (AND)
                with each layer's own :func:`attention_mask` (sliding window, causal).

        Returns:
            [B, Q, H] final-normed hidden states.
        """
        x = self.embed_tokens(block_ids)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        key_positions = None
        for layer, k, v in zip(self.layers, cache.keys, cache.values):
            layer_mask = mask
            mode = layer.self_attn.mode
            if mode.sliding_window is not None or mode.causal:
                if key_positions is None:
                    ctx = cache.positions if cache.positions is not None else self._default_positions(cache)
                    key_positions = torch.cat([ctx.expand(positions.shape[0], -1), positions], dim=1)
                own = attention_mask(positions, key_positions, mode)
                layer_mask = own if mask is None else own & mask
            x = layer(x, cos, sin, k, v, layer_mask)
        return self.norm(x)

    # -- heads -------------------------------------------------------------------------------------------------

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits ``logit_scale · lm_head(hidden)``: [..., H] -> [..., Vd]."""
        logits = self.lm_head(hidden)
        return logits * self.config.logit_scale if self.config.logit_scale != 1.0 else logits

    def markov_embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """``markov_w1[prev_ids]``: [...] target-vocab ids -> [..., r]."""
        return self.markov_head.markov_w1(prev_ids)

    def markov_bias(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """Transition bias ``logit_scale · markov_w2(markov_w1[prev])``: [...] -> [..., Vd] (zeros without a head)."""
        if self.markov_head is None:
            raise LayoutError("this drafter has no Markov head")
        bias = self.markov_head.markov_w2(self.markov_embed(prev_ids))
        return bias * self.config.logit_scale if self.config.logit_scale != 1.0 else bias

    def confidence_logit(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Confidence-head logit [...] from ``hidden`` [..., H] and the previous token ids [...] (float32)."""
        x = hidden
        if self.config.confidence_head_with_markov:
            x = torch.cat([hidden, self.markov_embed(prev_ids).to(hidden.dtype)], dim=-1)
        return self.confidence_head.proj(x.float() if self.confidence_head.proj.weight.dtype == torch.float32
                                         else x).squeeze(-1).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target ids: ``id + d2t[id]`` (identity for full-vocab drafters)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def block_query(self, anchor: torch.Tensor, n: int, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         int]:
        """The query block for ``n`` proposals after ``anchor`` [B] at position ``start`` [B].

        Anchor-first: ``[anchor, mask × (n-1)]`` and every slot proposes; 1+N: ``[anchor, mask × n]`` and slots 1..n
        propose. Returns ``(ids [B, Q], positions [B, Q], first_proposing_slot)``.
        """
        q = n if self.config.sample_from_anchor else n + 1
        ids = torch.full((anchor.shape[0], q), self.config.mask_token_id, dtype=torch.int64, device=anchor.device)
        ids[:, 0] = anchor
        positions = start.unsqueeze(1) + torch.arange(q, device=anchor.device).unsqueeze(0)
        return ids, positions, 0 if self.config.sample_from_anchor else 1


def target_features(hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor],
                    layer_ids: tuple[int, ...]) -> torch.Tensor:
    """Concatenate the target features a drafter reads from HF ``output_hidden_states``.

    Layer-index numbering: id i -> ``hidden_states[i + 1]``, -1 -> ``hidden_states[0]`` (DeepSpec
    ``extract_context_feature``; vLLM's +1 in ``get_eagle3_aux_layers_from_config``).

    Returns:
        [B, T, A·Ht] in the hidden states' dtype.
    """
    return torch.cat([hidden_states[0 if i == -1 else i + 1] for i in layer_ids], dim=-1)


# ---- loading --------------------------------------------------------------------------------------------------


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    try:
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise CheckpointFormatError(f"malformed index: {exc}", path=index) from exc
            tensors: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                shard_path = (folder / shard).resolve()
                if folder.resolve() not in shard_path.parents:
                    raise UnsafeCheckpointError(f"shard {shard!r} escapes the checkpoint folder", path=index)
                if not shard_path.is_file():
                    raise CheckpointNotFoundError(f"shard {shard} named by the index does not exist", path=index)
                tensors.update(load_file(str(shard_path)))
            return tensors
        if single.is_file():
            return load_file(str(single))
    except SafetensorError as exc:
        raise CheckpointFormatError(f"unreadable safetensors: {exc}", path=folder) from exc
    if any(folder.glob("*.bin")):
        raise UnsafeCheckpointError("only pickle weights (*.bin) found; dsparkhub reads safetensors only",
                                    path=folder)
    raise CheckpointNotFoundError("no model.safetensors or model.safetensors.index.json", path=folder)


def _target_embed_head(target_model) -> tuple[torch.Tensor | None, torch.Tensor | None, int, int, int]:
    cfg = target_model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    emb = target_model.get_input_embeddings().weight
    head_mod = target_model.get_output_embeddings()
    head = head_mod.weight if head_mod is not None else None
    return emb, head, int(cfg.vocab_size), int(cfg.hidden_size), int(cfg.num_hidden_layers)


def load_drafter(folder: str | Path, target_model=None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Load a drafter from a DeepSpec step / run dir, a dsparkhub-converted vLLM-layout folder or a z-lab DFlash folder.

    Args:
        folder: the drafter folder (a DeepSpec run dir resolves to ``step_latest``).
        target_model: the transformers target (``PreTrainedModel``); required when the checkpoint lacks
            ``embed_tokens`` / ``lm_head`` (they are then shared with the target, as vLLM ``load_dspark_model`` does).
        dtype: parameter dtype (the confidence head stays float32, as in vLLM).
        device: where to put the drafter.

    Returns:
        An eval-mode :class:`Drafter`.

    Raises:
        CheckpointNotFoundError: folder, config or weights missing.
        CheckpointFormatError: invalid JSON or safetensors.
        UnsafeCheckpointError: pickle-only weights, shards escaping the folder.
        LayoutError: unknown architecture / config keys, or missing / unexpected / misshapen tensors (all listed).
        IncompatibleTargetError: the target cannot feed this drafter (layers, hidden size, vocab).
    """
    folder = resolve_step_dir(folder)  # the one run-folder resolver (issue 14)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointNotFoundError(f"no config.json (and no DeepSpec step_latest link) in {folder}", path=folder,
                                      hint="pass the drafter folder, a DeepSpec step folder or its run folder")
    try:
        raw = json.loads(config_path.read_text())
    except ValueError as exc:
        raise CheckpointFormatError(f"invalid JSON: {exc}", path=config_path) from exc
    cfg = drafter_config_from_dict(raw, path=config_path)
    tensors = _read_tensors(folder)
    drafter = Drafter(cfg)
    expected = drafter.state_dict()
    optional = {"embed_tokens.weight", "lm_head.weight"}
    if drafter.confidence_head is not None:
        optional |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    ignored = {n for n in tensors if n == "t2d" or n.endswith(".t2d") or n == "mask_embedding"}
    missing = sorted(n for n in expected if n not in tensors and n not in optional)
    unexpected = sorted(n for n in tensors if n not in expected and n not in ignored)
    misshapen = sorted(f"{n}: {list(tensors[n].shape)} != expected {list(expected[n].shape)}"
                       for n in expected if n in tensors and tensors[n].shape != expected[n].shape)
    if missing or unexpected or misshapen:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected}")
        if misshapen:
            parts.append(f"wrong shapes {misshapen}")
        raise LayoutError(f"{cfg.kind} drafter weights do not match its config: " + "; ".join(parts), path=folder)

    if target_model is not None:
        emb, head, t_vocab, t_hidden, t_layers = _target_embed_head(target_model)
        bad = [i for i in cfg.target_layer_ids if not -1 <= i < t_layers]
        if bad:
            raise IncompatibleTargetError(
                f"target_layer_ids {list(cfg.target_layer_ids)} (layer-index numbering) reference layers {bad} the "
                f"target does not have (it has {t_layers} layers, valid ids -1..{t_layers - 1})", path=config_path)
        if cfg.target_hidden_size != t_hidden:
            raise IncompatibleTargetError(
                f"drafter expects target hidden size {cfg.target_hidden_size}, the target has {t_hidden}",
                path=config_path)
        if cfg.vocab_size > t_vocab and "embed_tokens.weight" not in tensors:
            raise IncompatibleTargetError(
                f"drafter input vocab {cfg.vocab_size} > target vocab {t_vocab} and no embed_tokens.weight",
                path=config_path)
    with torch.no_grad():
        for name, param in drafter.state_dict().items():
            if name in tensors:
                param.copy_(tensors[name].to(param.dtype))
    drafter.to(device=device, dtype=dtype)
    if drafter.confidence_head is not None:
        if "confidence_head.proj.weight" not in tensors:
            drafter.confidence_head = None  # vLLM drops an enabled head whose weights are absent
        else:
            drafter.confidence_head.float()
    for name, attr in (("embed_tokens.weight", "embed_tokens"), ("lm_head.weight", "lm_head")):
        if name in tensors:
            continue
        if target_model is None:
            raise LayoutError(f"checkpoint has no {name}; pass the target model to share the target's", path=folder)
        emb, head, t_vocab, *_ = _target_embed_head(target_model)
        source = emb if attr == "embed_tokens" else head
        want = list(getattr(drafter, attr).weight.shape)
        if source is None or list(source.shape) != want:
            raise IncompatibleTargetError(
                f"checkpoint has no {name} and the target's {attr} has shape "
                f"{None if source is None else list(source.shape)}, expected {want}", path=folder)
        getattr(drafter, attr).weight = nn.Parameter(source.detach().to(device=device, dtype=dtype),
                                                     requires_grad=False)
    drafter.source = str(folder)
    return drafter.eval()


def count_parameters(module: nn.Module) -> int:
    """Number of parameters (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
