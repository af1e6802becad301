"""Layout recipes: ``converters/<layout>.yaml`` files that say how to detect a layout, read it into a
:class:`~dsparkhub.layouts.spec.DraftSpec`, and write a DraftSpec back out in that layout.

A recipe is data (in the spirit of vLLM's ``WeightsMapper`` and mergekit's architecture files):

- ``detect``: ``architectures_any`` / ``keys_present`` / ``keys_absent`` conditions on ``config.json``;
- ``fields``: canonical field -> the config keys that hold it, first found wins on read, the first key is written
  (dotted keys reach into nested dicts: ``dflash_config.mask_token_id``); ``{read: [...], write: KEY}`` when the
  key to write is not the first one read;
- ``target_layer_ids_numbering``: ``layer_index`` or ``hidden_state_index`` (converted to layer index on read);
- ``block_layout``: fixed, or read from a key;
- ``tensors.rename``: ``{layout: "context_proj.{rest}", canonical: "fc.{rest}"}`` rules (``{i}`` matches an
  integer, ``{rest}`` anything); a name matching two rules is an error, never resolved by order;
  ``read_only: true`` on a rule renames on read only;
  ``tensors.drop``: layout names (regular expressions) dropped on read, each reported in the spec's notes
  (``tensors.drop_reason`` says why; default: vLLM does not use it);
- ``write``: architectures per family, constant keys, the key that records the block layout.

Extensions for the layouts beyond Qwen3 (each optional; see the recipe files for examples):

- ``detect.values``: ``{dotted key: value or [values]}`` that must match (``speculators_model_type: dspark``);
- ``decoder_config_key``: the nested dict that holds the backbone's HF config (speculators
  ``transformer_layer_config``); hidden / vocab / layer count are read from it and written back into it;
- ``variant: {key: K, values: {...}, default: ...}`` and ``family_by_key: {key: K, values: {...}}``: read from a key;
- ``block_layout.default_by_variant``: the layout assumed when the key is absent, per variant;
- ``target_layer_ids_numbering: {key: model_type, values: {deepseek_v4: hidden_state_index, ...}}``;
- ``frozen_copies``: canonical names of target tensors the layout's trainer copies frozen (DeepSpec: embedding and
  LM head); ``convert`` refuses a copy whose bytes differ from the target's (DSH312);
- ``final_layer_state``: ``raw`` (default) or ``normed``: how the layout's trainer saw the target's last layer, and
  ``final_layer_state_source`` the upstream line that says so (validate DSH304 / DSH313);
- ``block_size_default: {value: N, source: why}``: the block size when the config records none (TorchSpec),
  with a note;
- ``confidence_head_default`` / ``confidence_head_with_markov_default``: the value when the config has no key for
  it (DeepSeek-V4: both true, as vLLM 0.32 builds the head whatever the config says);
- ``extra_keys``: layout keys carried in :attr:`DraftSpec.extras` and written back by recipes that list them too;
- ``tensors.keep``: regular expressions; tensors matching none are not the drafter's (the target's, for attached
  layouts) and are ignored without a note;
- ``tensors.aliases_by_model_type``: ``{model_type: {canonical prefix read: canonical prefix}}``, names one model
  type's checkpoints spell otherwise (DeepSeek-V4.1 ``markov_head.embed.`` = ``markov_head.markov_w1.``);
- ``tensors.stages``: stage-prefixed layouts (DeepSeek-V4 ``mtp.{i}.*``): the stage count comes from the tensor
  names, the pieces listed in ``shared_on_last_stage`` sit on the last stage only (see :func:`stage_names`);
- ``write.templates``: keys whose values are computed from the spec (``"{proposals_per_block}"``; a string that
  is exactly one placeholder keeps the value's type);
- ``write.derive``: tensors the layout needs that are computed from others (speculators ``t2d`` from ``d2t``),
  see :data:`DERIVED_TENSORS`.

Does not: touch tensor data; decide whether a conversion is allowed (``dsparkhub.convert``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import reprlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from dsparkhub.io.checkpoint import Checkpoint, TensorInfo
from dsparkhub.errors import LayoutError
from dsparkhub.layouts.spec import ANCHOR_FIRST, ONE_PLUS_N, DraftSpec

#: libyaml's safe loader when PyYAML was built with it (~70x faster than the pure-Python one; same result)
SAFE_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MISSING = object()


def data_dir(kind: str) -> Path:
    """A top-level data folder (``converters`` or ``manifests``): ``$DSPARKHUB_<KIND>_DIR``, the copy shipped in
    the wheel (``dsparkhub/_data/<kind>``), or the repository's own folder."""
    env = os.environ.get(f"DSPARKHUB_{kind.upper()}_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent  # dsparkhub/
    packaged = package / "_data" / kind
    return packaged if packaged.is_dir() else package.parent / kind


def converters_dir() -> Path:
    """Folder of recipe files: ``$DSPARKHUB_CONVERTERS_DIR``, the copy shipped in the wheel, or the repo's."""
    return data_dir("converters")


def get_key(config: dict, dotted: str, default=_MISSING):
    """Read ``a.b.c`` from nested dicts; ``default`` (or the module's sentinel) when any level is missing."""
    node = config
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
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
    """One tensor-name rule: ``layout`` pattern <-> ``canonical`` pattern (same placeholders on both sides).

    ``read_only``: the rule renames on read only; written names stay canonical (z-lab DFlash2 codebooks, which
    dflash saves with a ``.weight`` suffix that vLLM refuses and dflash's own loader does not need).
    """

    layout: str
    canonical: str
    read_only: bool = False

    def __post_init__(self):
        self._to_canonical = _pattern_to_regex(self.layout)
        self._to_layout = _pattern_to_regex(self.canonical)

    def apply(self, name: str, *, to_canonical: bool) -> str | None:
        """The renamed name, or None when the rule does not match."""
        if self.read_only and not to_canonical:
            return None
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
        archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []  # hostile configs
        if det.get("architectures_any") and not set(archs) & set(det["architectures_any"]):
            return False
        for key, want in (det.get("values") or {}).items():
            if get_key(config, key, None) not in (want if isinstance(want, list) else [want]):
                return False
        if not all(get_key(config, k) is not _MISSING for k in det.get("keys_present", [])):
            return False
        if any(get_key(config, k) is not _MISSING for k in det.get("keys_absent", [])):
            return False
        return True

    @property
    def stages(self) -> dict | None:
        """The ``tensors.stages`` block of a stage-prefixed layout (DeepSeek-V4 ``mtp.{i}.*``), or None."""
        return (self.data.get("tensors") or {}).get("stages")

    def keeps(self, name: str) -> bool:
        """Whether a tensor of the source folder belongs to the drafter (``tensors.keep``; default all)."""
        keep = (self.data.get("tensors") or {}).get("keep")
        return not keep or any(re.fullmatch(p, name) for p in keep)

    def to_canonical(self, name: str, *, num_layers: int | None = None) -> str:
        """Canonical name of a layout tensor name (identity when no rule matches).

        Args:
            name: tensor name in the layout.
            num_layers: stage count, required for stage-prefixed layouts (``tensors.stages``).

        Raises:
            LayoutError: two rules match the name; a shared piece sits on a stage other than the last.
        """
        if self.stages:
            return stage_names(self, name, num_layers=num_layers, to_canonical=True)
        hits = {r.apply(name, to_canonical=True) for r in self.rules} - {None}
        if len(hits) > 1:
            raise LayoutError(f"recipe {self.name!r}: tensor {name!r} matches several rename rules: {sorted(hits)}",
                              path=self.path)
        return hits.pop() if hits else name

    def to_layout(self, name: str, *, num_layers: int | None = None) -> str:
        """Layout name of a canonical tensor name (identity when no rule matches).

        Args:
            name: canonical tensor name.
            num_layers: L, draft layers (= stages), required for stage-prefixed layouts.
        """
        if self.stages:
            return stage_names(self, name, num_layers=num_layers, to_canonical=False)
        hits = {r.apply(name, to_canonical=False) for r in self.rules} - {None}
        if len(hits) > 1:
            raise LayoutError(f"recipe {self.name!r}: canonical tensor {name!r} matches several rename rules: "
                              f"{sorted(hits)}", path=self.path)
        return hits.pop() if hits else name

    def is_ignored_file(self, filename: str) -> bool:
        """Whether a file in the source folder is known and deliberately not converted (training state, ...)."""
        return any(fnmatch.fnmatch(filename, pat) for pat in self.data.get("ignore_files") or [])


def stage_names(recipe: Recipe, name: str, *, num_layers: int | None, to_canonical: bool) -> str:
    """Rename between a stage-prefixed layout and canonical names (DeepSeek-V4 attached DSpark).

    Layout ``mtp.{i}.<rest>`` is canonical ``layers.{i}.<rest>``, except the pieces listed in
    ``tensors.stages.shared_on_last_stage`` (``main_proj.`` -> ``fc.``, ``main_norm.`` -> ``hidden_norm.``, ``norm.``,
    ``markov_head.``, ``confidence_head.``, ``hc_head_*``), which live on the last stage ``mtp.{S-1}.`` and are
    canonical without a layer prefix (fraserprice/dspark-vllm ``DSparkDraftModel.load_weights``; FORMATS §6).

    Raises:
        LayoutError: a name outside the stage prefix, a shared piece on another stage than the last, or
            ``num_layers`` missing.
    """
    st = recipe.stages
    prefix = st.get("prefix", "mtp.")
    shared: dict[str, str] = st.get("shared_on_last_stage") or {}
    if num_layers is None:
        raise LayoutError(f"recipe {recipe.name!r}: the stage count is needed to name {name!r}", path=recipe.path)
    last = num_layers - 1
    if to_canonical:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)\.(.+)", name)
        if not m:
            raise LayoutError(f"tensor {name!r} is not under the drafter prefix {prefix!r}{{stage}}.", path=recipe.path)
        i, rest = int(m.group(1)), m.group(2)
        for lay, canon in shared.items():
            if rest.startswith(lay):
                if i != last:
                    raise LayoutError(f"tensor {name!r} is a shared piece ({lay}*) but sits on stage {i}; it must sit "
                                      f"on the last stage {last} of {num_layers}", path=recipe.path)
                return canon + rest[len(lay):]
        return f"layers.{i}.{rest}"
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m:
        return f"{prefix}{m.group(1)}.{m.group(2)}"
    for lay, canon in shared.items():
        if name.startswith(canon):
            return f"{prefix}{last}.{lay}{name[len(canon):]}"
    raise LayoutError(f"canonical tensor {name!r} has no place in layout {recipe.name!r} (not a layer tensor and "
                      f"not one of the shared pieces {sorted(shared.values())})", path=recipe.path)


