"""The target (verifier) as ``validate`` and ``convert`` see it: geometry and its embedding / LM-head tensors,
from ``config.json`` and safetensors headers only.

A target is named by a local HF folder, or a Hub repo id (``ns/name[@revision]``, headers fetched with HTTP range
requests by ``dsparkhub.io.hub_checkpoint``; never the weights). Multimodal wrappers (``text_config``: Kimi-K2.5
``kimi_k25``, Gemma4) are read through their text config.

Does not: load weights (the reference engine does that, in ``dsparkhub.verify.reference.engine``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import CheckpointNotFoundError, HubError, IncompatibleTargetError, ManifestError
from dsparkhub.io.checkpoint import Checkpoint, open_checkpoint, read_json
from dsparkhub.io.header import TensorInfo
from dsparkhub.layouts.manifests import TargetManifest, get_manifest, is_manifest_name, load_manifests, tensor_info
from dsparkhub.repo_ids import is_repo_id

#: embedding / LM-head tensor names seen in target checkpoints, most common first (HF Qwen3/Gemma4,
#: multimodal wrappers, DeepSeek-V4 native names ``embed.weight`` / ``head.weight``).
EMBED_NAMES = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
               "language_model.model.embed_tokens.weight", "embed_tokens.weight", "embed.weight")
HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight", "head.weight")


@dataclass
class TargetSpec:
    """What the drafter must agree with.

    Attributes:
        source: local folder or Hub repo id as given.
        checkpoint: headers of the target's weights.
        config: the text model's config (``text_config`` merged over the top level for wrappers).
        model_type: text model type (``qwen3``, ``deepseek_v4``, ``kimi_k2``, ...).
        hidden_size: Ht.
        num_hidden_layers: decoder layers (the valid target layer ids are -1 .. L-1; L-1 is refused).
        vocab_size: V.
        embed: the input embedding's header ([V, Ht]), if found.
        lm_head: the LM head's header ([V, Ht]); the embedding when tied.
        tied: ``tie_word_embeddings``.
        default_target_layer_ids: the layer ids (layer index) the seed drafters of this target use, when known
            (from its manifest); validate names ids that are these shifted by one.
        manifest: the manifest name when the target was given as one (no weights behind it).
    """

    source: str
    checkpoint: Checkpoint
    config: dict
    model_type: str | None
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    embed: TensorInfo | None
    lm_head: TensorInfo | None
    tied: bool
    default_target_layer_ids: list[int] | None = None
    manifest: str | None = None

    @property
    def local(self) -> bool:
        """Whether tensor bytes can be read (False for Hub targets)."""
        return not self.checkpoint.remote


def text_config(config: dict) -> dict:
    """``config`` with ``text_config`` (if any) merged over it, the way wrappers nest their language model."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else dict(config)


def target_from_checkpoint(ckpt: Checkpoint, source: str) -> TargetSpec:
    """Build a :class:`TargetSpec` from an indexed checkpoint.

    Raises:
        IncompatibleTargetError: the config lacks integer hidden_size / num_hidden_layers / vocab_size.
    """
    cfg = text_config(ckpt.config)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size") if type(cfg.get(k)) is not int]
    if missing:
        raise IncompatibleTargetError(f"target config.json lacks integer {', '.join(missing)}",
                                      path=f"{source}/config.json")
    embed = next((ckpt.tensors[n] for n in EMBED_NAMES if n in ckpt.tensors), None)
    tied = bool(cfg.get("tie_word_embeddings", ckpt.config.get("tie_word_embeddings", False)))
    head = next((ckpt.tensors[n] for n in HEAD_NAMES if n in ckpt.tensors), None)
    if head is None and tied:
        head = embed
    return TargetSpec(source, ckpt, cfg, cfg.get("model_type"), cfg["hidden_size"], cfg["num_hidden_layers"],
                      cfg["vocab_size"], embed, head, tied)


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """In huggingface_hub offline mode, the HF-cache snapshot of ``repo_id`` (``snapshot_download`` with
    ``local_files_only=True``, which reads refs and files only from the cache) when it holds a ``config.json``;
    None online (the Hub is read instead, headers only) or when nothing usable is cached."""
    from huggingface_hub import is_offline_mode, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not is_offline_mode():
        return None
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None
    return folder if (folder / "config.json").is_file() else None


