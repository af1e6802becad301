"""Manifests: what dsparkhub knows about the real targets and the seed drafter releases, as YAML data.

``manifests/targets/<name>.yaml`` describes a target (Hub repo, model type, geometry, embedding / LM-head tensors,
quantization, the drafter settings the seeds used, serving settings, license, and the checkpoint's tensor layout as
templates for real-size skeletons). ``manifests/releases/<name>.yaml`` describes a published drafter (publisher, repo,
target manifest, layout, settings, published numbers with their source). Every value carries its provenance in
``facts``: ``{field: {verified: bool, source: str}}``; FORMATS.md's *unverified* values stay ``verified: false``
until a source confirms them. Each file is checked against :class:`~dsparkhub.layouts.schemas.TargetSchema` /
:class:`~dsparkhub.layouts.schemas.ReleaseSchema` (strict types, unknown keys refused; the message names the file and
the key path), then across fields here.

A manifest name works wherever a target is expected (``--target kimi-k2.6``): :func:`dsparkhub.target.target_spec_from_manifest`
builds a :class:`~dsparkhub.target.TargetSpec` whose tensors are header-like :class:`TensorInfo` without data.

Folder resolution follows :func:`dsparkhub.layouts.datafiles.converters_dir`: ``$DSPARKHUB_MANIFESTS_DIR``, the copy shipped
in the wheel (``dsparkhub/_data/manifests``), or the repository's ``manifests/``.

Does not: touch the network (manifests are checked-in data) or load any weights.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from dsparkhub.io.header import DTYPE_BITS
from dsparkhub.io.checkpoint import TensorInfo
from dsparkhub.errors import ManifestError
from dsparkhub.layouts.datafiles import data_dir, load_yaml_mappings
from dsparkhub.layouts.schemas import ReleaseSchema, TargetSchema



def manifests_dir() -> Path:
    """Folder of manifests: ``$DSPARKHUB_MANIFESTS_DIR``, the copy shipped in the wheel, or the repo's."""
    return data_dir("manifests")


@dataclass(frozen=True)
class TensorRef:
    """A named tensor of a target checkpoint: name, shape, safetensors dtype code."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class TargetManifest:
    """A target model (see the module docstring). Geometry is the text model's.

    Attributes:
        name / title / repo_id: manifest id, human title, Hub repo id.
        model_type / text_model_type / architecture / family: HF config ``model_type`` (top level and text model),
            ``architectures[0]``, and the dsparkhub family of its decoder.
        hidden_size / num_hidden_layers / vocab_size: Ht, decoder layers, V.
        embed / lm_head: the embedding and LM-head tensors as stored in the checkpoint.
        tied: ``tie_word_embeddings``.
        config: further text-config keys (heads, MLA ranks, experts, ...) used by skeletons and meta-device checks.
        quantization: notes on how the checkpoint is quantized.
        drafter_defaults: ``target_layer_ids`` (layer index), ``block_size``, ``mask_token_id``,
            ``num_speculative_tokens``, ``markov_rank`` the seeds used.
        serving: the serving settings the seeds published (engine, tp, max_model_len, speculative_config, ...).
        license: Hub license id.
        checkpoint: shard count and tensor templates for :mod:`dsparkhub.skeleton`.
        facts: field -> ``{"verified": bool, "source": str}``.
        path: the YAML file.
    """

    name: str
    title: str
    repo_id: str
    model_type: str
    architecture: str
    family: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    embed: TensorRef
    lm_head: TensorRef
    license: str
    text_model_type: str | None = None
    tied: bool = False
    config: dict = field(default_factory=dict)
    quantization: str = ""
    drafter_defaults: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    checkpoint: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    confirmed_by: list = field(default_factory=list)
    path: str = ""

    def verified(self, name: str) -> bool | None:
        """Whether ``facts`` marks field ``name`` verified (None when the manifest says nothing)."""
        f = self.facts.get(name)
        return None if f is None else bool(f.get("verified"))

    def to_dict(self) -> dict:
        """Plain JSON types (what ``manifests show --json`` prints)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("embed", "lm_head"):
            t = out[k]
            out[k] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
        return out


