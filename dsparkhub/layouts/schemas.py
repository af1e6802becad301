"""Typed, strict schemas of the YAML data files (recipes, family tables, target / release manifests), as msgspec
Structs; :func:`dsparkhub.layouts.schema_errors.check` checks a parsed file against one.

Every Struct refuses unknown keys (``forbid_unknown_fields``) and checks types strictly (no ``"1"`` for ``1``, no
``true`` for an integer). What has a fixed shape is typed; the maps that are open by design stay ``dict[str, Any]``,
each with a comment saying why (config keys copied verbatim into a written ``config.json``, a target's further HF
config keys, vLLM's own ``speculative_config``, published settings as their publisher names them). The readers keep
the parsed YAML mapping itself (``Recipe.data``, the family tables, the manifests' dict fields): the Structs only
check it, so callers see exactly what the file says (a key absent stays absent).

A file that breaks its schema raises the reader's error class (``LayoutError`` for recipes and family tables,
``ManifestError`` for manifests) naming the file, the key path (``tensors.rename[3].canonical``,
``facts.hidden_size.verified``), what was expected and what was found (``dsparkhub.layouts.schema_errors``
translates msgspec's own message).

Why msgspec and not pydantic (which ``verify.results`` uses): these files are read at the start of every
header-only ``dsparkhub validate``, whose wall time is a measured goal (issue 18: < 0.25 s). msgspec is imported by
``dsparkhub.io.header`` anyway (~7 ms); pydantic's import alone costs ~0.1-0.2 s. Measured (2026-12-02, 2 shared
cores, bytecode cached; median of 31 interleaved fresh processes, main vs this change): ``python -X importtime -c
"import dsparkhub.layouts.recipes"`` cumulative 87.5 -> 94.5 ms; loading every recipe + manifest + family table
(``load_recipes()`` + ``load_manifests()`` + ``families._tables``) 46.7 -> 50.0 ms. The ~10 ms are: creating these
Structs at import (~2.9 ms; annotations are real objects, not strings: with ``from __future__ import annotations``
the first ``msgspec.convert`` has to evaluate them, 8.8 ms instead of 3 ms), ``schema_errors`` (~0.9 ms), msgspec
building its type info on the first convert of each schema (~3 ms; later converts of all 29 files: 0.5 ms), and
parsing the family tables' expressions up front (~1 ms, reused by ``families.evaluate``). The YAML parse itself
(~40 ms, PyYAML's Python constructor over libyaml's parser) is unchanged and is most of the load time.

Upstream: msgspec 0.18+ ``msgspec.convert`` / ``Struct(forbid_unknown_fields=True)`` / ``msgspec.field(name=...)``
(https://jcristharif.com/msgspec/structs.html). Does not: parse YAML (``dsparkhub.layouts.datafiles``) or interpret
what a file says (``recipes``, ``families``, ``manifests``).
"""

# no ``from __future__ import annotations``: see above (real annotation objects make the first convert cheap)
from typing import Annotated, Any, Literal, Union

import msgspec

from dsparkhub.io.header import DTYPE_BITS


