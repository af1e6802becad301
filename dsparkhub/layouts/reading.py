"""Reading a drafter into a :class:`~dsparkhub.layouts.spec.DraftSpec` with its recipe: :func:`open_draft` (a folder,
config and headers only), :func:`read_spec` (a checkpoint's config and headers) and :func:`spec_from_config` (a config
alone). The one reader of drafter configs: convert, validate, the engines' backends, the reference engine and the card
all take the DraftSpec it produces.

Does not: touch tensor data; decide whether a conversion is allowed (``dsparkhub.convert``).
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import LayoutError
from dsparkhub.io.checkpoint import Checkpoint, open_checkpoint
from dsparkhub.io.header import TensorInfo
from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.layouts.causality import read_causality
from dsparkhub.layouts.recipes import MISSING, Recipe, detect_recipe, extra_key_map, get_key, get_recipe, keyed
from dsparkhub.layouts.spec import ANCHOR_FIRST, DraftSpec


def _field(config: dict, recipe: Recipe, name: str, default=None):
    for key in recipe.read_keys(name):
        value = get_key(config, key)
        if value is not MISSING and value is not None:
            return recipe.read_value(name, value)
    return default


def _int_field(config, recipe, name, path, default=None):
    value = _field(config, recipe, name, default)
    if value is not None and (type(value) is not int):
        keys = recipe.read_keys(name)
        raise LayoutError(f"config key {keys[0] if keys else name!r} must be an integer, found {value!r}",
                          path=path)
    return value


def _stage_count(ckpt: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """Stages of a stage-prefixed drafter, counted from tensor names (never from ``num_nextn_predict_layers``)."""
    prefix = recipe.stages.get("prefix", "mtp.")
    stages = sorted({int(m.group(1)) for n in ckpt.tensors
                     if (m := re.match(re.escape(prefix) + r"(\d+)\.", n))})
    notes: list[str] = []
    if not stages:
        raise LayoutError(f"no `{prefix}<stage>.*` tensors: this checkpoint holds no attached drafter",
                          path=ckpt.path, hint="attach one with `dsparkhub convert SRC --attach TARGET --out OUT`")
    if stages != list(range(len(stages))):
        raise LayoutError(f"drafter stages must be numbered 0..S-1 without gaps, found {stages}", path=ckpt.path)
    n = len(stages)
    for key in recipe.stages.get("count_keys") or []:
        declared = get_key(ckpt.config, key, None)
        if declared is not None and declared != n:
            notes.append(f"config key `{key}` says {declared} but the checkpoint holds {n} `{prefix}*` stages; "
                         f"trusting the tensors ({n} stages)")
    return n, notes


#: decoder geometry keys that size loops and shapes, with their bounds (a hostile config must not make
#: ``validate`` build 10**12 expected tensors or divide by zero).
_GEOMETRY = {"hidden_size": (1, 2**31), "vocab_size": (1, 2**31), "num_hidden_layers": (0, 10_000),
             "num_attention_heads": (1, 2**20), "num_key_value_heads": (1, 2**20), "head_dim": (1, 2**20),
             "intermediate_size": (1, 2**31)}


def _check_geometry(dcfg: dict, path: Path, dkey: str | None) -> None:
    """Raise LayoutError when a decoder geometry key is present but not an integer within its bounds."""
    for key, (lo, hi) in _GEOMETRY.items():
        value = dcfg.get(key)
        if value is not None and (type(value) is not int or not lo <= value <= hi):
            raise LayoutError(f"config key `{key}`{f' (in `{dkey}`)' if dkey else ''} must be an integer in "
                              f"[{lo}, {hi}], found {reprlib.repr(value)}", path=path)


def config_on_read(config: dict, recipe: Recipe, path: Path) -> dict:
    """``config`` with the recipe's ``config_on_read`` keys added (a copy; the others as they are): each read from its
    dotted ``key`` (or set to ``default`` where absent), ``comma_ints`` parsed from ``"0,3,5"`` as vLLM 0.34 reads
    Mistral's ``mtp.target_activation_layers`` (transformers_utils/configs/mistral.py:450-460).

    Raises:
        LayoutError: a ``comma_ints`` value that is not integers separated by commas.
    """
    rules = recipe.data.get("config_on_read") or {}
    if not rules:
        return config
    out = dict(config)
    for name, rule in rules.items():
        value = get_key(config, rule["key"]) if rule.get("key") else MISSING
        if value is MISSING or value is None:
            value = rule.get("default")
        elif rule.get("format") == "comma_ints":
            parts = [p.strip() for p in str(value).split(",") if p.strip()]
            if not parts or not all(re.fullmatch(r"-?\d+", p) for p in parts):
                raise LayoutError(f"config key `{rule['key']}` must be comma-separated integers (\"0,3,5\"), found "
                                  f"{reprlib.repr(value)}", path=path)
            value = [int(p) for p in parts]
        if value is not None:
            out[name] = value
    return out


def read_spec(ckpt: Checkpoint, recipe: Recipe) -> DraftSpec:
    """Read a checkpoint in ``recipe``'s layout into a :class:`DraftSpec` (config + headers only).

    Raises:
        LayoutError: a required key is missing or mistyped (block_size, target layer ids), or tensor names clash.
    """
    # a layout read through config_on_read is Mistral-native: its config is params.json (open_checkpoint)
    path = Path(ckpt.path) / ("params.json" if recipe.data.get("config_on_read") else "config.json")
    cfg = config_on_read(ckpt.config, recipe, path)
    archs = cfg.get("architectures") or ["?"]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise LayoutError(f"config key `architectures` must be a list of strings, found {reprlib.repr(archs)}",
                          path=path)
    arch = archs[0]
    dkey = recipe.data.get("decoder_config_key")
    dcfg = get_key(cfg, dkey, None) if dkey else cfg
    if not isinstance(dcfg, dict):
        raise LayoutError(f"config key `{dkey}` (the drafter's decoder config) is missing or not an object",
                          path=path)
    family = (keyed(cfg, recipe.data.get("family_by_key"))
              or recipe.data.get("family_by_architecture", {}).get(arch) or recipe.data.get("family") or "qwen3")
    notes: list[str] = []

    block_size = _int_field(cfg, recipe, "block_size", path)
    if block_size is None and recipe.data.get("block_size_default"):  # TorchSpec: its export records none
        block_size = recipe.data["block_size_default"]["value"]
        notes.append(f"block size {block_size} assumed: {recipe.data['block_size_default']['source']}")
    if block_size is None:
        raise LayoutError(f"config has no block size (looked for {recipe.read_keys('block_size')})",
                          path=path)
    markov_rank = _int_field(cfg, recipe, "markov_rank", path, 0) or 0
    variant = keyed(cfg, recipe.data.get("variant")) or ("dspark" if markov_rank > 0 else "dflash")
    layout_rule = recipe.data.get("block_layout", ANCHOR_FIRST)
    if isinstance(layout_rule, dict):
        raw = get_key(cfg, layout_rule["key"])
        if raw is MISSING:
            block_layout = (layout_rule.get("default_by_variant") or {}).get(variant, layout_rule.get("default"))
            notes.append(f"`{layout_rule['key']}` not set; assumed {block_layout} (vLLM's default for this layout)")
        elif type(raw) is not bool:  # "false" (a string) is truthy: a silent anchor-first / 1+N flip
            raise LayoutError(f"config key {layout_rule['key']!r} must be true or false, found {json.dumps(raw)}",
                              path=path,
                              hint="it decides the block layout (anchor-first vs 1+N); write a JSON boolean")
        else:
            block_layout = layout_rule["true" if raw else "false"]
    else:
        block_layout = layout_rule

    ids = _field(cfg, recipe, "target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise LayoutError(f"target layer ids must be a non-empty list of integers, found {ids!r} (keys "
                          f"{recipe.read_keys('target_layer_ids')})", path=path)
    if keyed(cfg, recipe.data.get("target_layer_ids_numbering"), "layer_index") == "hidden_state_index":
        ids = [i - 1 for i in ids]
    hidden = dcfg.get("hidden_size")
    vocab = dcfg.get("vocab_size")
    if type(hidden) is not int or type(vocab) is not int:
        raise LayoutError(f"config must give integer hidden_size and vocab_size, found {hidden!r} and {vocab!r}"
                          + (f" (in `{dkey}`)" if dkey else ""), path=path)
    _check_geometry(dcfg, path, dkey)

    num_layers = dcfg.get("num_hidden_layers") or 0
    if recipe.stages:
        num_layers, stage_notes = _stage_count(ckpt, recipe)
        notes += stage_notes
    tensors: dict[str, TensorInfo] = {}
    source_names: dict[str, str] = {}
    aliases = ((recipe.data.get("tensors") or {}).get("aliases_by_model_type") or {}).get(cfg.get("model_type"))
    for name in ckpt.tensors:  # names first: a lazy checkpoint parses only the shards holding kept tensors
        if not recipe.keeps(name):
            continue
        info = ckpt.tensors[name]
        if any(re.fullmatch(p, name) for p in recipe.drop):
            why = (recipe.data.get("tensors") or {}).get("drop_reason") or "is not used by vLLM"
            notes.append(f"tensor {name!r} {why} and is dropped")
            continue
        canon = recipe.to_canonical(name, num_layers=num_layers)
        for alias, canonical in (aliases or {}).items():
            if canon.startswith(alias):
                canon = canonical + canon[len(alias):]
        if canon in tensors:
            raise LayoutError(f"tensors {source_names[canon]!r} and {name!r} both map to {canon!r}", path=ckpt.path)
        tensors[canon] = info
        source_names[canon] = name

    draft_vocab = _int_field(cfg, recipe, "draft_vocab_size", path)
    if draft_vocab is None:
        head = tensors.get("lm_head.weight") or tensors.get("markov_head.markov_w2.weight")
        draft_vocab = head.shape[0] if head is not None and len(head.shape) == 2 else vocab

    used = {k for name in recipe.data.get("fields", {}) for k in recipe.read_keys(name)}
    dropped = set(recipe.data.get("drop_keys") or [])
    extra_keys = extra_key_map(recipe)
    decoder = {k: v for k, v in dcfg.items() if k not in used and k not in dropped and "." not in k
               and (dkey or k not in extra_keys.values())}
    if decoder.get("model_type") in (remap := recipe.data.get("model_type_on_read") or {}):
        decoder["model_type"] = remap[decoder["model_type"]]  # a drafter-only type transformers does not know
    decoder.pop("num_hidden_layers", None)
    decoder["num_hidden_layers"] = dcfg.get("num_hidden_layers")
    extras = {**(recipe.data.get("extra_defaults") or {}),
              **{name: get_key(cfg, key) for name, key in extra_keys.items() if get_key(cfg, key) is not MISSING}}
    _check_no_rope_layers(extras.get("no_rope_layers"), num_layers, path)
    target_ref = {k: v for k in ("name_or_path", "architectures")
                  if (v := _field(cfg, recipe, f"verifier_{k}")) is not None}
    num_target_layers = _int_field(cfg, recipe, "num_target_layers", path)
    if num_target_layers is None and recipe.data.get("num_target_layers_from_decoder"):
        num_target_layers = dcfg.get("num_hidden_layers")

    causal = read_causality(cfg, dcfg, recipe, variant)
    return DraftSpec(
        layout=recipe.name, variant=variant, family=family, architecture=arch, causal=causal,
        block_size=block_size, block_layout=block_layout, target_layer_ids=list(ids),
        num_target_layers=num_target_layers,
        markov_rank=markov_rank,
        markov_head_type=_field(cfg, recipe, "markov_head_type", "vanilla" if markov_rank else None),
        confidence_head=bool(_field(cfg, recipe, "confidence_head", recipe.data.get("confidence_head_default",
                                                                                   False))),
        confidence_head_with_markov=bool(_field(cfg, recipe, "confidence_head_with_markov",
                                                recipe.data.get("confidence_head_with_markov_default", False))),
        vocab_size=vocab, draft_vocab_size=draft_vocab,
        mask_token_id=_int_field(cfg, recipe, "mask_token_id", path),
        hidden_size=hidden,
        target_hidden_size=_int_field(cfg, recipe, "target_hidden_size", path, hidden) or hidden,
        num_layers=num_layers,
        decoder_config=decoder, tensors=tensors, source_names=source_names, notes=notes,
        target_ref=target_ref, extras=extras,
    )


def _check_no_rope_layers(value, num_layers: int | None, path) -> None:
    """``no_rope_layers`` (vLLM 0.34 ``ricursive_dflash2.py``: indices of draft layers whose RoPE is identity) must be
    a list of distinct ints in ``[0, num_hidden_layers)``.

    Raises:
        LayoutError: naming the key, the values found and the valid range.
    """
    if value is None:
        return
    ok = isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value) \
        and len(set(value)) == len(value)
    if ok and num_layers is not None:
        ok = all(0 <= i < num_layers for i in value)
    if not ok:
        raise LayoutError(f"config key `no_rope_layers` must be a list of distinct draft-layer indices in "
                          f"[0, {num_layers}) (num_hidden_layers={num_layers}), found {reprlib.repr(value)}",
                          path=path)


def spec_from_config(config: dict, *, path: str | Path | None = None, layout: str | None = None) -> DraftSpec:
    """The :class:`DraftSpec` of a ``config.json`` dict alone (no tensors: ``tensors`` is empty and the draft vocab
    comes from the config), read by the recipe ``layout`` or the one detected. What the card's overview and the
    example's modules are built from.

    Args:
        config: the parsed ``config.json``.
        path: the config file, for error messages.
        layout: force a recipe by name instead of detecting it.

    Raises:
        LayoutError: no recipe (or several) matches, the config breaks the recipe's rules, or the layout counts its
            layers from tensor names (stage-prefixed layouts need :func:`open_draft`).
    """
    where = Path(path).parent if path else Path(".")
    recipe = get_recipe(layout) if layout else detect_recipe(config, path=path)
    return read_spec(Checkpoint(str(where), config, {}, []), recipe)


@dataclass
class OpenedDraft:
    """A drafter on disk: its folder's headers, the recipe it matched, and the spec read with it."""

    checkpoint: Checkpoint
    recipe: Recipe
    spec: DraftSpec


def open_draft(path: str | Path, *, layout: str | None = None) -> OpenedDraft:
    """Open a drafter in any known layout from config and headers only.

    Args:
        path: a drafter folder, a DeepSpec step folder, or a DeepSpec run folder (``step_latest`` is followed).
        layout: force a recipe by name instead of detecting it.

    Raises:
        CheckpointNotFoundError / CheckpointFormatError / UnsafeCheckpointError: see ``open_checkpoint``.
        LayoutError: no (or more than one) layout matches, or the config breaks the layout's rules.
    """
    folder = resolve_step_dir(path)
    # lazy: a drafter attached inside a 160 GB target (DeepSeek-V4) has its tensors in a few of the target's shards;
    # only those shards' headers are parsed (every shard of a standalone drafter is, as its tensors are all kept)
    ckpt = open_checkpoint(folder, lazy=True)
    recipe = get_recipe(layout) if layout else detect_recipe(ckpt.config, path=Path(folder) / "config.json")
    return OpenedDraft(ckpt, recipe, read_spec(ckpt, recipe))