@dataclass
class ReleaseManifest:
    """A published drafter release and its published numbers (FORMATS §9).

    Attributes:
        name / title / publisher / repo_id: manifest id, title, who published it, Hub repo (may be unverified).
        target: the target manifest's name.
        layout / variant: the recipe that reads it and ``dspark`` | ``dflash`` | ``eagle3``.
        settings: block size, num_speculative_tokens, draft vocab, ... as published.
        published: list of ``{metric, value, ...conditions, source}`` rows.
        facts: field -> ``{"verified": bool, "source": str}``.
    """

    name: str
    title: str
    publisher: str
    target: str
    layout: str
    variant: str
    published: list
    repo_id: str | None = None
    settings: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    path: str = ""

    def to_dict(self) -> dict:
        """Plain JSON types."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_facts(data: dict, path: Path) -> None:
    """Each ``facts`` entry describes a field the manifest has (their shape is the schema's)."""
    for key in data.get("facts") or {}:
        if key.split(".")[0] not in data:
            raise ManifestError(f"manifest key `facts.{key}` describes a field the manifest does not have", path=path)


def _load_target(data: dict, path: Path) -> TargetManifest:
    """A target manifest from a mapping :class:`~dsparkhub.layouts.schemas.TargetSchema` accepted, after the checks
    across fields (facts name fields; embed / LM-head shapes are [V, H]; target layer ids are layer indices)."""
    _check_facts(data, path)
    embed, head = (TensorRef(str(data[k]["name"]), tuple(data[k]["shape"]), data[k]["dtype"])
                   for k in ("embed", "lm_head"))
    for ref, what in ((embed, "embed"), (head, "lm_head")):
        if ref.shape != (data["vocab_size"], data["hidden_size"]):
            raise ManifestError(f"`{what}.shape` {list(ref.shape)} disagrees with [vocab_size, hidden_size] = "
                                f"[{data['vocab_size']}, {data['hidden_size']}]", path=path)
    ids = (data.get("drafter_defaults") or {}).get("target_layer_ids")
    if ids is not None and not all(-1 <= i < data["num_hidden_layers"] for i in ids):
        raise ManifestError(f"`drafter_defaults.target_layer_ids` {ids} must be layer indices in "
                            f"-1 .. {data['num_hidden_layers'] - 1}", path=path)
    kw = {k: v for k, v in data.items() if k in _TARGET_FIELDS}
    kw.update(embed=embed, lm_head=head, path=str(path))
    return TargetManifest(**kw)


def _load_release(data: dict, path: Path) -> ReleaseManifest:
    """A release manifest from a mapping :class:`~dsparkhub.layouts.schemas.ReleaseSchema` accepted."""
    _check_facts(data, path)
    return ReleaseManifest(**{k: v for k, v in data.items() if k in _RELEASE_FIELDS}, path=str(path))


_TARGET_FIELDS = {f.name for f in fields(TargetManifest)} - {"path"}
_RELEASE_FIELDS = {f.name for f in fields(ReleaseManifest)} - {"path"}


@lru_cache(maxsize=4)
def _load_all(folder: str) -> tuple[dict, dict]:
    targets: dict[str, TargetManifest] = {}
    releases: dict[str, ReleaseManifest] = {}
    for kind, schema, loader, into in (("targets", TargetSchema, _load_target, targets),
                                       ("releases", ReleaseSchema, _load_release, releases)):
        for path, data in load_yaml_mappings(Path(folder) / kind, what=f"{kind[:-1]} manifest", error=ManifestError,
                                             schema=schema):
            m = loader(data, path)
            if m.name != path.stem:
                raise ManifestError(f"manifest name {m.name!r} differs from its file name {path.stem!r}", path=path)
            into[m.name] = m
    for r in releases.values():
        if r.target not in targets:
            raise ManifestError(f"release {r.name!r} names target {r.target!r}, which has no manifest; known: "
                                f"{sorted(targets)}", path=r.path)
    return targets, releases


def load_manifests(folder: str | Path | None = None) -> tuple[dict[str, TargetManifest], dict[str, ReleaseManifest]]:
    """Every target and release manifest in ``folder`` (default :func:`manifests_dir`), by name.

    Raises:
        ManifestError: a file is not valid YAML or breaks the schema (the message names the file and the key).
    """
    return _load_all(str(folder or manifests_dir()))


def get_manifest(name: str, folder: str | Path | None = None) -> TargetManifest | ReleaseManifest:
    """The target or release manifest called ``name``.

    Raises:
        ManifestError: unknown name (the message suggests close names, ``difflib``, and lists the known ones).
    """
    targets, releases = load_manifests(folder)
    if name in targets:
        return targets[name]
    if name in releases:
        return releases[name]
    import difflib

    close = difflib.get_close_matches(str(name), [*targets, *releases], n=3, cutoff=0.6)
    raise ManifestError(f"unknown manifest {name!r}" + (f"; did you mean {' or '.join(map(repr, close))}?"
                                                         if close else "")
                        + f" known targets: {', '.join(sorted(targets))}; releases: {', '.join(sorted(releases))}",
                        hint="`dsparkhub manifests list` shows every manifest")


#: citations of the project's working notes (FORMATS.md, reference notes, third-party notes), which are not shipped
#: in the repository or the wheel: a reader of ``manifests show`` cannot open them
_UNSHIPPED_NOTES = re.compile(r"\bFORMATS\s*§\s*[\d.]+|\breference notes(?:\s*§\s*[\d.]+)?|\b3p notes?\b")


def unshipped_citations(source: str) -> list[str]:
    """The citations in a fact's ``source`` text that point at notes this repository does not hold (``FORMATS §7``,
    ``reference notes §1.4``, ``3p notes``), so ``manifests show`` can say so instead of citing them as if a reader
    could look them up."""
    return list(dict.fromkeys(m.group(0) for m in _UNSHIPPED_NOTES.finditer(source or "")))


def is_manifest_name(name: str, folder: str | Path | None = None) -> bool:
    """Whether ``name`` names a target manifest (used by ``open_target`` before trying the Hub)."""
    try:
        targets, _ = load_manifests(folder)
    except ManifestError:
        return False
    return name in targets


def tensor_info(ref: TensorRef) -> TensorInfo:
    """A header-only :class:`TensorInfo` (no file, ``start`` 0) for a manifest's tensor; ``nbytes`` from shape x dtype."""
    nbytes = (math.prod(ref.shape) * DTYPE_BITS[ref.dtype] + 7) // 8
    return TensorInfo(ref.name, ref.dtype, ref.shape, "", 0, nbytes)
