"""Sharded, streamed, atomic checkpoint writing.

Owns: the output folder's life cycle (a temporary folder next to OUT, renamed into place only when complete; an
existing OUT refused unless overwrite; a concurrent writer of the same OUT fails cleanly) and writing tensors into
size-capped safetensors shards with ``safetensors.torch.save_file`` plus ``model.safetensors.index.json``.

Memory: tensors are read one at a time from their source shard and held only until their output shard is written,
so peak memory is about one output shard (``max_shard_bytes``, by default the largest tensor + 256 MiB) plus one
tensor. Format writing is left to the ``safetensors`` library.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputExistsError

SHARD_SLACK = 256 << 20


@contextmanager
def atomic_output(out: str | Path, *, overwrite: bool = False):
    """Yield a temporary folder that becomes ``out`` only if the block finishes without an exception.

    The temporary folder ``.<name>.tmp-<random>`` lies next to ``out`` (same filesystem, so the final rename is
    atomic). On any exception it is removed and ``out`` is untouched. With ``overwrite``, an existing ``out`` is
    moved aside, replaced, then deleted.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False (checked before and after the work), or another
            run created ``out`` meanwhile.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError("output folder already exists", path=out, hint="pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out.exists():
            if not overwrite:
                raise OutputExistsError("output folder appeared while this run was writing (another run?)",
                                        path=out)
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except OSError as exc:
            if old is not None:
                os.rename(old, out)
            raise OutputExistsError(f"could not move the finished output into place: {exc.strerror}",
                                    path=out) from None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, data: dict) -> None:
    """Write ``data`` as indented JSON with a trailing newline (config.json style)."""
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_shards(folder: Path, items: Iterable[tuple[str, int, Callable[[], object]]], *,
                 max_shard_bytes: int | None = None, metadata: dict[str, str] | None = None) -> list[str]:
    """Write tensors into ``model.safetensors`` or ``model-XXXXX-of-YYYYY.safetensors`` + index.

    Args:
        folder: destination folder (normally the temporary folder of :func:`atomic_output`).
        items: ``(name, nbytes, load)`` triples in output order; ``load()`` returns the ``torch.Tensor`` and is
            called only when the tensor is about to be buffered.
        max_shard_bytes: shard size cap; default = the largest tensor + 256 MiB.
        metadata: safetensors ``__metadata__`` (``{"format": "pt"}`` is always set).

    Returns:
        Shard file names written.
    """
    from safetensors.torch import save_file

    items = list(items)
    cap = max_shard_bytes or (max((n for _, n, _ in items), default=0) + SHARD_SLACK)
    groups: list[list[tuple[str, int, Callable]]] = [[]]
    size = 0
    for item in items:
        if groups[-1] and size + item[1] > cap:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item[1]
    meta = {"format": "pt", **(metadata or {})}
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    weight_map: dict[str, str] = {}
    for fname, group in zip(names, groups):
        tensors = {name: load().contiguous() for name, _, load in group}
        save_file(tensors, str(folder / fname), metadata=meta)
        del tensors
        weight_map.update({name: fname for name, _, _ in group})
    if len(names) > 1:
        write_json(folder / "model.safetensors.index.json",
                   {"metadata": {"total_size": sum(n for _, n, _ in items)}, "weight_map": weight_map})
    return names
