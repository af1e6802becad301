"""The canonical, JSON-serialisable description of a drafter: :class:`DraftSpec`.

Every layout reader (``dsparkhub.layouts.reading``, with the recipes of ``dsparkhub.layouts.recipes``) produces a
DraftSpec; every writer consumes one. Conventions inside a
DraftSpec, whatever the layout on disk:

- tensor names are vLLM 0.32's Qwen3 DSpark checkpoint names (no ``model.`` prefix): ``layers.{i}.self_attn.q_proj
  .weight``, ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, ``embed_tokens.weight``, ``lm_head.weight``,
  ``markov_head.markov_w{1,2}.weight``, ``confidence_head.proj.{weight,bias}``, ``d2t``
  (vLLM 0.32 ``qwen3_dspark.py`` load_weights; identical to DeepSpec's saved names);
- target layer ids are in **layer-index** numbering: id i is the output of target decoder layer i, i.e. HF
  ``output_hidden_states[i + 1]``; -1 is the embedding output (DeepSpec ``common.py`` extract_context_feature).
  Hidden-state-index numbering (speculators ``aux_hidden_state_layer_ids``, DeepSeek-V4 ``dspark_target_layer_ids``)
  is converted at the edges only;
- ``block_layout`` is ``"anchor_first"`` (the block ``[anchor, mask x (B-1)]`` proposes B tokens; vLLM
  ``sample_from_anchor=true``) or ``"one_plus_n"`` (the anchor slot is the bonus token; B-1 proposals).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dsparkhub.io.header import TensorInfo

ANCHOR_FIRST = "anchor_first"
ONE_PLUS_N = "one_plus_n"


@dataclass
class DraftSpec:
    """A drafter, independent of the layout it was read from.

    Attributes:
        layout: name of the recipe it was read with (``"deepspec"``, ``"vllm"``, ``"zlab-dflash"``, ...).
        variant: ``"dspark"`` (Markov head), ``"dflash"`` (none) or ``"eagle3"``.
        family: decoder family of the drafter backbone: ``"qwen3"``, ``"gemma4"``, ``"k3-mla"``, ``"deepseek-v4"``.
        architecture: the ``architectures[0]`` the source declared.
        block_size: trained block size B.
        block_layout: ``"anchor_first"`` | ``"one_plus_n"``.
        target_layer_ids: target layers feeding ``fc``, layer-index numbering, in concatenation order.
        num_target_layers: decoder layers of the target the drafter was trained on, when the source says.
        markov_rank: r (0 when there is no Markov head).
        markov_head_type: ``"vanilla"`` | ``"gated"`` | ``"rnn"`` | None.
        confidence_head: whether a confidence head is declared.
        confidence_head_with_markov: whether its input is ``[h; W1[prev]]`` (H + r) rather than h (H).
        vocab_size: V, the input vocabulary (embedding and Markov W1 rows).
        draft_vocab_size: Vd, the output vocabulary (``lm_head`` and Markov W2 rows); == V unless reduced.
        mask_token_id: the mask / noise token filling the parallel slots.
        hidden_size: H of the drafter.
        target_hidden_size: Ht of the target (``fc`` input is ``len(target_layer_ids) * Ht``).
        num_layers: L, draft decoder layers.
        decoder_config: the backbone's HF config keys (heads, head_dim, intermediate_size, rope, eps, ...), as the
            source wrote them, minus the DSpark-specific keys listed above.
        tensors: canonical tensor name -> header info in the source (file, dtype, shape).
        source_names: canonical tensor name -> name in the source file.
        notes: facts the reader wants the user to know (defaults it assumed, keys it ignored).
        target_ref: the target the source names, when it does (speculators ``speculators_config.verifier``:
            ``{"name_or_path": ..., "architectures": [...]}``); empty otherwise.
        causal: per draft layer, whether its attention is causal inside the draft block (vLLM 0.32
            ``qwen3_dflash.py`` ``_dflash_layer_causal``; speculators ``sliding_window_non_causal``); None when the
            layout does not say (``dsparkhub.layouts.causality``).
        extras: layout keys kept verbatim for layouts that share them (``extra_keys`` in the recipes), e.g.
            speculators ``sliding_window_non_causal``, EAGLE-3 ``norm_before_residual``.
    """

    layout: str
    variant: str
    family: str
    architecture: str
    block_size: int
    block_layout: str
    target_layer_ids: list[int]
    num_target_layers: int | None
    markov_rank: int
    markov_head_type: str | None
    confidence_head: bool
    confidence_head_with_markov: bool
    vocab_size: int
    draft_vocab_size: int
    mask_token_id: int | None
    hidden_size: int
    target_hidden_size: int
    num_layers: int
    decoder_config: dict = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    source_names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    target_ref: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    causal: list[bool] | None = None

    @property
    def proposals_per_block(self) -> int:
        """Tokens one block proposes: B (anchor-first) or B - 1 (1+N)."""
        return self.block_size if self.block_layout == ANCHOR_FIRST else self.block_size - 1

    @property
    def num_parameters(self) -> int:
        """Elements over all tensors."""
        return sum(t.numel for t in self.tensors.values())

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data."""
        return sum(t.nbytes for t in self.tensors.values())

    def summary(self) -> dict:
        """JSON-friendly description without the per-tensor list (what ``inspect --json`` prints at the top)."""
        out = asdict(self)
        out.pop("tensors")
        out.pop("source_names")
        out["proposals_per_block"] = self.proposals_per_block
        out["target_layer_ids_numbering"] = "layer index (HF output_hidden_states[id + 1])"
        out["num_parameters"] = self.num_parameters
        out["total_bytes"] = self.total_bytes
        dtypes: dict[str, int] = {}
        for t in self.tensors.values():
            dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        out["dtypes"] = dtypes
        return out

    def to_dict(self) -> dict:
        """Everything, tensors included, as plain JSON types."""
        out = self.summary()
        out["tensors"] = {n: {**t.to_dict(), "source_name": self.source_names.get(n, n)}
                          for n, t in sorted(self.tensors.items())}
        return out
