"""Writing a :class:`~dsparkhub.layouts.spec.DraftSpec` back out in a recipe's layout: :func:`write_config` (the
``config.json``, including ``write.templates``) and :data:`DERIVED_TENSORS` (tensors a layout needs that are computed
from others). Does not write files (``dsparkhub.io.writer``) or decide what may be written (``dsparkhub.convert``).
"""

from __future__ import annotations

import re

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.causality import write_causality
from dsparkhub.layouts.recipes import Recipe, extra_key_map, keyed, set_key
from dsparkhub.layouts.spec import ANCHOR_FIRST, DraftSpec


#: tensors a layout needs that are computed from other tensors when the source lacks them. Each function takes
#: the spec and a loader ``load(canonical_name) -> torch.Tensor`` and returns the tensor.
#: the extra (z-lab ``no_rope_layers``) a layout must keep to hold a Ricursive DFlash2 drafter
NOPE_KEY = "no_rope_layers"


def _t2d_from_d2t(spec: DraftSpec, load):
    import torch

    d2t = load("d2t")
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t] = True
    return t2d


DERIVED_TENSORS = {
    # speculators DraftVocabMixin: t2d[v] is true where target token v is in the draft vocab (training-only table)
    "t2d": (("d2t",), _t2d_from_d2t, lambda spec: ("BOOL", (spec.vocab_size,))),
}


def _render(obj, values: dict):
    """Fill ``{name}`` placeholders of a ``write.templates`` value from ``values`` (recursively)."""
    if isinstance(obj, str):
        m = re.fullmatch(r"\{(\w+)\}", obj)
        if m:
            return values[m.group(1)]
        return obj.format(**values)
    if isinstance(obj, list):
        return [_render(x, values) for x in obj]
    if isinstance(obj, dict):
        return {k: _render(v, values) for k, v in obj.items()}
    return obj


def template_values(spec: DraftSpec) -> dict:
    """The names ``write.templates`` may use: every DraftSpec field plus a few derived numbers."""
    values = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k not in ("tensors", "source_names")}
    values.update(proposals_per_block=spec.proposals_per_block, num_aux_layers=len(spec.target_layer_ids),
                  hidden_state_ids=[i + 1 for i in spec.target_layer_ids],
                  sample_from_anchor=spec.block_layout == ANCHOR_FIRST,
                  verifier_name_or_path=spec.target_ref.get("name_or_path"),
                  verifier_architectures=spec.target_ref.get("architectures"))
    return values


def write_config(spec: DraftSpec, recipe: Recipe) -> dict:
    """The ``config.json`` of ``spec`` in ``recipe``'s layout.

    Raises:
        LayoutError: the recipe cannot express the spec's family or variant.
    """
    w = recipe.data.get("write") or {}
    by_variant = w.get("architectures_by_variant")
    archs = (by_variant or {}).get(spec.variant) if by_variant else (w.get("architectures") or {}).get(spec.family)
    for name, extra_archs in (w.get("architectures_by_extra") or {}).items():
        if spec.extras.get(name):
            archs = list(extra_archs)
    if spec.extras.get(NOPE_KEY) and NOPE_KEY not in extra_key_map(recipe):
        # vLLM 0.34 ricursive_dflash2.py: only DFlash2RicursiveDraftModel reads them; dropping them changes the model
        raise LayoutError(f"layout {recipe.name!r} cannot hold `{NOPE_KEY}` {spec.extras[NOPE_KEY]} (a Ricursive "
                          f"DFlash2 drafter, vLLM 0.34 DFlash2RicursiveDraftModel): writing it would silently turn "
                          f"its NoPE layers into RoPE layers; convert it to the zlab-dflash (vllm) layout",
                          path=recipe.path)
    families = w.get("families")
    if not archs or (families and spec.family not in families):
        raise LayoutError(f"layout {recipe.name!r} cannot hold a {spec.family} {spec.variant} drafter",
                          path=recipe.path)
    dkey = recipe.data.get("decoder_config_key")
    cfg = {"architectures": list(archs)}
    decoder = {k: v for k, v in spec.decoder_config.items() if v is not None}
    decoder["num_hidden_layers"] = spec.num_layers
    if dkey:
        set_key(cfg, dkey, decoder)
    else:
        cfg.update(decoder)
    values = {
        "block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.target_layer_ids), "num_target_layers": spec.num_target_layers,
        "markov_rank": spec.markov_rank if spec.variant == "dspark" else None,
        "markov_head_type": spec.markov_head_type if spec.variant == "dspark" else None,
        "confidence_head": spec.confidence_head if spec.variant == "dspark" else None,
        "confidence_head_with_markov": spec.confidence_head_with_markov if spec.variant == "dspark" else None,
        "draft_vocab_size": spec.draft_vocab_size if spec.draft_vocab_size != spec.vocab_size else None,
        "target_hidden_size": spec.target_hidden_size if spec.target_hidden_size != spec.hidden_size else None,
        "verifier_name_or_path": spec.target_ref.get("name_or_path"),
        "verifier_architectures": spec.target_ref.get("architectures"),
    }
    if keyed(cfg, recipe.data.get("target_layer_ids_numbering"), "layer_index") == "hidden_state_index":
        values["target_layer_ids"] = [i + 1 for i in spec.target_layer_ids]
    for name, value in values.items():
        key = recipe.write_key(name)
        if key and value is not None:
            set_key(cfg, key, value)
    # the same value under a second key where another engine reads it (vllm recipe: SGLang's dflash_config.*)
    for name, keys in (w.get("mirror") or {}).items():
        if values.get(name) is not None:
            for key in keys:
                set_key(cfg, key, values[name])
    layout_key = w.get("layout_key")
    if layout_key:
        for key, by_layout in layout_key.items():
            set_key(cfg, key, by_layout[spec.block_layout])
    for name, key in extra_key_map(recipe).items():
        if name in spec.extras:
            set_key(cfg, key, spec.extras[name])
    write_causality(cfg, spec, recipe)
    cfg.update(w.get("constants") or {})
    tv = template_values(spec)
    for key, tmpl in (w.get("templates") or {}).items():
        set_key(cfg, key, _render(tmpl, tv))
    return cfg
