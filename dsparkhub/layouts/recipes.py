"""Layout recipes: ``converters/<layout>.yaml`` files that say how to detect a layout, read it into a
:class:`~dsparkhub.layouts.spec.DraftSpec` (``dsparkhub.layouts.reading``), and write a DraftSpec back out in that
layout (``dsparkhub.layouts.writing``). This module loads them, detects a layout and applies tensor-name rules.

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
- ``block_size_default: {value: N, source: why}``: the block size when the config records none (TorchSpec),
  with a note;
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
- ``confidence_head_default`` / ``confidence_head_with_markov_default``: the value when the config has no key for
  it (DeepSeek-V4: both true, as vLLM 0.32 builds the head whatever the config says);
- ``extra_keys``: layout keys carried in :attr:`DraftSpec.extras` and written back by recipes that list them too;
  ``extra_defaults``: ``{name: value}`` for an extra the config leaves out (the layout trainer's default);
- ``model_type_on_read``: ``{model_type: model_type}``, a drafter-only ``model_type`` read as the backbone's
  (TorchSpec's DFlash ``dflash`` is a Qwen3 layer; transformers, so vLLM, knows no ``dflash``);
- ``config_on_read``: ``{key: {key: DOTTED, format: as_is | comma_ints, default: V}}``, keys read from another
  spelling of the config (Mistral-native ``params.json``: ``dim`` is ``hidden_size``, ``mtp.depth`` the block size,
  ``"0,3"`` target layer ids) before the fields are, see :func:`dsparkhub.layouts.reading.config_on_read`;
- ``tensors.keep``: regular expressions; tensors matching none are not the drafter's (the target's, for attached
  layouts) and are ignored without a note;
- ``tensors.aliases_by_model_type``: ``{model_type: {canonical prefix read: canonical prefix}}``, names one model
  type's checkpoints spell otherwise (DeepSeek-V4.1 ``markov_head.embed.`` = ``markov_head.markov_w1.``);
- ``tensors.stages``: stage-prefixed layouts (DeepSeek-V4 ``mtp.{i}.*``): the stage count comes from the tensor
  names, the pieces listed in ``shared_on_last_stage`` sit on the last stage only (see :func:`stage_names`);
- ``write.templates``: keys whose values are computed from the spec (``"{proposals_per_block}"``; a string that
  is exactly one placeholder keeps the value's type);
- per-layout validation and release behaviour, as flags read through :attr:`Recipe.typed` (never by layout name):
  ``training_output`` (a trainer's own output, which vLLM does not load: ``push`` refuses it unconverted),
  ``records_target_layer_count`` (its ``num_target_layers`` field is the target's decoder-layer count: DSH306),
  ``family_bound`` (every variant, not only DSpark, serves targets of its backbone family only: DSH311),
  ``k3_config_rules`` (K3DSparkConfig's refusals: DSH109), ``minimax_config_rules`` (what vLLM 0.34's MiniMax-M3
  DSpark class cannot build: DSH116) and ``served_through_speculators`` (vLLM reads the config
  through ``speculators/algos.py``: DSH113 / DSH114, and exempt from DSH115 / DSH106), ``own_block_layout_reader``
  (its vLLM config class reads the block layout, not the native DSpark reader's ``sample_from_anchor`` default:
  exempt from DSH106), ``learned_mask_embedding`` (mask slots are a learned ``mask_embedding``, the sentinel id is
  out of vocab by design: no mask token id, exempt from DSH102);
- ``write.derive``: tensors the layout needs that are computed from others (speculators ``t2d`` from ``d2t``),
  see :data:`DERIVED_TENSORS`.
- ``write.keep_own``: tensors the layout's engine always reads from the drafter, never dropped as the target's
  (eagle3-hf ``lm_head.weight``); ``write.requires.extras``: ``{extra: value}`` the layout has no key for, at the
  one value its engine runs (eagle3-hf ``norm_before_residual: false``); ``convert`` refuses a drafter with another.

Every file is checked when loaded against :class:`~dsparkhub.layouts.schemas.RecipeSchema` (strict types, unknown
keys refused; the module docstring there has the import / load timings); ``Recipe.data`` is the parsed mapping itself.

Does not: touch tensor data; read a config into a DraftSpec (``dsparkhub.layouts.reading``); decide whether a
conversion is allowed (``dsparkhub.convert``).
"""

from __future__ import annotations

import fnmatch
import re

