"""The resolved configuration of a reference drafter: :class:`DrafterConfig` and each draft layer's
:class:`LayerAttention` (sliding window, causal), the values :mod:`dsparkhub.verify.reference.layers` and
:mod:`dsparkhub.verify.reference.modeling` build their modules from.

Owns only the fields and their meaning. Does not read a checkpoint or a DraftSpec
(``dsparkhub.verify.reference.loading`` resolves a :class:`DrafterConfig` from one, with vLLM 0.32's precedence), and
holds no numerics.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DrafterConfig", "LayerAttention"]

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
    """Everything the drafter's numerics depend on, resolved from a DraftSpec (``loading.drafter_config_from_spec``).

    Attributes:
        kind: the DraftSpec variant, ``"dspark"`` (Markov head, optional confidence head) or ``"dflash"``.
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
