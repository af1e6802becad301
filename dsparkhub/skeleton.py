"""Target checkpoints from a manifest: real-size sparse skeletons, and tiny-dimension versions with data.

A **skeleton** has the real tensor names, shapes, dtypes and shard layout of a target (from its manifest's
``checkpoint`` section) but no data: each shard is a safetensors header followed by a hole (the file is truncated to
its full size, so the filesystem stores almost nothing). A 1T-parameter Kimi target takes a few MiB of disk. It is
what ``validate`` and ``attach`` are tested against at real scale: they must read headers only.

A **tiny** version keeps the names and the structure (layers, experts, dtypes) at small dimensions and holds random
values, for numeric tests.

This module owns the writing: shards, headers, holes or random values, the index, ``config.json`` and the marker.
Which tensors a manifest describes is :mod:`dsparkhub.skeleton_tensors`. Does not: download anything, or pretend
skeleton data is meaningful (a ``dsparkhub_skeleton.json`` marker says so).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.attach import dspark_config_keys
from dsparkhub.io.checkpoint import INDEX_NAME
from dsparkhub.io.header import DTYPE_BITS
from dsparkhub.io.output import atomic_output, write_json
from dsparkhub.io.ownership import claim_output
from dsparkhub.layouts.families import expected_tensors
from dsparkhub.layouts.manifests import ReleaseManifest, TargetManifest, get_manifest
from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.spec import DraftSpec
from dsparkhub.skeleton_tensors import SkeletonTensor, skeleton_tensors, tiny_manifest, v4_drafter_tensors

__all__ = ["MARKER", "SkeletonResult", "sparse_drafter", "write_skeleton", "write_sparse_safetensors"]

MARKER = "dsparkhub_skeleton.json"
_WRAPPED = {"kimi_k25", "gemma4"}


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



def write_skeleton(manifest: TargetManifest | str, out: str | Path, *, tiny: bool = False,
                   overwrite: bool = False, seed: int = 0, with_drafter: bool = False,
                   **tiny_kwargs) -> SkeletonResult:
    """Write a target checkpoint for ``manifest`` into ``out``.

    Args:
        manifest: a target manifest or its name, or a release manifest name (its target is written).
        out: output folder (must not exist unless ``overwrite``).
        tiny: write the tiny-dimension version with random data (see :func:`tiny_manifest`) instead of a sparse
            real-size skeleton.
        overwrite: replace an existing ``out`` atomically (only a folder dsparkhub wrote, holding nothing else).
        seed: random seed of the tiny version's values.
        with_drafter: also write the attached DSpark drafter the way DeepSeek ships it (:func:`v4_drafter_tensors`
            in ``drafter_defaults.stages`` extra shards, ``dspark_*`` keys in config.json).
        **tiny_kwargs: ``hidden``, ``layers``, ``vocab`` and var overrides for :func:`tiny_manifest`.

    Returns:
        :class:`SkeletonResult`; ``disk_bytes`` is what the filesystem allocated (``st_blocks``).

    Raises:
        ManifestError: unknown manifest or no tensor layout in it.
        OutputExistsError / OutputNotWritableError: ``out`` exists and ``overwrite`` is False, or is not dsparkhub's
            to replace, or cannot be written (:func:`dsparkhub.io.ownership.claim_output`).
    """
    claim_output(out, overwrite=overwrite)  # before any work (atomic_output checks again before writing)
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
