"""Target checkpoints from a manifest: real-size sparse skeletons, and tiny-dimension versions with data.

A **skeleton** has the real tensor names, shapes, dtypes and shard layout of a target (from its manifest's
``checkpoint`` section) but no data: each shard is a safetensors header followed by a hole (the file is truncated to
its full size, so the filesystem stores almost nothing). A 1T-parameter Kimi target takes a few MiB of disk. It is
what ``validate`` and ``attach`` are tested against at real scale: they must read headers only.

A **tiny** version keeps the names and the structure (layers, experts, dtypes) at small dimensions and holds random
values, for numeric tests.

Tensor lists come from the manifest:

- ``checkpoint.source: templates``: ``head`` / ``per_layer`` (``{i}`` over the layers, optional ``repeat: {e: E}``
  and ``when``) / ``tail`` entries with shapes in the manifest's symbols (``H``, ``V``, ``L`` and ``vars``);
- ``checkpoint.source: transformers``: the model class named by ``checkpoint.class`` built on the ``meta`` device
  from the manifest's config (transformers 5.19), whose state-dict names are the checkpoint names (Qwen3).

Does not: download anything, or pretend skeleton data is meaningful (a ``dsparkhub_skeleton.json`` marker says so).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsparkhub.io.checkpoint import INDEX_NAME
from dsparkhub.io.header import DTYPE_BITS
from dsparkhub.errors import ManifestError
from dsparkhub.attach import dspark_config_keys
from dsparkhub.layouts.families import evaluate, expected_tensors
from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.spec import DraftSpec
from dsparkhub.layouts.manifests import ReleaseManifest, TargetManifest, get_manifest
from dsparkhub.io.output import atomic_output, write_json

MARKER = "dsparkhub_skeleton.json"
_WRAPPED = {"kimi_k25", "gemma4"}


@dataclass(frozen=True)
class SkeletonTensor:
    """One tensor of a skeleton: checkpoint name, safetensors dtype code, shape, bytes of its data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = -1

    def __post_init__(self):
        if self.nbytes < 0:
            object.__setattr__(self, "nbytes", (math.prod(self.shape) * DTYPE_BITS[self.dtype] + 7) // 8)


def _names(m: TargetManifest) -> dict:
    names = {"H": m.hidden_size, "L": m.num_hidden_layers, "V": m.vocab_size}
    for k, v in (m.checkpoint.get("vars") or {}).items():
        names[k] = evaluate(v, names)
    return names


def _expand(entries, names: dict, extra: dict | None = None) -> list[SkeletonTensor]:
    scope = {**names, **(extra or {})}
    ints = {k: v for k, v in scope.items() if isinstance(v, int)}
    out = []
    for e in entries or []:
        if not evaluate(e.get("when", "1"), scope):
            continue
        reps = e.get("repeat") or {}
        if not reps:
            out.append(SkeletonTensor(e["name"].format(**ints), e["dtype"],
                                      tuple(evaluate(x, scope) for x in e["shape"])))
            continue
        ((var, count),) = reps.items()
        # the shape rarely depends on the repeat variable (experts); evaluate it once when it does not
        depends = any(var in str(x) for x in e["shape"])
        shape = None if depends else tuple(evaluate(x, {**scope, var: 0}) for x in e["shape"])
        stem = e["name"].replace("{" + var + "}", "\x00").format(**ints)
        for j in range(evaluate(count, scope)):
            out.append(SkeletonTensor(stem.replace("\x00", str(j)), e["dtype"],
                                      shape or tuple(evaluate(x, {**scope, var: j}) for x in e["shape"])))
    return out


def _from_transformers(m: TargetManifest) -> list[SkeletonTensor]:
    import torch
    import transformers

    ck = m.checkpoint
    cls = getattr(transformers, ck["class"])
    cfg_cls = getattr(transformers, ck["class"].replace("ForCausalLM", "Config"))
    cfg = cfg_cls(**{**m.config, "hidden_size": m.hidden_size, "num_hidden_layers": m.num_hidden_layers,
                     "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied})
    with torch.device("meta"):
        model = cls(cfg)
    dtype = ck.get("dtype", "BF16")
    # named_parameters lists a tied LM head once, under the embedding's name, as save_pretrained stores it
    unique = set(dict(model.named_parameters()))
    return [SkeletonTensor(n, dtype, tuple(p.shape)) for n, p in model.state_dict().items()
            if n in unique or not m.tied]


def skeleton_tensors(m: TargetManifest | str) -> list[SkeletonTensor]:
    """Every tensor of ``m``'s checkpoint, in file order.

    Raises:
        ManifestError: the manifest has no tensor layout (``checkpoint.source`` missing or ``none``), or a template
            names an unknown symbol.
    """
    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    ck = m.checkpoint or {}
    source = ck.get("source", "none")
    if source == "transformers":
        return _from_transformers(m)
    if source != "templates":
        raise ManifestError(f"target manifest {m.name!r} has no checkpoint tensor layout (checkpoint.source is "
                            f"{source!r})", path=m.path, hint="add `checkpoint.source: templates` with head / "
                                                              "per_layer / tail entries")
    names = _names(m)
    try:
        out = _expand(ck.get("head"), names)
        for i in range(m.num_hidden_layers):
            out += _expand(ck.get("per_layer"), names, {"i": i})
        out += _expand(ck.get("tail"), names)
    except (KeyError, ValueError) as exc:
        raise ManifestError(f"checkpoint templates of {m.name!r}: {exc}", path=m.path) from None
    seen = set()
    for t in out:
        if t.name in seen:
            raise ManifestError(f"checkpoint templates of {m.name!r} produce tensor {t.name!r} twice", path=m.path)
        seen.add(t.name)
    return out


def tiny_manifest(m: TargetManifest | str, *, hidden: int = 256, layers: int = 3, vocab: int = 512,
                  **var_overrides) -> TargetManifest:
    """``m`` at tiny dimensions: hidden ``hidden``, ``layers`` layers, vocab ``vocab``, and the manifest's
    ``checkpoint.tiny`` var overrides (experts, heads, ranks small enough for random data), plus ``var_overrides``.
    Shapes stay expressions of these symbols, so the structure (names, dtypes, experts per layer) is the real one."""
    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    ck = dict(m.checkpoint)
    ck["vars"] = {**(ck.get("vars") or {}), **(ck.get("tiny") or {}), **var_overrides}
    ck["shards"] = min(int(ck.get("shards", 1)), max(1, layers))
    embed = replace(m.embed, shape=(vocab, hidden))
    head = replace(m.lm_head, shape=(vocab, hidden))
    drafter = dict(m.drafter_defaults)
    ids = drafter.get("target_layer_ids")
    if ids:
        drafter["target_layer_ids"] = sorted({min(max(i, 0), layers - 2) for i in ids})
    if drafter.get("mask_token_id") is not None and drafter["mask_token_id"] >= vocab:
        drafter["mask_token_id"] = vocab - 1  # the noise token must lie in the tiny vocab
    cfg = {k: v for k, v in m.config.items()}
    for k in ("hidden_size", "num_hidden_layers", "vocab_size"):
        cfg.pop(k, None)
    cfg.update({k: v for k, v in (ck.get("tiny_config") or {}).items()})
    return replace(m, name=m.name + "-tiny", hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
                   embed=embed, lm_head=head, checkpoint=ck, drafter_defaults=drafter, config=cfg)


def _config(m: TargetManifest) -> dict:
    text = {"model_type": m.text_model_type or m.model_type, "hidden_size": m.hidden_size,
            "num_hidden_layers": m.num_hidden_layers, "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied,
            **m.config}
    if m.model_type in _WRAPPED:
        return {"architectures": [m.architecture], "model_type": m.model_type, "text_config": text,
                "tie_word_embeddings": m.tied}
    return {"architectures": [m.architecture], **text, "model_type": m.model_type}


def _split(tensors: list[SkeletonTensor], shards: int) -> list[list[SkeletonTensor]]:
    total = sum(t.nbytes for t in tensors)
    per = total / max(1, shards)
    groups: list[list[SkeletonTensor]] = [[]]
    acc = 0
    for t in tensors:
        if groups[-1] and acc + t.nbytes > per * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(t)
        acc += t.nbytes
    return groups


def _header(group: list[SkeletonTensor]) -> tuple[bytes, int]:
    entries = {"__metadata__": {"format": "pt", "dsparkhub": "skeleton"}}
    off = 0
    for t in group:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return raw, off


def _random_bytes(t: SkeletonTensor, gen) -> bytes:
    import torch

    n = math.prod(t.shape)
    if t.dtype in ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"):
        td = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[t.dtype]
        x = (torch.randn(n, generator=gen) * 0.02).to(td)
        return x.view(torch.uint8).numpy().tobytes()
    if t.dtype == "F8_E8M0":
        return bytes([127]) * n  # 2^0 = 1.0 scales
    if t.dtype == "BOOL":
        return torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8).numpy().tobytes()
    return os.urandom(t.nbytes) if DTYPE_BITS[t.dtype] < 8 else \
        torch.randint(0, 7, (n,), generator=gen, dtype={8: torch.uint8, 16: torch.int16, 32: torch.int32,
                                                        64: torch.int64}[DTYPE_BITS[t.dtype]]).numpy().tobytes()


@dataclass
class SkeletonResult:
    """What :func:`write_skeleton` wrote: folder, shard files, tensor count, logical bytes, bytes on disk."""

    out: Path
    files: list[str]
    num_tensors: int
    logical_bytes: int
    disk_bytes: int
    sparse: bool
    manifest: str = ""


def v4_drafter_tensors(m: TargetManifest) -> list[SkeletonTensor]:
    """The ``mtp.{0..S-1}.*`` stages of a DeepSeek-V4 DSpark drafter for manifest ``m``: each stage is one of the
    target's decoder layers (the manifest's ``per_layer`` templates) under ``mtp.{s}.``; the last stage also holds
    ``main_proj`` [H, A*H], ``main_norm``, ``norm``, ``hc_head_*``, the Markov head [V, r] x 2 and the bias-less
    F32 confidence head [1, H + r] that vLLM 0.32 builds (``DSparkConfidenceHead(hidden_size + dspark_markov_rank)``,
    vllm/models/deepseek_v4/nvidia/dspark.py:152-156; FORMATS §6's [1, H] is a head over h alone, which vLLM's V4
    class cannot load).

    Raises:
        ManifestError: the manifest has no ``drafter_defaults.stages`` or no templates.
    """
    dd = m.drafter_defaults or {}
    stages, r, ids = dd.get("stages"), dd.get("markov_rank"), dd.get("target_layer_ids")
    if not stages or not r or not ids or (m.checkpoint or {}).get("source") != "templates":
        raise ManifestError(f"manifest {m.name!r} does not describe an attached drafter (drafter_defaults.stages / "
                            "markov_rank / target_layer_ids and checkpoint templates needed)", path=m.path)
    names = _names(m)
    out: list[SkeletonTensor] = []
    for sidx in range(stages):
        # stage s is built as decoder layer L + s: DeepSeek numbers its MTP layers after the main ones (V3:
        # `model.layers.61` for 61 layers), so per-layer conditions (hash-routed first layers) read the same for
        # every stage and the stages hold the same parameters
        i = m.num_hidden_layers + sidx
        for t in _expand(m.checkpoint.get("per_layer"), names, {"i": i}):
            out.append(SkeletonTensor(t.name.replace(f"layers.{i}.", f"mtp.{sidx}.", 1), t.dtype, t.shape,
                                      t.nbytes))
    last = f"mtp.{stages - 1}."
    H, V, hc = m.hidden_size, m.vocab_size, int(names.get("hc", 4))
    out += [SkeletonTensor(last + "main_proj.weight", "BF16", (H, len(ids) * H)),
            SkeletonTensor(last + "main_norm.weight", "BF16", (H,)),
            SkeletonTensor(last + "norm.weight", "BF16", (H,)),
            SkeletonTensor(last + "hc_head_fn", "F32", (hc, hc * H)),
            SkeletonTensor(last + "hc_head_base", "F32", (hc,)),
            SkeletonTensor(last + "hc_head_scale", "F32", (1,)),
            SkeletonTensor(last + "markov_head.markov_w1.weight", "BF16", (V, r)),
            SkeletonTensor(last + "markov_head.markov_w2.weight", "BF16", (V, r)),
            SkeletonTensor(last + "confidence_head.proj.weight", "F32", (1, H + r))]
    return out


def write_skeleton(manifest: TargetManifest | str, out: str | Path, *, tiny: bool = False,
                   overwrite: bool = False, seed: int = 0, with_drafter: bool = False,
                   **tiny_kwargs) -> SkeletonResult:
    """Write a target checkpoint for ``manifest`` into ``out``.

    Args:
        manifest: a target manifest or its name, or a release manifest name (its target is written).
        out: output folder (must not exist unless ``overwrite``).
        tiny: write the tiny-dimension version with random data (see :func:`tiny_manifest`) instead of a sparse
            real-size skeleton.
        overwrite: replace an existing ``out`` atomically.
        seed: random seed of the tiny version's values.
        with_drafter: also write the attached DSpark drafter the way DeepSeek ships it (:func:`v4_drafter_tensors`
            in ``drafter_defaults.stages`` extra shards, ``dspark_*`` keys in config.json).
        **tiny_kwargs: ``hidden``, ``layers``, ``vocab`` and var overrides for :func:`tiny_manifest`.

    Returns:
        :class:`SkeletonResult`; ``disk_bytes`` is what the filesystem allocated (``st_blocks``).

    Raises:
        ManifestError: unknown manifest or no tensor layout in it.
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
    """
    m = manifest if isinstance(manifest, TargetManifest) else get_manifest(manifest)
    if isinstance(m, ReleaseManifest):  # a release names its target: that is the checkpoint to write
        m = get_manifest(m.target)
    if tiny:
        m = tiny_manifest(m, **tiny_kwargs)
    tensors = skeleton_tensors(m)
    groups = _split(tensors, int(m.checkpoint.get("shards", 1)))
    config = _config(m)
    if with_drafter:
        drafter = v4_drafter_tensors(m)
        stages = m.drafter_defaults["stages"]
        groups += [[t for t in drafter if t.name.startswith(f"mtp.{k}.")] for k in range(stages)]
        tensors = tensors + drafter
        dd = m.drafter_defaults
        spec = DraftSpec("deepseek-v4", "dspark", "deepseek-v4", m.architecture, dd["block_size"], "anchor_first",
                         list(dd["target_layer_ids"]), m.num_hidden_layers, dd["markov_rank"], "vanilla", True,
                         False, m.vocab_size, m.vocab_size, dd["mask_token_id"], m.hidden_size, m.hidden_size, stages)
        config.update(dspark_config_keys(spec, m.model_type))
    n = len(groups)
    names = (["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)])
    gen = None
    if tiny:
        import torch

        gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    total = 0
    disk = 0
    with atomic_output(out, overwrite=overwrite) as tmp:
        for fname, group in zip(names, groups):
            raw, size = _header(group)
            with open(tmp / fname, "wb") as f:
                f.write(struct.pack("<Q", len(raw)))
                f.write(raw)
                if tiny:
                    for t in group:
                        f.write(_random_bytes(t, gen))
                else:
                    f.truncate(8 + len(raw) + size)  # a hole: no data blocks are allocated
            disk += os.stat(tmp / fname).st_blocks * 512
            weight_map.update({t.name: fname for t in group})
            total += size
        if n > 1:
            write_json(tmp / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
        write_json(tmp / "config.json", config)
        write_json(tmp / MARKER, {"manifest": m.name, "tiny": tiny, "sparse": not tiny,
                                  "note": "written by dsparkhub.skeleton: real names / shapes / dtypes / shards, "
                                          + ("random values" if tiny else "no data (holes)")})
    return SkeletonResult(Path(out), names, len(tensors), total, disk, not tiny, m.name)


def write_sparse_safetensors(path: str | Path, tensors: list[SkeletonTensor]) -> int:
    """Write one safetensors file whose data section is a hole; returns the logical data size in bytes."""
    raw, size = _header(tensors)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + size)
    return size


def sparse_drafter(out: str | Path, config: dict, *, layout: str | None = None) -> Path:
    """A drafter folder at real size with no data: ``config`` plus every tensor the drafter's family table
    (``converters/families``) requires, named in the drafter's layout, as a hole-only ``model.safetensors``.

    Dtypes: BF16, except ``d2t`` (I64, holes read as zeros = identity offsets), ``t2d`` (BOOL) and the confidence
    head (F32, as DeepSpec saves it). Stage-prefixed layouts (DeepSeek-V4) are not built here (see
    :func:`write_skeleton` ``with_drafter``).

    Raises:
        LayoutError: the config matches no layout, or the layout has no family table.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    write_sparse_safetensors(out / "model.safetensors", [])
    d = open_draft(out, layout=layout)
    expected, _ = expected_tensors(d.spec)
    dtypes = {"d2t": "I64", "t2d": "BOOL", "confidence_head.proj.weight": "F32", "confidence_head.proj.bias": "F32"}
    tensors = [SkeletonTensor(d.recipe.to_layout(e.name, num_layers=d.spec.num_layers), dtypes.get(e.name, "BF16"),
                              e.shape) for e in expected if not e.optional and e.shape is not None]
    write_sparse_safetensors(out / "model.safetensors", tensors)
    return out


# ---- checking a manifest against transformers' own model class ------------------------------------------------


#: transformers 5.19 classes that build a target of a manifest ``model_type`` (for :func:`meta_check`).
META_CLASSES = {"qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
                "deepseek_v4": ("DeepseekV4ForCausalLM", "DeepseekV4Config"),
                "kimi_k25": ("Kimi_K25ForConditionalGeneration", None)}


@dataclass
class MetaCheck:
    """How a manifest's checkpoint tensors compare with transformers' own model class built on the ``meta`` device.

    Attributes:
        model_class: the transformers class used.
        matched: checkpoint names whose renamed HF name exists with the same shape.
        merged: checkpoint names that transformers merges into a fused tensor (experts); existence checked only.
        mismatched: ``(checkpoint name, manifest shape, HF shape)`` for shape disagreements.
        unmapped: checkpoint names with no HF counterpart (quantization side tensors such as ``.scale``).
    """

    model_class: str
    matched: list = field(default_factory=list)
    merged: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    unmapped: list = field(default_factory=list)


def meta_check(m: TargetManifest | str, *, layers: int | None = 2) -> MetaCheck:
    """Compare ``m``'s checkpoint tensor names / shapes with transformers 5.19's model class on the ``meta`` device.

    Checkpoint names are mapped to HF names with transformers' own ``conversion_mapping`` (``rename_source_key``),
    exactly as ``from_pretrained`` would; the model is built from the manifest's geometry and ``config`` (with
    ``layers`` decoder layers to keep it quick: every layer has the same tensors). Costs no memory (meta tensors).

    Raises:
        ManifestError: no transformers class for the manifest's model type, or no tensor layout.
    """
    import dataclasses

    import torch
    import transformers
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    if m.model_type not in META_CLASSES:
        raise ManifestError(f"no transformers class to check manifest {m.name!r} (model_type {m.model_type!r})")
    cls_name, cfg_name = META_CLASSES[m.model_type]
    geometry = {"hidden_size": m.hidden_size, "num_hidden_layers": layers or m.num_hidden_layers,
                "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied}
    text = {k: v for k, v in m.config.items() if not k.startswith("num_mla") and not k.startswith("num_kda")}
    if m.model_type == "kimi_k25":
        from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config

        cfg = Kimi_K25Config(text_config={**text, **geometry, "model_type": "deepseek_v3"})
    else:
        cfg = getattr(transformers, cfg_name)(**{**text, **geometry})
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg)
    hf = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    mapping = get_checkpoint_conversion_mapping(m.model_type) or []
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    small = dataclasses.replace(m, num_hidden_layers=layers or m.num_hidden_layers)
    out = MetaCheck(cls_name)
    for t in skeleton_tensors(small):
        name, conv = rename_source_key(t.name, renamings, converters, model.base_model_prefix, hf)
        if conv is not None:
            (out.merged if name in hf else out.unmapped).append(t.name)
        elif name not in hf:
            out.unmapped.append(t.name)
        elif hf[name] != t.shape:
            out.mismatched.append((t.name, list(t.shape), list(hf[name])))
        else:
            out.matched.append(t.name)
    return out