def _keyed(config: dict, rule, default=None):
    """Resolve ``{key: K, values: {...}, default: D}`` against ``config`` (a plain value is returned as is)."""
    if not isinstance(rule, dict):
        return rule if rule is not None else default
    raw = get_key(config, rule["key"], None)
    return (rule.get("values") or {}).get(raw, rule.get("default", default))


#: tensors a layout needs that are computed from other tensors when the source lacks them. Each function takes
#: the spec and a loader ``load(canonical_name) -> torch.Tensor`` and returns the tensor.
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


@lru_cache(maxsize=8)
def _load_recipes(folder: str) -> tuple[Recipe, ...]:
    out = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            data = yaml.load(path.read_text(), Loader=SAFE_YAML)
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


def resolve_output_recipe(to: str, spec: DraftSpec, folder: str | Path | None = None) -> Recipe:
    """The recipe to write ``spec`` with when the user asks for layout ``to``.

    ``--to vllm`` means "the layout vLLM 0.32 loads for this drafter": the ``vllm`` recipe for Qwen3 / Gemma4
    DSpark drafters, and the recipe that declares ``serves_vllm_for: {variant: [family]}`` for families vLLM loads in their
    own layout (Kimi K3 ``K3DSparkModel``, DeepSeek-V4 attached stages, EAGLE-3 in the speculators layout,
    DFlash / DFlash2 in the z-lab layout). Any
    other name is returned as is; whether it can hold the drafter is decided by ``plan_conversion`` (which names
    the reason) and :func:`can_hold`.

    Raises:
        LayoutError: unknown layout name.
    """
    recipe = get_recipe(to, folder)
    w = recipe.data.get("write") or {}
    # redirect families / variants the vllm recipe has no architecture for: a DFlash drafter is loaded by vLLM 0.32
    # as DFlashDraftModel / DFlash2DraftModel (registry.py), i.e. in the z-lab layout, not as Qwen3DSparkModel
    if to == "vllm" and (spec.family not in (w.get("architectures") or {})
                         or spec.variant not in (w.get("variants") or [spec.variant])):
        for other in load_recipes(folder):
            if spec.family in (other.data.get("serves_vllm_for") or {}).get(spec.variant, []) \
                    and can_hold(other, spec):
                return other
    return recipe


