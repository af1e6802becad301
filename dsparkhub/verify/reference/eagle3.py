"""An EAGLE-3 drafter as a plain PyTorch module: chain drafting, one token per step, with its own KV cache.

The layout is speculators 0.9.0's (``models/eagle3/core.py`` ``Eagle3DraftModel``, TorchSpec's export writes the
same names): ``fc`` [H, A·Ht] fuses the target's A aux hidden states (optionally after ``input_norm`` [A·Ht] or one
``fc_norm`` per aux state), one Llama / Qwen3 decoder layer ``layers.0.*`` whose attention reads
``[input_layernorm(embed(token)) ; hidden_norm(hidden)]`` (2H wide), ``norm`` and ``lm_head`` over the draft vocab,
``d2t`` when the draft vocab is smaller. Numerics follow vLLM 0.32 ``llama_eagle3.py`` / ``qwen3_eagle3.py``, which
agree with speculators' ``Eagle3FirstLayerMixin.forward``:

- residual = ``hidden_norm(hidden)`` when ``norm_before_residual`` else ``hidden``; the layer output is the
  pre-norm ``residual + attn``, then ``+ mlp(post_attention_layernorm(.))``;
- logits = ``logit_scale · lm_head(norm(out))``; the hidden fed to the next step is ``norm(out)`` when
  ``norm_output`` else ``out`` (vLLM ``aux_output``; speculators feeds ``norm(out)`` back under ``norm_output``).

Slots (vLLM ``v1/spec_decode/eagle.py``: input ids shifted left by one, hidden of the same position): slot i holds
``(x_{i+1}, fused h_i)`` at position i and predicts ``x_{i+2}``. The context cache keeps one K/V per slot whose next
token is committed (``next_tokens``), plus the fused hidden of each slot (:attr:`ContextCache.states`). Drafting
after the pending token x_p: step 0 re-queries slot p - 1 ``(x_p, h_{p-1})`` over the cache (its own K/V is already
there), step j >= 1 feeds ``(d_j, hidden out of step j - 1)`` at position p - 1 + j, its K/V kept for the later steps
of this draft only. Only single-layer drafters (every published EAGLE-3) are computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsparkhub.verify.reference.drafter_config import DrafterConfig, LayerAttention
from dsparkhub.verify.reference.layers import MLP, RMSNorm, Rope, attention_mask
from dsparkhub.verify.reference.modeling import ContextCache

__all__ = ["Eagle3Drafter", "Eagle3Options"]


@dataclass(frozen=True)
class Eagle3Options:
    """The EAGLE-3 config switches (speculators ``Eagle3SpeculatorConfig``, read by vLLM 0.32 the same way).

    Attributes:
        norm_before_residual: the residual is the normed hidden (``hidden_norm``) instead of the raw one.
        norm_before_fc: ``input_norm`` [A·Ht] over the concatenated aux states before ``fc``.
        fc_norm: one RMSNorm per aux state (``fc_norm.{i}``) before ``fc``.
        norm_output: the hidden fed to the next step is ``norm(out)`` instead of the pre-norm ``out``.
        qk_norm: per-head ``q_norm`` / ``k_norm`` (a Qwen3 layer; a Llama layer has none).
    """

    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    qk_norm: bool = False


class Eagle3Attention(nn.Module):
    """Attention over ``[embed ; hidden]`` (2H in): ``q_proj`` / ``k_proj`` / ``v_proj`` [·, 2H], ``o_proj``."""

    def __init__(self, cfg: DrafterConfig, qk_norm: bool):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None

    def _heads(self, proj, norm, x, heads, cos, sin):
        b, t, _ = x.shape
        y = proj(x).view(b, t, heads, self.head_dim)
        if norm is not None:
            y = norm(y)
        return Rope.apply(y.transpose(1, 2), cos, sin)

    def q(self, x, cos, sin) -> torch.Tensor:
        """``x`` [B, T, 2H] -> Q [B, nh, T, hd] (normed, rotated)."""
        return self._heads(self.q_proj, self.q_norm, x, self.num_heads, cos, sin)

    def kv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [B, T, 2H] -> K (normed, rotated), V, each [B, nkv, T, hd]."""
        b, t, _ = x.shape
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return self._heads(self.k_proj, self.k_norm, x, self.num_kv_heads, cos, sin), v

    def attend(self, q, k, v, mask) -> torch.Tensor:
        """Q [B, nh, Q, hd] over K / V [B, nkv, T, hd], bool ``mask`` [B, 1, Q, T] or None -> [B, Q, H]."""
        b, _, q_len, _ = q.shape
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class Eagle3Layer(nn.Module):
    """The EAGLE-3 decoder layer: ``input_layernorm`` on the embedding, ``hidden_norm`` on the hidden, attention
    over their concatenation, ``post_attention_layernorm`` + gated MLP."""

    def __init__(self, cfg: DrafterConfig, options: Eagle3Options):
        super().__init__()
        self.norm_before_residual = options.norm_before_residual
        self.self_attn = Eagle3Attention(cfg, options.qk_norm)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def inputs(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input [B, T, 2H], residual [B, T, H]) of token embeddings and hiddens, each [B, T, H]."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The pre-norm layer output of the attention output and the residual, [B, T, H]."""
        x = residual + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(nn.Module):
    """A single-layer EAGLE-3 drafter whose ``state_dict`` names are speculators' checkpoint names.

    Args:
        config: the resolved :class:`DrafterConfig` (``kind == "eagle3"``; ``mask_token_id`` is only the id put in
            padded verify slots; ``layer_attention[0]`` carries the sliding window, if any).
        options: the :class:`Eagle3Options` switches.

    Parameters: ``embed_tokens.weight`` [V, H], ``fc.weight`` [H, A·Ht], ``input_norm.weight`` [A·Ht]
    (``norm_before_fc``), ``fc_norm.{i}.weight`` [Ht] (``fc_norm``), ``layers.0.*``, ``norm.weight`` [H],
    ``lm_head.weight`` [Vd, H]; buffer ``d2t`` int64 [Vd] when Vd < V.
    """

    autoregressive = True
    markov_head = None
    confidence_head = None

    def __init__(self, config: DrafterConfig, options: Eagle3Options):
        super().__init__()
        cfg = self.config = config
        self.options = options
        a, ht = cfg.num_context_features, cfg.target_hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.input_norm = RMSNorm(a * ht, cfg.rms_norm_eps) if options.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(ht, cfg.rms_norm_eps) for _ in range(a)) if options.fc_norm else None
        self.fc = nn.Linear(a * ht, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(cfg, options)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        if cfg.draft_vocab_size < cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        else:
            self.d2t = None
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)
        self.window: LayerAttention = cfg.attention_of(0)

    # -- pieces ------------------------------------------------------------------------------------------------

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated aux states [B, T, A·Ht] -> fused hidden [B, T, H] (vLLM ``combine_hidden_states``)."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def logits_and_next(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm layer output [..., H] -> (draft-vocab logits [..., Vd], hidden for the next step [..., H])."""
        normed = self.norm(out)
        logits = self.lm_head(normed)
        if self.config.logit_scale != 1.0:
            logits = logits * self.config.logit_scale
        return logits, normed if self.options.norm_output else out

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target ids: ``id + d2t[id]`` (identity for full-vocab drafters)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def _window_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor, valid: torch.Tensor | None):
        """bool [B, 1, Q, K] of the sliding window (if any) AND the valid keys ``valid`` [B, K], or None."""
        mask = attention_mask(q_pos, k_pos, self.window) if self.window.sliding_window is not None else None
        if valid is not None:
            v = valid[:, None, None, :]
            mask = v if mask is None else mask & v
        return mask

    # -- context cache ---------------------------------------------------------------------------------------

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor,
                   next_tokens: torch.Tensor | None = None) -> ContextCache:
        """The cache of slots ``positions`` [B, T]: aux states ``features`` [B, T, A·Ht] of those positions and
        ``next_tokens`` [B, T] int64, the committed token after each. K/V [B, nkv, T, hd] plus fused ``states``.

        Raises:
            ValueError: ``next_tokens`` missing (an EAGLE-3 slot reads the token after its position).
        """
        if next_tokens is None:
            raise ValueError("an EAGLE-3 context slot needs the token that follows its position (next_tokens)")
        states = self.fuse(features)
        layer = self.layers[0]
        x, _ = layer.inputs(self.embed_tokens(next_tokens), states)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        k, v = layer.self_attn.kv(x, cos, sin)
        return ContextCache(keys=[k], values=[v], positions=positions.expand(states.shape[0], -1), states=states)

    def extend_context(self, cache: ContextCache, features: torch.Tensor, positions: torch.Tensor,
                       next_tokens: torch.Tensor | None = None) -> ContextCache:
        """Append the slots of :meth:`context_kv` to ``cache`` (in place) and return it."""
        new = self.context_kv(features, positions, next_tokens)
        if not cache.keys:
            cache.keys, cache.values, cache.positions, cache.states = new.keys, new.values, new.positions, new.states
            return cache
        cache.keys = [torch.cat([cache.keys[0], new.keys[0]], 2)]
        cache.values = [torch.cat([cache.values[0], new.values[0]], 2)]
        cache.positions = torch.cat([cache.positions, new.positions], 1)
        cache.states = torch.cat([cache.states, new.states], 1)
        return cache

    # -- drafting --------------------------------------------------------------------------------------------

    def draft_steps(self, anchors: torch.Tensor, starts: torch.Tensor, cache: ContextCache,
                    valid: torch.Tensor | None, n: int, choose):
        """Chain-draft ``n`` tokens after the pending ``anchors`` [B] at positions ``starts`` [B].

        Args:
            cache: the context cache over every slot before ``starts`` (slot ``starts - 1`` included).
            valid: bool [B, T] of the cache's valid slots (ragged batches), None when all are.
            choose: ``choose(step, logits [B, Vd] float32) -> draft-vocab ids [B]``, the engine's token choice.

        Returns:
            target-vocab ids [B, n] (int64).
        """
        layer = self.layers[0]
        attn = layer.self_attn
        rows = anchors.shape[0]
        if valid is None:
            last = torch.full((rows,), cache.states.shape[1] - 1, device=anchors.device)
        else:  # the last valid slot of each row
            t = valid.shape[1]
            last = t - 1 - valid.flip(1).to(torch.int64).argmax(1)
        hidden = cache.states[torch.arange(rows, device=anchors.device), last].unsqueeze(1)  # [B, 1, H]
        tokens = anchors.unsqueeze(1)
        keys, values, key_pos = cache.keys[0], cache.values[0], cache.positions
        key_valid = valid
        out_ids = []
        for step in range(n):
            pos = (starts - 1 + step).unsqueeze(1)  # [B, 1]
            x, residual = layer.inputs(self.embed_tokens(tokens), hidden)
            cos, sin = self.rope.cos_sin(pos, x.dtype)
            if step > 0:  # step 0 is slot p - 1, already in the cache
                k, v = attn.kv(x, cos, sin)
                keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
                key_pos = torch.cat([key_pos, pos], 1)
                if key_valid is not None:
                    key_valid = torch.cat([key_valid, torch.ones_like(pos, dtype=torch.bool)], 1)
            mask = self._window_mask(pos, key_pos, key_valid)
            out = layer.finish(attn.attend(attn.q(x, cos, sin), keys, values, mask), residual)
            logits, hidden = self.logits_and_next(out)
            ids = self.to_target_ids(choose(step, logits[:, 0].float()))
            out_ids.append(ids)
            tokens = ids.unsqueeze(1)
        return torch.stack(out_ids, 1)

    def ttt_forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                    steps: int) -> list[torch.Tensor]:
        """Every slot of a sequence drafted ``steps`` deep, teacher-forced (speculators' training-time test).

        Step 0: slot i reads ``(tokens[i], fuse(features[i]))`` at ``positions[i]`` causally over slots <= i; step
        t >= 1: ``(tokens[i + t]`` (0 past the end, as speculators pads), hidden out of step t - 1) at
        ``positions[i] + t``, over slots <= i of step 0 and its own slots of steps 1..t (speculators
        ``extend_mask_for_draft_tokens``) — for the last slot, exactly :meth:`draft_steps`.

        Args:
            tokens: [B, T] int64; features: [B, T, A·Ht]; positions: [B, T] int64.

        Returns:
            ``steps`` logits tensors [B, T, Vd].
        """
        layer = self.layers[0]
        attn = layer.self_attn
        b, t = tokens.shape
        dev = tokens.device
        hidden = self.fuse(features)
        causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        eye = torch.eye(t, dtype=torch.bool, device=dev)
        keys, values, key_pos, logits_out = [], [], [], []
        for step in range(steps):
            step_tokens = torch.cat([tokens[:, step:], tokens.new_zeros(b, step)], 1)
            pos = positions + step
            x, residual = layer.inputs(self.embed_tokens(step_tokens), hidden)
            cos, sin = self.rope.cos_sin(pos, x.dtype)
            k, v = attn.kv(x, cos, sin)
            keys.append(k)
            values.append(v)
            key_pos.append(pos)
            allowed = torch.cat([causal] + [eye] * step, 1).expand(b, 1, t, t * (step + 1))
            if self.window.sliding_window is not None:
                allowed = allowed & attention_mask(pos, torch.cat(key_pos, 1), self.window)
            out = layer.finish(attn.attend(attn.q(x, cos, sin), torch.cat(keys, 2), torch.cat(values, 2), allowed),
                               residual)
            logits, hidden = self.logits_and_next(out)
            logits_out.append(logits)
        return logits_out