class _Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of every schema: unknown keys are refused (inherited by subclasses)."""


# ---------------------------------------------------------------------------------------------------- recipes

#: the two block layouts (``dsparkhub.layouts.spec.ANCHOR_FIRST`` / ``ONE_PLUS_N``)
BlockLayout = Literal["anchor_first", "one_plus_n"]
Scalar = Union[str, int, float, bool, None]


class Keyed(_Strict):
    """``{key: K, values: {...}, default: D}``: a value read from config key ``K`` (``recipes.keyed``)."""

    key: str
    values: dict[str, str] = {}
    default: str | None = None


class Detect(_Strict):
    """``detect``: conditions on ``config.json`` (``Recipe.matches``)."""

    architectures_any: list[str] = []
    keys_present: list[str] = []
    keys_absent: list[str] = []
    values: dict[str, Scalar | list[Scalar]] = {}


class BlockLayoutRule(_Strict):
    """``block_layout: {key: sample_from_anchor, "true": ..., "false": ..., default / default_by_variant}``."""

    key: str
    when_true: BlockLayout = msgspec.field(name="true")
    when_false: BlockLayout = msgspec.field(name="false")
    default: BlockLayout | None = None
    default_by_variant: dict[str, BlockLayout] = {}


class FieldKeys(_Strict):
    """``fields.<name>: {read: [...], write: KEY, values: {spelling: canonical}}`` when the key written is not the
    first one read, or a value has several spellings (TorchSpec's Markov head ``classical`` = ``vanilla``)."""

    read: list[str]
    write: str | None
    values: dict[str, str] = {}


class ExtraKey(_Strict):
    """``extra_keys`` entry ``{name: N, key: K}``: a setting carried as ``DraftSpec.extras[N]``, at config key K."""

    name: str
    key: str


class KeyOnRead(_Strict):
    """``config_on_read`` entry: the config key (dotted) a key is read from, how its value is spelled there
    (``comma_ints``: ``"0,3,5"`` -> ``[0, 3, 5]``) and the value when the key is absent."""

    key: str | None = None
    format: Literal["as_is", "comma_ints"] = "as_is"
    default: Any = None


class RenameRuleSchema(_Strict):
    """``tensors.rename`` entry (``recipes.RenameRule``)."""

    layout: str
    canonical: str
    read_only: bool = False


class Stages(_Strict):
    """``tensors.stages``: stage-prefixed layouts (``recipes.stage_names``)."""

    prefix: str = "mtp."
    count_keys: list[str] = []
    shared_on_last_stage: dict[str, str] = {}


class Tensors(_Strict):
    """``tensors``: rename / drop / keep rules."""

    rename: list[RenameRuleSchema] = []
    drop: list[str] = []
    drop_reason: str | None = None
    keep: list[str] = []
    stages: Stages | None = None
    aliases_by_model_type: dict[str, dict[str, str]] = {}


class ByLayout(_Strict):
    """``write.layout_key.<key>``: the value written for each block layout."""

    anchor_first: Any  # a config value (true / false for sample_from_anchor)
    one_plus_n: Any


class Requires(_Strict):
    """``write.requires``: limits of the layout (``convert.plan``)."""

    full_vocab: bool = False
    # extras the layout has no key for, at the one value its engine runs (eagle3-hf: norm_before_residual false)
    extras: dict[str, bool] = {}


class Write(_Strict):
    """``write``: how a DraftSpec is written in the layout (``layouts.writing.write_config``)."""

    architectures: dict[str, list[str]] = {}
    architectures_by_variant: dict[str, list[str]] = {}
    # extra name -> architectures written instead when the spec carries that extra (a non-empty value)
    architectures_by_extra: dict[str, list[str]] = {}
    families: list[str] = []
    variants: list[str] = []
    # not read: documents that the layout keeps the decoder's own model_type
    model_type: Literal["keep"] | None = None
    # open: keys copied verbatim into the written config.json (any JSON value)
    constants: dict[str, Any] = {}
    # open: config keys whose (nested) values are filled from the spec ("{proposals_per_block}")
    templates: dict[str, Any] = {}
    layout_key: dict[str, ByLayout] | None = None
    requires: Requires = msgspec.field(default_factory=Requires)
    omit: list[str] = []
    # tensors the engine reads from the drafter even when they equal the target's (never dropped as shared)
    keep_own: list[str] = []
    # the tensors ``layouts.writing.DERIVED_TENSORS`` can compute (a test keeps the two equal)
    derive: list[Literal["t2d"]] = []
    mirror: dict[str, list[str]] = {}


class BlockSizeDefault(_Strict):
    """``block_size_default``: the block size assumed when the config records none, and why."""

    value: Annotated[int, msgspec.Meta(gt=0)]
    source: str


class RecipeSchema(_Strict):
    """A ``converters/<layout>.yaml`` file (the keys are described in ``dsparkhub.layouts.recipes``)."""

    name: str
    detect: Detect
    title: str = ""
    family: str | None = None
    variant: str | Keyed | None = None
    family_by_architecture: dict[str, str] = {}
    family_by_key: Keyed | None = None
    decoder_config_key: str | None = None
    block_layout: BlockLayout | BlockLayoutRule = "anchor_first"
    fields: dict[str, list[str] | FieldKeys] = {}
    target_layer_ids_numbering: Literal["layer_index", "hidden_state_index"] | Keyed = "layer_index"
    block_size_default: BlockSizeDefault | None = None
    confidence_head_default: bool = False
    confidence_head_with_markov_default: bool = False
    num_target_layers_from_decoder: bool = False
    requires_num_target_layers: bool = False
    extra_keys: list[str | ExtraKey] = []
    extra_defaults: dict[str, bool | int | float | str] = {}
    model_type_on_read: dict[str, str] = {}
    config_on_read: dict[str, KeyOnRead] = {}
    learned_mask_embedding: bool = False
    drop_keys: list[str] = []
    frozen_copies: list[str] = []
    final_layer_state: Literal["raw", "normed"] = "raw"
    final_layer_state_source: str | None = None
    causality: Literal["vllm", "speculators"] | None = None
    sliding_window_non_causal_default: dict[str, bool] = {}
    tensors: Tensors = msgspec.field(default_factory=Tensors)
    ignore_files: list[str] = []
    serves_vllm_for: dict[str, list[str]] = {}
    # per-layout behaviour (dsparkhub.layouts.recipes docstring): flags, not checks of a layout's name
    training_output: bool = False
    records_target_layer_count: bool = False
    family_bound: bool = False
    k3_config_rules: bool = False
    minimax_config_rules: bool = False
    served_through_speculators: bool = False
    own_block_layout_reader: bool = False
    write: Write = msgspec.field(default_factory=Write)


# ------------------------------------------------------------------------------------------------ family tables

#: a table expression: an integer or a string such as ``"nh * hd"`` (``families.evaluate``)
Expr = Union[str, int]


class FamilyVar(_Strict):
    """``vars.<name>``: the first of ``keys`` set in the config, else ``default``; ``equals``: a 1 / 0 flag."""

    keys: list[str] = []
    default: Expr = "0"
    equals: str | list[str] | None = None


class ExpectedEntry(_Strict):
    """One expected tensor of a family table."""

    name: str
    shape: list[Expr] | Literal["any"]
    optional: bool = False
    when: Expr | bool = "1"


class FamilyTableSchema(_Strict):
    """A ``converters/families/<family>[-<variant>].yaml`` table, or ``_heads.yaml`` (``tensors`` only)."""

    family: str | None = None
    target_model_types: list[str] = []
    variants: list[str] = []
    markov_head_types: list[str] = []
    open_layers: bool = False
    vars: dict[str, FamilyVar] = {}
    per_layer: list[ExpectedEntry] = []
    backbone: list[ExpectedEntry] = []
    tensors: list[ExpectedEntry] = []


# ---------------------------------------------------------------------------------------------------- manifests

DtypeCode = Annotated[Literal[tuple(DTYPE_BITS)], msgspec.Meta(description="a safetensors dtype code")]  # type: ignore[valid-type]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class Fact(_Strict):
    """``facts.<field>``: whether a value is verified, and by what."""

    verified: bool
    source: str


class TensorRefSchema(_Strict):
    """``embed`` / ``lm_head``: a tensor as stored in the checkpoint."""

    name: str
    shape: list[NonNegativeInt]
    dtype: DtypeCode


class DrafterDefaults(_Strict):
    """``drafter_defaults``: the drafter settings the seeds used (target layer ids in layer-index numbering)."""

    target_layer_ids: list[int] | None = None
    block_size: PositiveInt | None = None
    mask_token_id: NonNegativeInt | None = None
    markov_rank: NonNegativeInt | None = None
    num_draft_layers: PositiveInt | None = None
    num_speculative_tokens: PositiveInt | None = None
    stages: PositiveInt | None = None


class Serving(_Strict):
    """``serving``: the serving settings the seeds published."""

    engine: str | None = None
    # open: vLLM's own speculative_config / compilation_config keys, passed to the engine as they are
    speculative_config: dict[str, Any] = {}
    compilation_config: dict[str, Any] = {}
    tensor_parallel_size: PositiveInt | None = None
    # a layout across nodes (vLLM on Ray): stages and nodes; dsparkhub.card.multinode writes its commands
    pipeline_parallel_size: PositiveInt | None = None
    nodes: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    batch_size: PositiveInt | None = None
    temperature: float | None = None
    cuda_graphs: bool | None = None
    notes: str | None = None


class TemplateTensor(_Strict):
    """A checkpoint tensor template (``dsparkhub.skeleton``): ``{i}`` over layers, ``repeat: {e: E}``."""

    name: str
    shape: list[Expr]
    dtype: DtypeCode
    when: Expr | None = None
    repeat: dict[str, Expr] = {}


class CheckpointLayout(_Strict):
    """``checkpoint``: shard count and how the tensor list is made (``dsparkhub.skeleton``)."""

    shards: PositiveInt = 1
    source: Literal["templates", "transformers", "none"] = "none"
    vars: dict[str, int] = {}
    tiny: dict[str, int] = {}
    tiny_config: dict[str, int] = {}
    model_class: str | None = msgspec.field(default=None, name="class")
    dtype: DtypeCode | None = None
    head: list[TemplateTensor] = []
    per_layer: list[TemplateTensor] = []
    tail: list[TemplateTensor] = []


class TargetSchema(_Strict):
    """A ``manifests/targets/<name>.yaml`` file (``manifests.TargetManifest`` describes the keys)."""

    name: str
    title: str
    repo_id: str
    model_type: str
    architecture: str
    family: str
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    vocab_size: PositiveInt
    embed: TensorRefSchema
    lm_head: TensorRefSchema
    license: str
    kind: Literal["target"] = "target"
    text_model_type: str | None = None
    tied: bool = False
    # open: further text-config keys of the target (heads, MLA ranks, experts, ...), any HF config value
    config: dict[str, Any] = {}
    quantization: str = ""
    drafter_defaults: DrafterDefaults = msgspec.field(default_factory=DrafterDefaults)
    serving: Serving = msgspec.field(default_factory=Serving)
    checkpoint: CheckpointLayout = msgspec.field(default_factory=CheckpointLayout)
    facts: dict[str, Fact] = {}
    confirmed_by: list[str] = []


class PublishedRow(_Strict):
    """``published`` row: a metric, its value, its source, and the conditions it was measured under."""

    metric: str
    value: str | float  # "+60-85%" as published, or a number
    source: str
    target: str | None = None
    drafter: str | None = None
    note: str | None = None
    num_speculative_tokens: PositiveInt | None = None
    engine: str | None = None
    batch_size: PositiveInt | None = None
    concurrency: PositiveInt | None = None
    temperature: float | None = None
    tensor_parallel_size: PositiveInt | None = None
    datasets: list[str] = []
    aggregate: str | None = None


class ReleaseSchema(_Strict):
    """A ``manifests/releases/<name>.yaml`` file (``manifests.ReleaseManifest`` describes the keys)."""

    name: str
    title: str
    publisher: str
    target: str
    layout: str
    variant: str
    published: list[PublishedRow]
    kind: Literal["release"] = "release"
    repo_id: str | None = None
    # open: the drafter's settings as its publisher names them (dspark_target_layer_ids, draft_vocab_size, ...)
    settings: dict[str, Any] = {}
    facts: dict[str, Fact] = {}
