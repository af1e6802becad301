"""A DSpark / DFlash drafter as a plain PyTorch module: context projection, draft layers, Markov and confidence heads.

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

What it deliberately does not do: define the configuration (:mod:`dsparkhub.verify.reference.drafter_config`) or the
decoder layers (:mod:`dsparkhub.verify.reference.layers`); read configs or weights
(``dsparkhub.verify.reference.loading`` builds a :class:`~dsparkhub.verify.reference.drafter_config.DrafterConfig`
from the :class:`~dsparkhub.layouts.spec.DraftSpec` the recipes read, and fills a :class:`Drafter` from the
checkpoint); and anything about decoding policy — that is ``dsparkhub.verify.reference.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dsparkhub.errors import LayoutError
from dsparkhub.verify.reference.drafter_config import DrafterConfig
from dsparkhub.verify.reference.layers import DecoderLayer, RMSNorm, Rope, attention_mask

__all__ = [
    "Drafter",
    "target_features",
    "ContextCache",
    "count_parameters",
]


# ---- heads ----------------------------------------------------------------------------------------------------


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
    states: torch.Tensor | None = None  # [B, T, H] fused hidden per slot (EAGLE-3 re-queries its last slot)

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

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor,
                   next_tokens: torch.Tensor | None = None) -> ContextCache:
        """Per-layer context K/V of ``features`` [B, T, A·Ht] at ``positions`` [B, T] (int64); ``next_tokens``
        (the token after each position) is read by autoregressive drafters only (EAGLE-3), ignored here."""
        states = self.context_states(features)
        cos, sin = self.rope.cos_sin(positions, states.dtype)
        cache = ContextCache(positions=positions.expand(states.shape[0], -1))
        for layer in self.layers:
            k, v = layer.self_attn.kv(states, cos, sin)
            cache.keys.append(k)
            cache.values.append(v)
        return cache

    def extend_context(self, cache: ContextCache, features: torch.Tensor, positions: torch.Tensor,
                       next_tokens: torch.Tensor | None = None) -> ContextCache:
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


def count_parameters(module: nn.Module) -> int:
    """Number of parameters (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
