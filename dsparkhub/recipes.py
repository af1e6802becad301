"""Layout recipes: ``converters/<layout>.yaml`` files that say how to detect a layout, read it into a
:class:`~dsparkhub.spec.DraftSpec`, and write a DraftSpec back out in that layout.

A recipe is data (in the spirit of vLLM's ``WeightsMapper`` and mergekit's architecture files):

- ``detect``: ``architectures_any`` / ``keys_present`` / ``keys_absent`` conditions on ``config.json``;
- ``fields``: canonical field -> the config keys that hold it, first found wins on read, the first key is written
  (dotted keys reach into nested dicts: ``dflash_config.mask_token_id``); ``{read: [...], write: KEY}`` when the
  key to write is not the first one read;
- ``target_layer_ids_numbering``: ``layer_index`` or ``hidden_state_index`` (converted to layer index on read);
- ``block_layout``: fixed, or read from a key;
- ``tensors.rename``: ``{layout: "context_proj.{rest}", canonical: "fc.{rest}"}`` rules (``{i}`` matches an
  integer, ``{rest}`` anything); a name matching two rules is an error, never resolved by order;
  ``tensors.drop``: layout names (regular expressions) dropped on read, each reported in the spec's notes;
- ``write``: architectures per family, constant keys, the key that records the block layout.

Does not: touch tensor data; decide whether a conversion is allowed (``dsparkhub.convert``).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from .checkpoint import Checkpoint, TensorInfo
from .errors import LayoutError
from .spec import ANCHOR_FIRST, ONE_PLUS_N, DraftSpec

CANONICAL_FIELDS = ("block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "markov_rank",
                    "markov_head_type", "confidence_head", "confidence_head_with_markov", "draft_vocab_size",
                    "target_hidden_size")
_MISSING = object()


def converters_dir() -> Path:
    """Folder of recipe files: ``$DSPARKHUB_CONVERTERS_DIR``, the copy shipped in the wheel, or the repo's."""
    env = os.environ.get("DSPARKHUB_CONVERTERS_DIR")
    if env:
        return Path(env)
    packaged = Path(__file__).parent / "_data" / "converters"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "converters"