def open_target(source: str | Path, *, endpoint: str | None = None, token: str | None = None) -> TargetSpec:
    """Open a target from a local HF folder or a Hub repo id, reading config and headers only.

    Args:
        source: folder path, ``namespace/name[@revision]`` on the Hub, or a target manifest name
            (``deepseek-v4-flash``, ``manifest:kimi-k2.6``; geometry and embedding / LM-head headers, no weights).
        endpoint / token: Hub endpoint and token for a repo id (default: huggingface_hub's, i.e. ``HF_ENDPOINT``
            / ``HF_TOKEN``).

    Raises:
        CheckpointNotFoundError: neither a local folder nor a repo id.
        dsparkhub.errors.HubError: the Hub could not be reached or refused (from ``dsparkhub.io.hub_checkpoint``). With
            ``HF_HUB_OFFLINE=1`` a repo id is read from the HF cache when it was downloaded before.
        CheckpointFormatError / IncompatibleTargetError: malformed config or headers.
    """
    source = str(source)
    path = Path(source)
    if path.exists():
        spec = target_from_checkpoint(open_checkpoint(path, lazy=True), source)
        marker = path / "dsparkhub_skeleton.json"
        if marker.is_file():  # a skeleton written by dsparkhub.skeleton: its manifest knows the seeds' settings
            info = read_json(marker, "dsparkhub_skeleton.json")
            m = get_manifest(str(info.get("manifest", "")).removesuffix("-tiny"))
            spec.manifest = m.name
            if not info.get("tiny"):
                spec.default_target_layer_ids = (m.drafter_defaults or {}).get("target_layer_ids")
        return spec
    name = source.removeprefix("manifest:")
    if "/" not in name:
        if is_manifest_name(name) or source.startswith("manifest:"):
            return target_spec_from_manifest(name)
    if is_repo_id(source, revision=True) and not source.startswith((".", "/")):
        # huggingface_hub costs ~0.2 s to import: only for Hub ids
        from dsparkhub.io.hub_checkpoint import remote_checkpoint

        repo, _, revision = source.partition("@")
        cached = _cached_snapshot(repo, revision or None)
        if cached is not None:  # HF_HUB_OFFLINE=1 and the target was downloaded before: read the HF cache
            return target_from_checkpoint(open_checkpoint(cached, lazy=True), source)
        try:
            return target_from_checkpoint(remote_checkpoint(repo, revision=revision or None, endpoint=endpoint,
                                                            token=token), source)
        except HubError as exc:
            if path.parent.is_dir():  # "ex/targt" next to a local "ex/": most likely a mistyped folder
                raise CheckpointNotFoundError(
                    f"no local folder {source} (its parent {path.parent}/ exists: a typo?); read as a Hub repo id it "
                    f"failed too: {exc.message}", path=source,
                    hint="check the folder name; for a Hub target pass namespace/name") from exc
            raise
    raise CheckpointNotFoundError("target is neither a local folder nor a Hub repo id (namespace/name)",
                                  path=source)