def can_hold(recipe: Recipe, spec: DraftSpec) -> bool:
    """Whether ``recipe`` can write a drafter of ``spec``'s family and variant."""
    w = recipe.data.get("write") or {}
    if w.get("architectures_by_variant"):
        ok = spec.variant in w["architectures_by_variant"]
        return ok and (not w.get("families") or spec.family in w["families"])
    ok_family = spec.family in (w.get("architectures") or {})
    return ok_family and spec.variant in (w.get("variants") or ["dspark", "dflash"])


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


def read_spec(ckpt: Checkpoint, recipe: Recipe) -> DraftSpec:
    """Read a checkpoint in ``recipe``'s layout into a :class:`DraftSpec` (config + headers only).

    Raises:
        LayoutError: a required key is missing or mistyped (block_size, target layer ids), or tensor names clash.
    """
    cfg = ckpt.config
    path = Path(ckpt.path) / "config.json"
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
    family = (_keyed(cfg, recipe.data.get("family_by_key"))
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
    variant = _keyed(cfg, recipe.data.get("variant")) or ("dspark" if markov_rank > 0 else "dflash")
    layout_rule = recipe.data.get("block_layout", ANCHOR_FIRST)
    if isinstance(layout_rule, dict):
        raw = get_key(cfg, layout_rule["key"])
        if raw is _MISSING:
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
    if _keyed(cfg, recipe.data.get("target_layer_ids_numbering"), "layer_index") == "hidden_state_index":
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
    decoder.pop("num_hidden_layers", None)
    decoder["num_hidden_layers"] = dcfg.get("num_hidden_layers")
    extras = {name: get_key(cfg, key) for name, key in extra_keys.items() if get_key(cfg, key) is not _MISSING}
    target_ref = {k: v for k in ("name_or_path", "architectures")
                  if (v := _field(cfg, recipe, f"verifier_{k}")) is not None}
    num_target_layers = _int_field(cfg, recipe, "num_target_layers", path)
    if num_target_layers is None and recipe.data.get("num_target_layers_from_decoder"):
        num_target_layers = dcfg.get("num_hidden_layers")

    from dsparkhub.layouts.causality import read_causality

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


def extra_key_map(recipe: Recipe) -> dict[str, str]:
    """``extra_keys`` of a recipe as {name in :attr:`DraftSpec.extras`: config key in the layout}.

    An entry is a key (carried under its own name) or ``{name: N, key: K}`` when layouts spell the same setting
    differently (DFlash2 ``conv_kernel_size`` at the top of a speculators config, ``dflash_config.conv_kernel_size``
    in z-lab's).
    """
    out = {}
    for entry in recipe.data.get("extra_keys") or []:
        name, key = (entry["name"], entry["key"]) if isinstance(entry, dict) else (entry, entry)
        out[name] = key
    return out


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
    if _keyed(cfg, recipe.data.get("target_layer_ids_numbering"), "layer_index") == "hidden_state_index":
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
    from dsparkhub.layouts.causality import write_causality

    write_causality(cfg, spec, recipe)
    cfg.update(w.get("constants") or {})
    tv = template_values(spec)
    for key, tmpl in (w.get("templates") or {}).items():
        set_key(cfg, key, _render(tmpl, tv))
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
    from dsparkhub.io.checkpoint import open_checkpoint, resolve_step_dir

    folder = resolve_step_dir(path)
    # lazy: a drafter attached inside a 160 GB target (DeepSeek-V4) has its tensors in a few of the target's shards;
    # only those shards' headers are parsed (every shard of a standalone drafter is, as its tensors are all kept)
    ckpt = open_checkpoint(folder, lazy=True)
    recipe = get_recipe(layout) if layout else detect_recipe(ckpt.config, path=Path(folder) / "config.json")
    return OpenedDraft(ckpt, recipe, read_spec(ckpt, recipe))
