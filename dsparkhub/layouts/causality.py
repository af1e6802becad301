"""Causality of a DFlash / DSpark drafter's attention inside the draft block, read from and written into each
layout so that no conversion turns bidirectional layers causal (or the reverse).

Each layout states it differently (``causality:`` in the recipe names the rule):

- ``vllm`` (vLLM 0.32 standalone and z-lab layouts): vLLM 0.32 ``qwen3_dflash.py:86`` ``_dflash_layer_causal``
  takes top-level ``is_causal``, else ``dflash_config.causal``, for every layer; else a layer is causal exactly
  when ``layer_types[i] == "sliding_attention"``; without ``layer_types`` every layer is bidirectional. dflash 0.1.0
  ``Qwen3DFlashAttention`` reads ``is_causal`` first with the same layer-type default (dflash/model.py), so
  ``is_causal`` is the key written;
- ``speculators``: full-attention layers are always bidirectional, sliding layers are causal unless
  ``sliding_window_non_causal`` (speculators 0.9.0 ``models/dflash/attention.py:43``; the key's default is the
  trainer's: false for DFlash / DSpark, true for DFlash2, ``models/dflash2/config.py``).

What one layout cannot express (a causal full-attention layer in speculators; a per-layer pattern other than the
layer-type default in the vLLM layouts) is refused, never approximated. Does not: run attention (the engines do).
"""

from __future__ import annotations

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.recipes import Recipe, get_key
from dsparkhub.layouts.spec import DraftSpec

SLIDING = "sliding_attention"


def _layer_types(decoder: dict, n: int, *, qwen3_fill: bool = False) -> list[str]:
    """The decoder's ``layer_types``; without them all full attention, or with ``qwen3_fill`` the list transformers'
    ``Qwen3Config`` fills in when absent (sliding from ``max_window_layers`` on, default 28, when
    ``use_sliding_window`` keeps a ``sliding_window``; transformers ``models/qwen3/configuration_qwen3.py:87-95``),
    which is what vLLM 0.32 reads."""
    types = decoder.get("layer_types")
    if isinstance(types, list) and len(types) == n and all(isinstance(t, str) for t in types):
        return types
    if qwen3_fill and types is None and decoder.get("use_sliding_window") is True \
            and decoder.get("sliding_window") is not None:
        first = decoder.get("max_window_layers", 28)
        if type(first) is int:
            return [SLIDING if i >= first else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def vllm_causality(cfg: dict, decoder: dict, n: int) -> list[bool]:
    """vLLM 0.32 ``qwen3_dflash.py:86`` ``_dflash_layer_causal`` for ``n`` draft layers: top-level ``is_causal``, else
    ``dflash_config.causal``, for every layer; else causal exactly where the (transformers-filled) layer type is
    ``sliding_attention``.

    Raises:
        LayoutError: ``is_causal`` / ``dflash_config.causal`` is not a JSON boolean.
    """
    for key in ("is_causal", "dflash_config.causal"):
        value = get_key(cfg, key, None)
        if value is not None:
            if type(value) is not bool:
                raise LayoutError(f"config key `{key}` must be true or false, found {value!r}")
            return [value] * n
    return [t == SLIDING for t in _layer_types(decoder, n, qwen3_fill=True)]


def _speculators_default(recipe: Recipe, variant: str) -> bool:
    return bool((recipe.data.get("sliding_window_non_causal_default") or {}).get(variant, False))


def read_causality(cfg: dict, decoder: dict, recipe: Recipe, variant: str) -> list[bool] | None:
    """Per draft layer, whether its attention is causal, as the engine serving ``recipe``'s layout resolves it.

    Args:
        cfg: the whole ``config.json``.
        decoder: the backbone config (``transformer_layer_config`` for speculators, else ``cfg``).
        recipe: the layout read; its ``causality`` key names the rule (None: the layout does not say).
        variant: the drafter variant (speculators' default differs for DFlash2).

    Returns:
        ``[bool] * num_hidden_layers``, or None when the recipe has no causality rule.

    Raises:
        LayoutError: ``is_causal`` / ``dflash_config.causal`` / ``sliding_window_non_causal`` is not a JSON boolean.
    """
    rule = recipe.data.get("causality")
    n = decoder.get("num_hidden_layers") or 0
    if rule is None or type(n) is not int:
        return None
    if rule == "vllm":
        return vllm_causality(cfg, decoder, n)
    types = _layer_types(decoder, n)
    if rule == "speculators":
        value = cfg.get("sliding_window_non_causal")
        if value is None:
            value = _speculators_default(recipe, variant)
        elif type(value) is not bool:
            raise LayoutError(f"config key `sliding_window_non_causal` must be true or false, found {value!r}")
        return [t == SLIDING and not value for t in types]
    raise LayoutError(f"recipe {recipe.name!r}: unknown causality rule {rule!r} (known: vllm, speculators)",
                      path=recipe.path)


def _plan(spec: DraftSpec, recipe: Recipe) -> tuple[dict, str | None]:
    """The keys to write for ``spec``'s causality in ``recipe``'s layout, or the reason it cannot be written."""
    rule = recipe.data.get("causality")
    causal = spec.causal
    if rule is None or causal is None:
        return {}, None
    types = _layer_types(spec.decoder_config, len(causal), qwen3_fill=rule == "vllm")
    shown = ", ".join(f"layer {i} {t} {'causal' if c else 'bidirectional'}" for i, (t, c) in
                      enumerate(zip(types, causal)))
    if rule == "vllm":
        if causal == [t == SLIDING for t in types]:
            return {}, None  # the layer-type default of vLLM and dflash: nothing to write
        if len(set(causal)) == 1:
            return {"is_causal": causal[0]}, None
        return {}, (f"layout {recipe.name!r} expresses causality per drafter (`is_causal`) or by layer type "
                    f"(sliding layers causal), not this pattern: {shown} (vLLM 0.32 qwen3_dflash.py:86)")
    wrong = [i for i, (t, c) in enumerate(zip(types, causal)) if c and t != SLIDING]
    sliding = {c for t, c in zip(types, causal) if t == SLIDING}
    if wrong or len(sliding) > 1:
        return {}, (f"layout {recipe.name!r} runs full-attention layers bidirectionally and all sliding layers "
                    f"alike (speculators 0.9.0 models/dflash/attention.py:43); this drafter has {shown}")
    # no sliding layer: speculators ignores the key, but vLLM 0.32's speculators reader applies
    # `causal = not sliding_window_non_causal` to every layer (transformers_utils/configs/speculators/algos.py
    # update_dflash), so true keeps the bidirectional full-attention layers bidirectional there too
    swnc = (not sliding.pop()) if sliding else True
    return {"sliding_window_non_causal": swnc}, None


def causality_refusal(spec: DraftSpec, recipe: Recipe) -> str | None:
    """Why ``spec``'s per-layer causality cannot be written in ``recipe``'s layout; None when it can."""
    return _plan(spec, recipe)[1]


def write_causality(cfg: dict, spec: DraftSpec, recipe: Recipe) -> None:
    """Set the keys that carry ``spec.causal`` into ``cfg`` (a ``config.json`` in ``recipe``'s layout).

    Raises:
        LayoutError: the layout cannot express the drafter's causality (see :func:`causality_refusal`).
    """
    keys, problem = _plan(spec, recipe)
    if problem:
        raise LayoutError(problem, path=recipe.path)
    cfg.update(keys)