def target_spec_from_manifest(name: str | TargetManifest, folder: str | Path | None = None) -> TargetSpec:
    """A :class:`TargetSpec` from a target manifest: geometry and embedding / LM-head headers,
    no data (``local`` is False, so byte comparisons are skipped and reported as such).

    Raises:
        ManifestError: unknown name, or ``name`` is a release manifest.
    """
    m = name if isinstance(name, TargetManifest) else get_manifest(name, folder)
    if not isinstance(m, TargetManifest):
        raise ManifestError(f"{m.name!r} is a release manifest; pass its target {m.target!r}")
    embed, head = tensor_info(m.embed), tensor_info(m.lm_head)
    tensors = {embed.name: embed, head.name: head}
    cfg = {**m.config, "model_type": m.text_model_type or m.model_type, "hidden_size": m.hidden_size,
           "num_hidden_layers": m.num_hidden_layers, "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied}
    ck = Checkpoint(f"manifest:{m.name}", cfg, tensors, [], None, {}, remote=True)
    spec = TargetSpec(f"manifest:{m.name}", ck, cfg, cfg["model_type"], m.hidden_size, m.num_hidden_layers,
                      m.vocab_size, embed, head, m.tied)
    spec.default_target_layer_ids = (m.drafter_defaults or {}).get("target_layer_ids")
    spec.manifest = m.name
    return spec


# ---- the target's public name -----------------------------------------------------------------------------------


def hub_id_like(value) -> bool:
    """``namespace/name`` as the Hub spells it, and not a local path (``./x``, ``/x``, ``~/x`` or an existing one)."""
    return (is_repo_id(value)
            and not value.startswith((".", "/", "~")) and not Path(value).exists())


def manifest_for_headers(spec: TargetSpec):
    """The one target manifest whose geometry and embedding / LM-head headers (name, shape, dtype) ``spec`` has.

    This is the header fingerprint a manifest can state without weights: ``model_type``, hidden size, layer count,
    vocab size and the two tensors both sides know. Returns None unless exactly one manifest matches (the tiny
    skeletons and the embedded example match none).
    """
    def key(t):
        return None if t is None else (t.name, tuple(t.shape), t.dtype)

    targets, _ = load_manifests()
    hits = [m for m in targets.values()
            if (m.text_model_type or m.model_type) == spec.model_type and m.hidden_size == spec.hidden_size
            and m.num_hidden_layers == spec.num_hidden_layers and m.vocab_size == spec.vocab_size
            and key(spec.embed) == (m.embed.name, m.embed.shape, m.embed.dtype)
            and key(spec.lm_head) == (m.lm_head.name, m.lm_head.shape, m.lm_head.dtype)]
    return hits[0] if len(hits) == 1 else None


def target_repo_id(source: str | Path | TargetSpec) -> tuple[str | None, str]:
    """The Hub repo id a target is published under, and how it was found; ``(None, why not)`` when unknown.

    In order: a Hub source names itself (``ns/name@rev`` -> ``ns/name``); a manifest name gives its ``repo_id``; a
    local folder gives its config's ``_name_or_path`` when that is a Hub id (transformers writes it on
    ``save_pretrained`` of a model loaded from the Hub), else the manifest of the skeleton it was written from
    (``dsparkhub_skeleton.json``), else the one target manifest its headers match (:func:`manifest_for_headers`).

    Used so that cards, provenance and results name a local target by its Hub id instead of a local path.
    Reads config and headers only; never the network.
    """
    spec = source if isinstance(source, TargetSpec) else None
    text = spec.source if spec is not None else str(source)
    if spec is None and not Path(text).exists():
        name = text.removeprefix("manifest:")
        if "/" not in name and is_manifest_name(name):
            m = get_manifest(name)
            return (m.repo_id, f"manifest {m.name}") if isinstance(m, TargetManifest) else (None, "release")
        repo = text.partition("@")[0]
        return (repo, "Hub repo id") if hub_id_like(repo) else (None, f"{text!r} is not a Hub repo id")
    if spec is not None and not Path(text).exists() and hub_id_like(text.partition("@")[0]):
        return text.partition("@")[0], "Hub repo id"  # e.g. read from the HF cache offline
    if spec is not None and spec.manifest and not spec.local:
        return get_manifest(spec.manifest).repo_id, f"manifest {spec.manifest}"
    if spec is not None and not spec.local:
        repo = text.removeprefix("hub:").partition("@")[0]
        return (repo, "Hub repo id") if hub_id_like(repo) else (None, f"{text!r} is not a Hub repo id")
    try:
        spec = spec or open_target(text)
    except (CheckpointNotFoundError, ValueError) as exc:  # not a readable target: nothing to go by
        return None, f"cannot read the target's config ({exc})"
    for cfg in (spec.checkpoint.config, spec.config):
        if hub_id_like(cfg.get("_name_or_path")):
            return cfg["_name_or_path"], "config.json _name_or_path"
    marker = Path(spec.source) / "dsparkhub_skeleton.json"
    if spec.manifest and marker.is_file():
        if not read_json(marker, "dsparkhub_skeleton.json").get("tiny"):  # tiny ones have other geometry
            return get_manifest(spec.manifest).repo_id, f"skeleton of manifest {spec.manifest}"
    m = manifest_for_headers(spec)
    if m is not None:
        return m.repo_id, f"headers match manifest {m.name}"
    return None, ("the folder's config.json has no Hub `_name_or_path` and its headers match no target manifest; "
                  "pass --base-model NS/NAME")


def public_name(source: str | Path | TargetSpec) -> str:
    """How a results file or provenance names a model: its Hub id when :func:`target_repo_id` finds one, a Hub id
    or manifest name as given, else only the folder's own name (never an absolute local path). An opened target
    (:class:`TargetSpec`) is not read again."""
    text = source.source if isinstance(source, TargetSpec) else str(source)
    if Path(text).exists():
        repo, _ = target_repo_id(source if isinstance(source, TargetSpec) else text)
        return repo or Path(text).resolve().name
    return text
