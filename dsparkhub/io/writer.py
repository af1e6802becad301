"""Sharded, streamed checkpoint writing.

Owns: writing tensors into size-capped safetensors shards plus ``model.safetensors.index.json`` (grouping:
``dsparkhub.io.sharding``), inside the temporary output folder that ``dsparkhub.io.output.atomic_output`` renames
into place.

Memory and speed: a plain copy is described by :class:`SourceBytes` and never enters memory whole: a file that copies
64 MiB or more is assembled in 8 MiB aligned blocks and written with ``O_DIRECT`` (no page-cache work for the
output); smaller files, and filesystems that refuse ``O_DIRECT``, are streamed file to file with
``os.copy_file_range`` (the kernel copies, as ``cp`` does) with write-behind. Converting a multi-GB drafter thus
needs no torch and ~60 MB of memory; only computed tensors (e.g. speculators ``t2d``) are held, one shard's worth at
most. The file
format is written here (a few lines: the safetensors spec is an 8-byte header length, a JSON header, the data)
because ``safetensors.torch.save_file`` needs every tensor of a shard in memory at once.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import CheckpointFormatError
from dsparkhub.io.output import background_flush, kill_point, write_json
from dsparkhub.io.sharding import plan_shards

SHARD_SLACK = 256 << 20
#: bytes copied per step; each step's output is handed to the kernel's write-back at once (see _copy_range)
COPY_STEP = 128 << 20
#: smallest step handed to write-back on its own (the read / write fallback copies 8 MiB at a time)
_WRITE_BEHIND_MIN = 8 << 20
#: files copying at least this many bytes are written with O_DIRECT (_write_direct), in blocks of DIRECT_BLOCK
DIRECT_MIN = 64 << 20
DIRECT_BLOCK = 8 << 20
_ALIGN = 4096
_KILL_COUNT = 0


@dataclass(frozen=True)
class SourceBytes:
    """A tensor copied byte for byte from an existing safetensors file, never loaded into memory.

    A ``load()`` of :func:`write_shards` returns this instead of a ``torch.Tensor`` for plain copies: the bytes go
    from the source file to the output with ``os.copy_file_range`` (inside the kernel, like ``cp``), so peak memory
    does not grow with the tensor and torch is not needed.

    Attributes:
        path: the source safetensors file.
        start: byte offset of the tensor's data from the start of that file (header included).
        nbytes: size of the data.
        dtype: safetensors dtype code (``"BF16"``, ...).
        shape: dimensions.
    """

    path: str
    start: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, path: str | Path, info) -> "SourceBytes":
        """The bytes of a tensor a checkpoint reader described (``dsparkhub.io.header.TensorInfo``: ``start``
        from the start of the file, ``nbytes``, ``dtype``, ``shape``) in the file ``path`` that holds it."""
        return cls(str(path), info.start, info.nbytes, info.dtype, info.shape)


#: torch dtype name -> safetensors dtype code (safetensors ``torch.py`` _TYPES, inverted).
_TORCH_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16",
                "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
                "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4", "complex64": "C64"}


def _entry(name: str, payload) -> tuple[str, list[int], int, object]:
    """``(dtype code, shape, nbytes, payload)`` of a SourceBytes or a torch tensor (made contiguous)."""
    if isinstance(payload, SourceBytes):
        return payload.dtype, list(payload.shape), payload.nbytes, payload
    tensor = payload.contiguous()
    code = _TORCH_CODES.get(str(tensor.dtype).removeprefix("torch."))
    if code is None:
        raise CheckpointFormatError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
    shape = list(tensor.shape)
    if code == "F4":  # float4_e2m1fn_x2 packs two values per element; safetensors counts values
        shape[-1] *= 2
    return code, shape, tensor.numel() * tensor.element_size(), tensor


def _write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _copy_range(src: SourceBytes, src_fd: int, dst_fd: int, what: str, dst: int) -> None:
    """Copy ``src``'s bytes (read through ``src_fd``) to offset ``dst`` of ``dst_fd`` inside the kernel
    (``os.copy_file_range``, as ``cp`` does; read / write fallback where the filesystem refuses).

    Write-behind: every :data:`COPY_STEP` bytes copied are handed to write-back at once (``posix_fadvise``
    ``DONTNEED`` starts it without waiting, the fallback PostgreSQL's ``pg_flush_data`` uses where
    ``sync_file_range`` is missing), so the disk writes while the next step is copied, the final ``fsync`` finds
    little left to do, and dirty pages do not pile up to the kernel's dirty limit. Measured here on this path (ext4
    on a 2-core VM, ``scripts/bench.py``, before large files moved to :func:`_write_direct`): a 3.1 GB convert 0.4
    to 1 s faster; attaching the 10.9 GB V4-Flash drafter 9-10 s with it, 20-22 s without (the copy then crawls near
    240 MB/s with one core busy in the kernel once ~2.2 GB are dirty, as ``cp`` does); a 1 GB copy ~0.05 s slower.
    The output's pages leave the page cache once written back.
    """
    pos, left = src.start, src.nbytes
    use_cfr = hasattr(os, "copy_file_range")
    while left:
        n = 0
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, min(left, COPY_STEP), pos, dst)
            except OSError:  # EXDEV on old kernels, EINVAL / ENOSYS on some filesystems
                use_cfr = False
                continue
        else:
            chunk = os.pread(src_fd, min(left, 8 << 20), pos)
            _write_all(dst_fd, chunk, dst)
            n = len(chunk)
        if n == 0:
            raise CheckpointFormatError(f"the source file ends before the end of {what} ({left} of "
                                        f"{src.nbytes} bytes missing)", path=src.path)
        if n >= _WRITE_BEHIND_MIN and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(dst_fd, dst, n, os.POSIX_FADV_DONTNEED)
            except OSError:  # a hint only
                pass
        pos += n
        dst += n
        left -= n


def _tensor_bytes(tensor):
    import torch

    return tensor.reshape(-1).view(torch.uint8).numpy()


def _layout(entries: list[tuple]) -> list[tuple]:
    """Order of the tensors' data in a new file: copies in the order they lie in their sources, then computed
    tensors by decreasing element size, when that keeps every tensor aligned to its element size (then a shard that
    renames the tensors of one source file copies its data as a few large ranges, like ``cp``); otherwise decreasing
    element size throughout, as the ``safetensors`` library does (stable: the given order kept within a size)."""
    from dsparkhub.io.header import DTYPE_BITS

    copies = sorted((e for e in entries if isinstance(e[4], SourceBytes)), key=lambda e: (e[4].path, e[4].start))
    computed = sorted((e for e in entries if not isinstance(e[4], SourceBytes)), key=lambda e: -DTYPE_BITS[e[1]])
    offset = 0
    for e in copies + computed:
        if offset % max(1, DTYPE_BITS[e[1]] // 8):
            return sorted(entries, key=lambda e: -DTYPE_BITS[e[1]])
        offset += e[3]
    return copies + computed


def _coalesce(copies: list[tuple[SourceBytes, int, str]]) -> list[tuple[SourceBytes, int, list[str]]]:
    """Sort ``(source range, output offset, tensor name)`` copies by source position (a cold source is then read
    front to back, as ``cp`` reads it) and merge those that follow each other both in one source file and in the
    output into ``(range, output offset, names)`` runs: a shard that renames the tensors of one source file is
    copied as one range."""
    runs: list[tuple[SourceBytes, int, list[str]]] = []
    for src, dst, name in sorted(copies, key=lambda c: (c[0].path, c[0].start)):
        if runs:
            last, last_dst, names = runs[-1]
            if last.path == src.path and last.start + last.nbytes == src.start and last_dst + last.nbytes == dst:
                runs[-1] = (SourceBytes(src.path, last.start, last.nbytes + src.nbytes, "U8", ()), last_dst,
                            names + [name])
                continue
        runs.append((src, dst, [name]))
    return runs


def _source_fd(sources: dict[str, int], path: str) -> int:
    """The descriptor of source file ``path``, opened once per written file (read sequentially) and kept in
    ``sources``; the caller closes them."""
    if path not in sources:
        sources[path] = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(sources[path], 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return sources[path]


def write_file(path: Path, head: bytes, copies: list[tuple[SourceBytes, int, str]],
               writes: Iterable[tuple[str, int, object]] = ()) -> None:
    """Create ``path`` from a header and tensor data placed at fixed offsets.

    Args:
        path: the file to create (truncated if it exists).
        head: bytes written at offset 0 (a safetensors file's length prefix and JSON header).
        copies: ``(source range, offset in path, tensor name)``; copied by the kernel (:func:`_copy_range`),
            coalesced into runs (:func:`_coalesce`), one descriptor per source file for the whole file (a fresh open
            per tensor restarts the kernel's read-ahead at its smallest window, which halves cold-read speed).
        writes: ``(tensor name, offset in path, torch.Tensor)`` for computed tensors.

    Large files (at least :data:`DIRECT_MIN` bytes copied) are written with ``O_DIRECT`` where the filesystem
    allows it (:func:`_write_direct`); otherwise through the page cache as described above.

    Raises:
        CheckpointFormatError: a source file ends before a range it should hold.
    """
    writes = list(writes)
    if sum(src.nbytes for src, _, _ in copies) >= DIRECT_MIN and _write_direct(path, head, copies, writes):
        return
    sources: dict[str, int] = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, head, 0)
        kill_point(f"wrote the header of {path.name}")
        for src, dst, names in _coalesce(copies):
            what = f"tensor {names[0]!r}" if len(names) == 1 else f"tensors {names[0]!r} to {names[-1]!r}"
            _copy_range(src, _source_fd(sources, src.path), fd, what, dst)
            for name in names:
                kill_point(f"wrote tensor {name} to {path.name}")
        for name, dst, tensor in writes:
            if tensor.numel():
                _write_all(fd, _tensor_bytes(tensor), dst)
            kill_point(f"wrote tensor {name} to {path.name}")
    finally:
        os.close(fd)
        for src_fd in sources.values():
            os.close(src_fd)


def _write_direct(path: Path, head: bytes, copies: list[tuple[SourceBytes, int, str]],
                  writes: list[tuple[str, int, object]]) -> bool:
    """Write ``path`` through ``O_DIRECT``: the file is assembled in :data:`DIRECT_BLOCK` blocks in an aligned
    buffer (source bytes read into it with ``preadv``, from the page cache when another reader, such as convert's
    provenance hash, has just read them) and each block goes from that buffer to the disk, bypassing the page cache;
    the last block is padded to the alignment and the file truncated to its size.

    Why: a page-cache copy (``copy_file_range``, ``cp``) makes the kernel allocate, dirty and write back every output
    page: 2.3-3 s of kernel CPU for a 3.1 GB drafter on this 2-core VM, beside the provenance hash's 1.5 s, so convert
    was CPU-bound. Direct writes measured 0.3-1.7 s of kernel CPU and 2.0-3.0 s wall instead of 3.0-3.3 s for the
    same copy (``scripts/bench.py`` convert).

    Returns:
        False when ``O_DIRECT`` is unavailable (not Linux) or refused (tmpfs, some network filesystems: at open, or
        EINVAL / EOPNOTSUPP from a write), or the pieces do not tile the file from byte 0 without gaps or overlaps;
        the caller then writes the whole file again through the page cache (it opens it with ``O_TRUNC``).

    Raises:
        CheckpointFormatError: a source file ends before a range it should hold.
    """
    import mmap

    if not hasattr(os, "O_DIRECT") or not hasattr(os, "preadv"):
        return False
    # (offset in path, length, what, payload): the header, copied ranges, computed tensors
    pieces = [(0, len(head), "the header", head)]
    pieces += [(dst, src.nbytes, name, src) for src, dst, name in copies]
    pieces += [(dst, t.numel() * t.element_size(), name, t) for name, dst, t in writes]
    pieces = sorted((x for x in pieces if x[1]), key=lambda x: x[0])
    at = 0
    for off, n, _, _ in pieces:
        if off != at:
            return False
        at += n
    total = at
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT needs
    except OSError:
        os.close(fd)
        return False
    view = memoryview(buf)
    sources: dict[str, int] = {}
    named = {name for _, _, name in copies} | {name for name, _, _ in writes}
    k = 0  # first piece not yet fully written
    try:
        for start in range(0, total, DIRECT_BLOCK):
            n = min(DIRECT_BLOCK, total - start)
            j = k
            while j < len(pieces) and pieces[j][0] < start + n:
                off, size, what, payload = pieces[j]
                a, b = max(off, start), min(off + size, start + n)
                if isinstance(payload, SourceBytes):
                    _read_into(_source_fd(sources, payload.path), view[a - start:b - start],
                               payload.start + a - off, f"tensor {what!r}", payload)
                elif isinstance(payload, bytes):
                    view[a - start:b - start] = payload[a - off:b - off]
                else:
                    view[a - start:b - start] = _tensor_bytes(payload)[a - off:b - off]
                j += 1
            aligned = -(-n // _ALIGN) * _ALIGN
            view[n:aligned] = bytes(aligned - n)
            try:
                _write_all(fd, view[:aligned], start)
            except OSError as exc:  # the filesystem refuses O_DIRECT after all: the caller starts again
                if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                    return False
                raise
            if start == 0:
                kill_point(f"wrote the header of {path.name}")
            while k < len(pieces) and pieces[k][0] + pieces[k][1] <= start + n:
                if pieces[k][2] in named:
                    kill_point(f"wrote tensor {pieces[k][2]} to {path.name}")
                k += 1
        os.ftruncate(fd, total)
        return True
    finally:
        os.close(fd)
        for src_fd in sources.values():
            os.close(src_fd)
        try:  # a slice kept alive by a traceback would make close() raise over the real error: leave it to the GC
            view.release()
            buf.close()
        except BufferError:
            pass


def _read_into(fd: int, view: memoryview, pos: int, what: str, src: SourceBytes) -> None:
    """Fill ``view`` from ``fd`` at ``pos`` (``preadv`` until full)."""
    while view:
        got = os.preadv(fd, [view], pos)
        if got == 0:
            raise CheckpointFormatError(f"the source file ends before the end of {what} ({len(view)} bytes missing)",
                                        path=src.path)
        view, pos = view[got:], pos + got


def write_safetensors(path: Path, payloads: list[tuple[str, object]], metadata: dict[str, str]) -> None:
    """Write one safetensors file from ``(name, torch.Tensor | SourceBytes)`` pairs.

    Format (safetensors spec): 8-byte little-endian header length, JSON header padded with spaces to a multiple of
    8, then the data, with no holes. Every tensor's data is aligned to its element size: copies keep their sources'
    order where that allows it (:func:`_layout`), so the bytes of consecutive tensors are copied as one range;
    otherwise tensors are laid out by decreasing element size, as the ``safetensors`` library does.

    Args:
        path: the file to create (truncated if it exists).
        payloads: ``(name, tensor)`` pairs; the header lists them in data order.
        metadata: ``__metadata__`` (strings only).

    Raises:
        CheckpointFormatError: a source is cut short, or a tensor's dtype has no safetensors code.
    """
    entries = _layout([(name, *_entry(name, p)) for name, p in payloads])
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, nbytes, _ in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    copies, writes, at = [], [], len(head)
    for name, _, _, nbytes, data in entries:
        if isinstance(data, SourceBytes):
            copies.append((data, at, name))
        else:
            writes.append((name, at, data))
        at += nbytes
    write_file(path, head, copies, writes)


def write_shards(folder: Path, items: Iterable[tuple[str, int, Callable[[], object]]], *,
                 max_shard_bytes: int | None = None, metadata: dict[str, str] | None = None) -> list[str]:
    """Write tensors into ``model.safetensors`` or ``model-XXXXX-of-YYYYY.safetensors`` + index.

    Args:
        folder: destination folder (normally the temporary folder of :func:`atomic_output`).
        items: ``(name, nbytes, load)`` triples in output order; ``load()`` returns a ``torch.Tensor`` (computed
            tensors) or a :class:`SourceBytes` (plain copies, streamed file to file without entering memory) and is
            called only when its shard is about to be written.
        max_shard_bytes: shard size cap; default = the largest tensor + 256 MiB. Grouping:
            :func:`dsparkhub.io.sharding.plan_shards`.
        metadata: safetensors ``__metadata__`` (``{"format": "pt"}`` is always set).

    Returns:
        Shard file names written.

    Raises:
        CheckpointFormatError: a source file is shorter than a SourceBytes says, or a tensor's dtype has no
            safetensors code.

    Memory: only tensors returned as ``torch.Tensor`` are held, one shard's worth at most; copies stream.
    """
    items = list(items)
    cap = max_shard_bytes or (max((n for _, n, _ in items), default=0) + SHARD_SLACK)
    by_name = {item[0]: item for item in items}
    groups = [[by_name[n] for n in shard] for shard in plan_shards([(n, nb) for n, nb, _ in items], cap)]
    meta = {"format": "pt", **(metadata or {})}
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    weight_map: dict[str, str] = {}
    with background_flush() as flush:  # shard k goes to disk while shard k + 1 is copied
        for fname, group in zip(names, groups):
            write_safetensors(folder / fname, [(name, load()) for name, _, load in group], meta)
            weight_map.update({name: fname for name, _, _ in group})
            flush(folder / fname)
    if len(names) > 1:
        write_json(folder / "model.safetensors.index.json",
                   {"metadata": {"total_size": sum(n for _, n, _ in items)}, "weight_map": weight_map})
    return names