import msgspec
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.datafiles import converters_dir, load_yaml_mappings
from dsparkhub.layouts.schemas import RecipeSchema
from dsparkhub.layouts.spec import ANCHOR_FIRST, ONE_PLUS_N, DraftSpec

#: what :func:`get_key` returns for a missing key when no default is given
MISSING = object()


def get_key(config: dict, dotted: str, default=MISSING):
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
    typed: RecipeSchema | None = None  # the file read through its schema (the per-layout flags are read here)

    @property
    def rules(self) -> list[RenameRule]:
        """Tensor rename rules."""
        return [RenameRule(**r) for r in (self.data.get("tensors", {}).get("rename") or [])]

    def read_keys(self, name: str) -> list[str]:
        """Config keys holding canonical field ``name``, in read precedence."""
        keys = self.data.get("fields", {}).get(name) or []
        return list(keys["read"]) if isinstance(keys, dict) else list(keys)

    def read_value(self, name: str, value):
        """``value`` read for canonical field ``name``, its spelling mapped by ``fields.<name>.values`` (as is when
        the recipe lists no spelling for it)."""
        keys = self.data.get("fields", {}).get(name)
        spellings = keys.get("values") if isinstance(keys, dict) else None
        return spellings.get(value, value) if spellings and isinstance(value, str) else value

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
        if not all(get_key(config, k) is not MISSING for k in det.get("keys_present", [])):
            return False
        if any(get_key(config, k) is not MISSING for k in det.get("keys_absent", [])):
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


def keyed(config: dict, rule, default=None):
    """Resolve ``{key: K, values: {...}, default: D}`` against ``config`` (a plain value is returned as is)."""
    if not isinstance(rule, dict):
        return rule if rule is not None else default
    raw = get_key(config, rule["key"], None)
    return (rule.get("values") or {}).get(raw, rule.get("default", default))


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _check_recipe(data: dict, path: Path) -> None:
    """What the schema cannot say: rename rules use the same placeholders on both sides, and the tensor-name
    patterns are valid regular expressions.

    Raises:
        LayoutError: naming the key path and the bad value.
    """
    tensors, write = data.get("tensors") or {}, data.get("write") or {}
    for i, rule in enumerate(tensors.get("rename") or []):
        sides = [sorted(set(_PLACEHOLDER.findall(rule[k]))) for k in ("layout", "canonical")]
        if sides[0] != sides[1] or not set(sides[0]) <= {"i", "j", "rest"}:
            raise LayoutError(f"recipe key `tensors.rename[{i}]`: expected the same placeholders ({{i}}, {{j}}, "
                              f"{{rest}}) on both sides, found {rule['layout']!r} -> {rule['canonical']!r}", path=path)
    for key, patterns in (("tensors.drop", tensors.get("drop")), ("tensors.keep", tensors.get("keep")),
                          ("write.omit", write.get("omit"))):
        for i, pattern in enumerate(patterns or []):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise LayoutError(f"recipe key `{key}[{i}]`: expected a regular expression, found {pattern!r} "
                                  f"({exc})", path=path) from None


@lru_cache(maxsize=8)
def _load_recipes(folder: str) -> tuple[Recipe, ...]:
    out: dict[str, Recipe] = {}
    for path, data in load_yaml_mappings(folder, what="recipe", error=LayoutError, schema=RecipeSchema):
        _check_recipe(data, path)
        if data["name"] in out:
            raise LayoutError(f"recipe name {data['name']!r} is also the name of {out[data['name']].path}", path=path)
        out[data["name"]] = Recipe(data["name"], data.get("title") or data["name"], data, path,
                                   msgspec.convert(data, RecipeSchema))
    return tuple(out.values())


def load_recipes(folder: str | Path | None = None) -> list[Recipe]:
    """Every recipe in ``folder`` (default :func:`converters_dir`), sorted by file name.

    Raises:
        LayoutError: a file is not valid YAML, breaks :class:`~dsparkhub.layouts.schemas.RecipeSchema` (unknown key,
            wrong type, missing ``name`` / ``detect``; the message names the file and the key path), has a rename
            rule with different placeholders on its two sides or a bad regular expression, or reuses a name.
    """
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


def block_layout_of(recipe: Recipe) -> set[str]:
    """Block layouts the recipe can express when writing."""
    w = recipe.data.get("write") or {}
    if w.get("layout_key"):
        return {ANCHOR_FIRST, ONE_PLUS_N}
    fixed = recipe.data.get("block_layout")
    return {fixed} if isinstance(fixed, str) else {ANCHOR_FIRST, ONE_PLUS_N}
