"""The decoder-layer numerics of a Qwen3-style parallel drafter: RMSNorm, neox RoPE, the DFlash attention (Q from
the block, K / V from [context ; block]) with its per-layer mask (:func:`attention_mask`), the gated MLP and the
pre-norm decoder layer. Parameter names are the checkpoint's (``self_attn.q_proj``, ``mlp.gate_proj``, ...).

Semantics follow vLLM 0.32 ``qwen3_dflash.py``: every draft layer projects the context states with its own
``k_proj`` / ``v_proj`` and ``k_norm`` (no ``input_layernorm``), RoPE at the context positions
(``precompute_and_store_context_kv``), and masks as vLLM's FlashAttention backend does (full, non-causal by default).

Does not: assemble the drafter, its context projection or its heads (:mod:`dsparkhub.verify.reference.modeling`),
or resolve which layer is sliding / causal (``dsparkhub.verify.reference.loading``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsparkhub.errors import LayoutError
from dsparkhub.verify.reference.drafter_config import DrafterConfig, LayerAttention

__all__ = ["Attention", "DecoderLayer", "MLP", "RMSNorm", "Rope", "attention_mask"]

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