def get_key(config: dict, dotted: str, default=_MISSING):
    """Read ``a.b.c`` from nested dicts; ``default`` (or the module's sentinel) when any level is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_key(config: dict, dotted: str, value) -> None:
    """Write ``a.b.c = value``, creating nested dicts as needed."""
    parts = dotted.split(".")
    node = config
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _pattern_to_regex(pattern: str) -> re.Pattern:
    out, pos = "", 0
    for m in re.finditer(r"\{(i|j|rest)\}", pattern):
        out += re.escape(pattern[pos:m.start()])
        out += rf"(?P<{m.group(1)}>\d+)" if m.group(1) in ("i", "j") else r"(?P<rest>.+)"
        pos = m.end()
    return re.compile(out + re.escape(pattern[pos:]) + r"\Z")


@dataclass
class RenameRule:
    """One tensor-name rule: ``layout`` pattern <-> ``canonical`` pattern (same placeholders on both sides)."""

    layout: str
    canonical: str

    def __post_init__(self):
        self._to_canonical = _pattern_to_regex(self.layout)
        self._to_layout = _pattern_to_regex(self.canonical)

    def apply(self, name: str, *, to_canonical: bool) -> str | None:
        """The renamed name, or None when the rule does not match."""
        m = (self._to_canonical if to_canonical else self._to_layout).match(name)
        if not m:
            return None
        return (self.canonical if to_canonical else self.layout).format(**m.groupdict())


@dataclass
class Recipe:
    """A parsed ``converters/<name>.yaml`` (see the module docstring for the keys)."""

    name: str
    title: str
    data: dict
    path: Path

    @property
    def rules(self) -> list[RenameRule]:
        """Tensor rename rules."""
        return [RenameRule(**r) for r in (self.data.get("tensors", {}).get("rename") or [])]

    def read_keys(self, name: str) -> list[str]:
        """Config keys holding canonical field ``name``, in read precedence."""
        keys = self.data.get("fields", {}).get(name) or []
        return list(keys["read"]) if isinstance(keys, dict) else list(keys)

    def write_key(self, name: str) -> str | None:
        """Config key written for canonical field ``name`` (None: the layout has no such key)."""
        keys = self.data.get("fields", {}).get(name) or []
        if isinstance(keys, dict):
            return keys["write"]
        return keys[0] if keys else None

    @property
    def drop(self) -> list[str]:
        """Regular expressions of layout tensor names dropped on read."""
        return list(self.data.get("tensors", {}).get("drop") or [])

    def matches(self, config: dict) -> bool:
        """Whether ``config`` satisfies every ``detect`` condition."""
        det = self.data.get("detect", {})
        archs = config.get("architectures") or []
        if det.get("architectures_any") and not set(archs) & set(det["architectures_any"]):
            return False
        if not all(get_key(config, k) is not _MISSING for k in det.get("keys_present", [])):
            return False
        if any(get_key(config, k) is not _MISSING for k in det.get("keys_absent", [])):
            return False
        return True

    def to_canonical(self, name: str) -> str:
        """Canonical name of a layout tensor name (identity when no rule matches).

        Raises:
            LayoutError: two rules match the name.
        """
        hits = {r.apply(name, to_canonical=True) for r in self.rules} - {None}
        if len(hits) > 1:
            raise LayoutError(f"recipe {self.name!r}: tensor {name!r} matches several rename rules: {sorted(hits)}",
                              path=self.path)
        return hits.pop() if hits else name

    def to_layout(self, name: str) -> str:
        """Layout name of a canonical tensor name (identity when no rule matches)."""
        hits = {r.apply(name, to_canonical=False) for r in self.rules} - {None}
        if len(hits) > 1:
            raise LayoutError(f"recipe {self.name!r}: canonical tensor {name!r} matches several rename rules: "
                              f"{sorted(hits)}", path=self.path)
        return hits.pop() if hits else name

    def is_ignored_file(self, filename: str) -> bool:
        """Whether a file in the source folder is known and deliberately not converted (training state, ...)."""
        return any(fnmatch.fnmatch(filename, pat) for pat in self.data.get("ignore_files") or [])


@lru_cache(maxsize=8)
def _load_recipes(folder: str) -> tuple[Recipe, ...]:
    out = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise LayoutError(f"recipe is not valid YAML: {exc}", path=path) from None
        if not isinstance(data, dict) or "name" not in data or "detect" not in data:
            raise LayoutError("recipe must be a mapping with at least `name` and `detect`", path=path)
        out.append(Recipe(data["name"], data.get("title", data["name"]), data, path))
    return tuple(out)


def load_recipes(folder: str | Path | None = None) -> list[Recipe]:
    """Every recipe in ``folder`` (default :func:`converters_dir`), sorted by file name."""
    return list(_load_recipes(str(folder or converters_dir())))


def get_recipe(name: str, folder: str | Path | None = None) -> Recipe:
    """The recipe called ``name``.

    Raises:
        LayoutError: unknown name (the message lists the known ones).
    """
    recipes = load_recipes(folder)
    for r in recipes:
        if r.name == name:
            return r
    raise LayoutError(f"unknown layout {name!r}; known layouts: {', '.join(r.name for r in recipes)}")


def detect_recipe(config: dict, *, path: str | Path | None = None, folder: str | Path | None = None) -> Recipe:
    """The one recipe whose ``detect`` conditions ``config`` meets.

    Raises:
        LayoutError: no recipe matches (the message shows the architectures and lists known layouts), or several do.
    """
    recipes = load_recipes(folder)
    hits = [r for r in recipes if r.matches(config)]
    if len(hits) == 1:
        return hits[0]
    archs = config.get("architectures")
    if not hits:
        raise LayoutError(
            f"config.json (architectures={archs}, model_type={config.get('model_type')!r}) matches no known drafter "
            f"layout", path=path,
            hint=f"known layouts: {', '.join(r.name for r in recipes)}; pass --layout NAME to force one")
    raise LayoutError(f"config.json matches several layouts: {[r.name for r in hits]}", path=path,
                      hint="pass --layout NAME to choose")


def _field(config: dict, recipe: Recipe, name: str, default=None):
    for key in recipe.read_keys(name):
        value = get_key(config, key)
        if value is not _MISSING and value is not None:
            return value
    return default


def _int_field(config, recipe, name, path, default=None):
    value = _field(config, recipe, name, default)
    if value is not None and (type(value) is not int):
        keys = recipe.read_keys(name)
        raise LayoutError(f"config key {keys[0] if keys else name!r} must be an integer, found {value!r}",
                          path=path)
    return value


def read_spec(ckpt: Checkpoint, recipe: Recipe) -> DraftSpec:
    """Read a checkpoint in ``recipe``'s layout into a :class:`DraftSpec` (config + headers only).

    Raises:
        LayoutError: a required key is missing or mistyped (block_size, target layer ids), or tensor names clash.
    """
    cfg = ckpt.config
    path = Path(ckpt.path) / "config.json"
    archs = cfg.get("architectures") or ["?"]
    arch = archs[0]
    family = recipe.data.get("family_by_architecture", {}).get(arch) or recipe.data.get("family") or "qwen3"
    notes: list[str] = []

    block_size = _int_field(cfg, recipe, "block_size", path)
    if block_size is None:
        raise LayoutError(f"config has no block size (looked for {recipe.read_keys('block_size')})",
                          path=path)
    layout_rule = recipe.data.get("block_layout", ANCHOR_FIRST)
    if isinstance(layout_rule, dict):
        raw = get_key(cfg, layout_rule["key"])
        if raw is _MISSING:
            block_layout = layout_rule["default"]
            notes.append(f"`{layout_rule['key']}` not set; assumed {block_layout} (vLLM's default for this layout)")
        else:
            block_layout = layout_rule["true" if raw else "false"]
    else:
        block_layout = layout_rule

    ids = _field(cfg, recipe, "target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise LayoutError(f"target layer ids must be a non-empty list of integers, found {ids!r} (keys "
                          f"{recipe.read_keys('target_layer_ids')})", path=path)
    if recipe.data.get("target_layer_ids_numbering") == "hidden_state_index":
        ids = [i - 1 for i in ids]

    markov_rank = _int_field(cfg, recipe, "markov_rank", path, 0) or 0
    variant = recipe.data.get("variant") or ("dspark" if markov_rank > 0 else "dflash")
    hidden = cfg.get("hidden_size")
    vocab = cfg.get("vocab_size")
    if type(hidden) is not int or type(vocab) is not int:
        raise LayoutError(f"config must give integer hidden_size and vocab_size, found {hidden!r} and {vocab!r}",
                          path=path)

    tensors: dict[str, TensorInfo] = {}
    source_names: dict[str, str] = {}
    for name, info in ckpt.tensors.items():
        if any(re.fullmatch(p, name) for p in recipe.drop):
            notes.append(f"tensor {name!r} is not used by vLLM and is dropped")
            continue
        canon = recipe.to_canonical(name)
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
    decoder = {k: v for k, v in cfg.items() if k not in used and k not in dropped and "." not in k}
    decoder.pop("num_hidden_layers", None)
    decoder["num_hidden_layers"] = cfg.get("num_hidden_layers")

    return DraftSpec(
        layout=recipe.name, variant=variant, family=family, architecture=arch,
        block_size=block_size, block_layout=block_layout, target_layer_ids=list(ids),
        num_target_layers=_int_field(cfg, recipe, "num_target_layers", path),
        markov_rank=markov_rank,
        markov_head_type=_field(cfg, recipe, "markov_head_type", "vanilla" if markov_rank else None),
        confidence_head=bool(_field(cfg, recipe, "confidence_head", False)),
        confidence_head_with_markov=bool(_field(cfg, recipe, "confidence_head_with_markov", False)),
        vocab_size=vocab, draft_vocab_size=draft_vocab,
        mask_token_id=_int_field(cfg, recipe, "mask_token_id", path),
        hidden_size=hidden,
        target_hidden_size=_int_field(cfg, recipe, "target_hidden_size", path, hidden) or hidden,
        num_layers=cfg.get("num_hidden_layers") or 0,
        decoder_config=decoder, tensors=tensors, source_names=source_names, notes=notes,
    )


def write_config(spec: DraftSpec, recipe: Recipe) -> dict:
    """The ``config.json`` of ``spec`` in ``recipe``'s layout.

    Raises:
        LayoutError: the recipe cannot express the spec's family.
    """
    w = recipe.data.get("write") or {}
    archs = (w.get("architectures") or {}).get(spec.family)
    if not archs:
        raise LayoutError(f"layout {recipe.name!r} cannot hold a {spec.family} drafter", path=recipe.path)
    cfg = {"architectures": list(archs)}
    cfg.update({k: v for k, v in spec.decoder_config.items() if v is not None})
    cfg["num_hidden_layers"] = spec.num_layers
    values = {
        "block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.target_layer_ids), "num_target_layers": spec.num_target_layers,
        "markov_rank": spec.markov_rank if spec.variant == "dspark" else None,
        "markov_head_type": spec.markov_head_type if spec.variant == "dspark" else None,
        "confidence_head": spec.confidence_head if spec.variant == "dspark" else None,
        "confidence_head_with_markov": spec.confidence_head_with_markov if spec.variant == "dspark" else None,
        "draft_vocab_size": spec.draft_vocab_size if spec.draft_vocab_size != spec.vocab_size else None,
        "target_hidden_size": spec.target_hidden_size if spec.target_hidden_size != spec.hidden_size else None,
    }
    if recipe.data.get("target_layer_ids_numbering") == "hidden_state_index":
        values["target_layer_ids"] = [i + 1 for i in spec.target_layer_ids]
    for name, value in values.items():
        key = recipe.write_key(name)
        if key and value is not None:
            set_key(cfg, key, value)
    layout_key = w.get("layout_key")
    if layout_key:
        for key, by_layout in layout_key.items():
            set_key(cfg, key, by_layout[spec.block_layout])
    cfg.update(w.get("constants") or {})
    return cfg


def block_layout_of(recipe: Recipe) -> set[str]:
    """Block layouts the recipe can express when writing."""
    w = recipe.data.get("write") or {}
    if w.get("layout_key"):
        return {ANCHOR_FIRST, ONE_PLUS_N}
    fixed = recipe.data.get("block_layout")
    return {fixed} if isinstance(fixed, str) else {ANCHOR_FIRST, ONE_PLUS_N}


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
    from .checkpoint import open_checkpoint, resolve_step_dir

    folder = resolve_step_dir(path)
    ckpt = open_checkpoint(folder)
    recipe = get_recipe(layout) if layout else detect_recipe(ckpt.config, path=Path(folder) / "config.json")
    return OpenedDraft(ckpt, recipe, read_spec(ckpt, recipe))
