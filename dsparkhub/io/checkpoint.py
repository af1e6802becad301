"""Header-only view of a safetensors checkpoint (local folder, or a Hub repo through ``dsparkhub.hub.push``).

Owns: parsing safetensors headers (8-byte little-endian length + JSON) with every sanity check a hostile file needs,
resolving ``model.safetensors.index.json`` to shard files, reading ``config.json``, refusing pickle weights and
paths that leave the checkpoint folder, and lazy per-tensor access (bytes hashing, torch tensors) for the few places
that need data. It never loads a whole shard: metadata comes from headers; data is read one tensor at a time.

Does not: know about layouts (``dsparkhub.layouts.recipes``) or write anything (``dsparkhub.io.writer``).

The header is parsed here rather than by ``safetensors.safe_open`` because validating a 1T-parameter target must
touch only a few KiB per shard and must be able to run on headers fetched over HTTP. The rules are the safetensors
library's own (``safetensors/src/tensor.rs``, ``Metadata::validate`` and ``SafeTensors::read_metadata``): the tensors'
byte ranges, sorted by offset, must tile the data section from byte 0 to the end of the file with no gap, overlap or
trailing byte.

JSON is decoded with msgspec (a 208k-entry index in ~75 ms, the stdlib ~170 ms) when the result is provably what the
stdlib's strict parse would give; anything msgspec refuses, and any header whose keys cannot be proven distinct, goes
through the stdlib parse with its duplicate-key hook, so hostile files get the same checks and the same messages.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import math
import os
import reprlib
import stat
import struct
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError

#: bytes per element of each safetensors dtype code (safetensors ``Dtype``; sub-byte types are counted per byte
#: pair below).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
#: refuse headers larger than this (safetensors itself caps at 100 MB).
MAX_HEADER_BYTES = 100_000_000
#: refuse config / index files larger than this (a 1T-parameter target's index is ~20 MB).
MAX_JSON_BYTES = 512 << 20
INDEX_NAME = "model.safetensors.index.json"
#: the record ``dsparkhub attach`` writes into an attached checkpoint (``dsparkhub.attach``)
ATTACH_RECORD = "dsparkhub_attach.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: pickle files that are training state, not weights; they are ignored (never loaded, never copied).
TRAINING_STATE_PREFIXES = ("training_state", "optimizer", "scheduler", "rng_state", "training_args")
#: bounded repr for values quoted from hostile files (depth, length and width capped; never recurses deeply).
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 3, 8, 8, 80, 80


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header describes it.

    Attributes:
        name: tensor name in the file.
        dtype: safetensors dtype code (``"BF16"``, ``"F8_E4M3"``, ...).
        shape: dimensions, e.g. ``(V, H)``.
        file: shard file name, relative to the checkpoint folder.
        start: byte offset of the data from the start of the file (header included).
        nbytes: size of the data in bytes.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    start: int = 0
    nbytes: int = 0

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar)."""
        return math.prod(self.shape)

    def to_dict(self) -> dict:
        """JSON-friendly ``{"dtype", "shape", "file"}``."""
        return {"dtype": self.dtype, "shape": list(self.shape), "file": self.file}


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while parsing large JSON.

    A 1T-parameter target's headers hold ~200k entries (~1M Python objects, none in a cycle); every 700
    allocations would otherwise trigger a collection that walks the growing heap, which more than doubles the parse
    time. Reference counting still frees everything.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8


def _check_entry(name: str, entry, file: str, data_size: int | None) -> tuple[str, tuple[int, ...], int, int, int]:
    """Check one header entry; returns ``(dtype, shape, begin, end, nbytes)`` or raises CheckpointFormatError."""
    where = f"tensor {_SHOW.repr(name)}"
    if not isinstance(entry, dict):
        raise CheckpointFormatError(f"{where}: header entry must be an object, found {type(entry).__name__}",
                                    path=file)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise CheckpointFormatError(f"{where}: unknown dtype {_SHOW.repr(dtype)}; expected one of "
                                    f"{sorted(DTYPE_BITS)}",
                                    path=file)
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**53 for d in shape):
        raise CheckpointFormatError(f"{where}: shape must be a list of non-negative integers, found "
                                    f"{_SHOW.repr(shape)}",
                                    path=file)
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise CheckpointFormatError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                                    f"found {_SHOW.repr(offsets)}", path=file)
    shape_t = tuple(shape)
    expected = _expected_nbytes(dtype, shape_t)
    if offsets[1] - offsets[0] != expected:
        raise CheckpointFormatError(
            f"{where}: data_offsets span {offsets[1] - offsets[0]} bytes but dtype {dtype} x shape {shape} "
            f"needs {expected}", path=file)
    if data_size is not None and offsets[1] > data_size:
        raise CheckpointFormatError(
            f"{where}: data ends at byte {offsets[1]} of the data section, but the file holds only "
            f"{data_size} data bytes (truncated file?)", path=file)
    return dtype, shape_t, offsets[0], offsets[1], expected


_DECODE = msgspec.json.Decoder().decode
#: what msgspec's JSON decoder raises on bytes it will not decode (the stdlib parse then decides)
_MSGSPEC_REFUSED = (msgspec.DecodeError, RecursionError)


def _keys_provably_distinct(raw: bytes, header: dict) -> bool:
    """Whether no JSON object in ``raw`` named a key twice, given ``header`` = ``raw`` decoded by msgspec (which,
    like the stdlib without a hook, keeps the last of duplicated keys).

    Every key in the text is followed by one ``:`` outside strings, and other colons only occur inside strings, so
    ``raw.count(b":") = keys in the text + colons inside strings``. Counting the keys of the decoded dicts and the
    colons in (some of) their decoded strings can only fall short of that: equality proves every key of the text
    survived decoding, i.e. none was duplicated. ``\\u003a`` (a colon spelled as an escape) is the one way a decoded
    string can hold more colons than its text, so such headers are never proven here. A False only means "let the
    strict parse decide".
    """
    values = header.values()
    if b"\\u003" in raw or not set(map(type, values)) <= {dict, type(None)}:
        return False
    meta = header.get("__metadata__")
    try:
        meta_colons = "".join(meta).count(":") + "".join(meta.values()).count(":") if meta else 0
    except TypeError:  # non-string metadata: an error either way, reported by the strict parse
        return False
    keys = len(header) + sum(map(len, filter(None, values)))
    return raw.count(b":") == keys + "".join(header).count(":") + meta_colons


def _decode_header_strict(raw: bytes, file: str) -> Any:
    """The stdlib parse with a duplicate-key hook: the reference behaviour and every error message."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(f"safetensors header is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                                    path=file) from None
    dupes: list[str] = []

    def no_dupes(pairs):
        # called once per JSON object (~200k for a 1T-parameter target): the common case stays in C
        seen = dict(pairs)
        if len(seen) != len(pairs):
            names: set = set()
            dupes.extend(k for k, _ in pairs if k in names or names.add(k))
        return seen

    try:
        header = json.loads(text, object_pairs_hook=no_dupes)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and integers over 4300 digits
        raise CheckpointFormatError(f"safetensors header is not valid JSON: {str(exc)[:200]}", path=file) from None
    if dupes:
        raise CheckpointFormatError(f"safetensors header names key {_SHOW.repr(dupes[0])} more than once (a tensor "
                                    "or field declared twice)", path=file)
    return header


def _decode_header(raw: bytes, file: str) -> Any:
    """``raw`` decoded by msgspec when that is provably what :func:`_decode_header_strict` returns, else by it."""
    try:
        header = _DECODE(raw)
    except _MSGSPEC_REFUSED:  # invalid UTF-8 / JSON, or what only the stdlib takes (NaN, 1e400, lone surrogates)
        header = None
    if type(header) is dict and _keys_provably_distinct(raw, header):
        return header
    return _decode_header_strict(raw, file)


def _parse_header_bytes(raw: bytes, *, file: str, data_size: int | None) -> tuple[dict[str, TensorInfo], dict]:
    """:func:`parse_header_bytes` without the garbage-collector pause."""
    header = _decode_header(raw, file)
    if not isinstance(header, dict):
        raise CheckpointFormatError(f"safetensors header must be a JSON object, found {type(header).__name__}",
                                    path=file)
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # safetensors: Option<HashMap<String, String>>
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise CheckpointFormatError("safetensors `__metadata__` must map strings to strings, found "
                                    f"{_SHOW.repr(metadata)} ({type(metadata).__name__})", path=file)
    tensors: dict[str, TensorInfo] = {}
    spans = []
    base = 8 + len(raw)
    # A 1T-parameter checkpoint repeats a few (dtype, shape) pairs ~200k times: each pair is checked once by
    # _check_entry; later entries only confirm their offsets (the slow path still produces every error message).
    known: dict[tuple, tuple[tuple[int, ...], int]] = {}
    for name, entry in header.items():
        try:
            shape, dtype = entry["shape"], entry["dtype"]
            shape_t, expected = known[(dtype, repr(shape) if type(shape) is list else None)]
            begin, end = entry["data_offsets"]
            ok = (type(begin) is int and type(end) is int and 0 <= begin and end - begin == expected
                  and (data_size is None or end <= data_size))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            dtype, shape_t, begin, end, expected = _check_entry(name, entry, file, data_size)
            known[(dtype, repr(list(shape_t)))] = (shape_t, expected)
        spans.append((begin, end, name))
        tensors[name] = TensorInfo(name, dtype, shape_t, file, base + begin, expected)
    _check_coverage(spans, file, data_size)
    return tensors, metadata


#: the upstream rule quoted by the coverage errors
_COVERAGE_RULE = ("safetensors (safetensors/src/tensor.rs, Metadata::validate and SafeTensors::read_metadata) and "
                  "therefore vLLM and transformers refuse the file: tensors, sorted by offset, must cover the data "
                  "section from byte 0 to the end of the file with no gap")


def _check_coverage(spans: list[tuple[int, int, str]], file: str, data_size: int | None) -> None:
    """The safetensors library's layout rule: sorted by ``(begin, end)``, each tensor starts where the previous one
    ends (the first at 0), and the last ends at the end of the file (``data_size``, when known).

    Raises:
        CheckpointFormatError: overlap, gap ("InvalidOffset" in safetensors) or bytes after the last tensor
            ("MetadataIncompleteBuffer"), naming the tensor and the expected and found data offsets.
    """
    spans.sort()
    pos, prev = 0, None
    for begin, end, name in spans:
        if begin < pos:
            raise CheckpointFormatError(f"tensors {prev!r} and {name!r} overlap (data bytes {begin}..{pos})",
                                        path=file, hint=_COVERAGE_RULE)
        if begin > pos:
            after = f"where {prev!r} ends" if prev is not None else "the start of the data section"
            raise CheckpointFormatError(
                f"tensor {name!r} starts at data offset {begin}, expected {pos} ({after}): {begin - pos} bytes "
                "no tensor covers (safetensors: InvalidOffset)", path=file, hint=_COVERAGE_RULE)
        pos, prev = end, name
    if data_size is not None and pos != data_size:
        last = f"the last tensor {prev!r}" if prev is not None else "the header, which lists no tensor,"
        raise CheckpointFormatError(
            f"{last} ends at data offset {pos}, expected {data_size} (the end of the file): {data_size - pos} "
            "trailing bytes after the last tensor (safetensors: MetadataIncompleteBuffer)", path=file,
            hint=_COVERAGE_RULE)


def parse_header_bytes(raw: bytes, *, file: str, data_size: int | None) -> tuple[dict[str, TensorInfo], dict]:
    """Parse and check the JSON header of a safetensors file.

    Args:
        raw: the header's JSON bytes (after the 8-byte length).
        file: file name used in error messages and stored in each :class:`TensorInfo`.
        data_size: bytes of the data section (file size - 8 - header length), or None when unknown (remote).

    Returns:
        ``(tensors by name, __metadata__ dict of str -> str)``.

    Raises:
        CheckpointFormatError: invalid UTF-8 / JSON, not an object, unknown dtype, bad shape, offsets that disagree
            with the shape, overlap, leave a gap or leave the file, data bytes after the last tensor (when
            ``data_size`` is known), duplicate names, non-string metadata.
    """
    with _gc_paused():
        return _parse_header_bytes(raw, file=file, data_size=data_size)


def read_header(path: str | Path, *, name: str | None = None) -> tuple[dict[str, TensorInfo], dict]:
    """Read a local safetensors file's header without touching its data.

    Args:
        path: the ``.safetensors`` file.
        name: file name to record in each TensorInfo (default: the file's base name).

    Returns:
        ``(tensors by name, __metadata__)``, see :func:`parse_header_bytes`.

    Raises:
        CheckpointNotFoundError: the file does not exist.
        CheckpointFormatError: shorter than 8 bytes, header length larger than the file or than 100 MB, or any
            problem :func:`parse_header_bytes` finds.
    """
    path = Path(path)
    _refuse_special(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointFormatError(f"file is {size} bytes, too short for a safetensors header "
                                            "(needs at least 8)", path=path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise CheckpointFormatError(f"header length field says {n} bytes; refusing headers over "
                                            f"{MAX_HEADER_BYTES} bytes (corrupt or hostile file)", path=path)
            if 8 + n > size:
                raise CheckpointFormatError(f"header length field says {n} bytes but the file has only "
                                            f"{size - 8} bytes after it (truncated file?)", path=path)
            raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointNotFoundError("safetensors file not found", path=path) from None
    except IsADirectoryError:
        raise CheckpointFormatError("expected a safetensors file, found a folder", path=path) from None
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, PermissionError):
            raise
        raise CheckpointFormatError(f"cannot read safetensors file: {exc.strerror or exc}", path=path) from None
    try:
        return parse_header_bytes(raw, file=name or path.name, data_size=size - 8 - n)
    except CheckpointFormatError as exc:
        if exc.path != (name or path.name):
            raise
        # name the whole path: a drafter's and a target's shards share base names
        raise CheckpointFormatError(exc.message, path=path, hint=exc.hint) from None


def _refuse_special(path: Path) -> None:
    """Refuse devices, FIFOs and sockets: reading ``/dev/zero`` never ends and opening a FIFO blocks forever."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # missing / unreadable: the caller's open() reports it
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise CheckpointFormatError("not a regular file (a device, FIFO or socket); refusing to read it", path=path)


def read_json(path: str | Path, what: str = "JSON file") -> dict:
    """Read a JSON object from ``path``.

    Raises:
        CheckpointNotFoundError: missing file.
        CheckpointFormatError: not UTF-8 / not JSON / not an object.
    """
    path = Path(path)
    _refuse_special(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise CheckpointFormatError(f"{what} is larger than {MAX_JSON_BYTES} bytes (corrupt or hostile file)",
                                        path=path)
        with _gc_paused():  # indexes of 1T-parameter targets list ~200k tensors
            data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{what} not found", path=path) from None
    except IsADirectoryError:
        raise CheckpointFormatError(f"expected {what}, found a folder", path=path) from None
    except UnicodeDecodeError:
        raise CheckpointFormatError(f"{what} is not valid UTF-8", path=path) from None
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and integers over 4300 digits
        raise CheckpointFormatError(f"{what} is not valid JSON: {str(exc)[:200]}", path=path) from None
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{what} must hold a JSON object, found {type(data).__name__}", path=path)
    return data


class _Index(msgspec.Struct):
    """``model.safetensors.index.json`` as transformers ``save_pretrained`` / huggingface_hub write it."""

    weight_map: dict[str, str]
    metadata: Any = None


_DECODE_INDEX = msgspec.json.Decoder(_Index).decode


def read_index(path: str | Path) -> dict:
    """Read ``model.safetensors.index.json``: ``{"metadata": ..., "weight_map": {tensor name: shard file}}``.

    The common case is decoded by msgspec straight into ``dict[str, str]`` (a 1T-parameter target's index lists
    ~200k tensors: ~0.1 s, whatever its indentation or key order, against ~0.2 s for the stdlib plus a per-entry
    type check); anything msgspec refuses goes through :func:`read_json`, which reports it. Other top-level keys
    are kept only on that path (no reader uses them).

    Raises:
        CheckpointNotFoundError: missing file.
        CheckpointFormatError: too large, not UTF-8 / JSON / an object, or ``weight_map`` not a map of strings to
            strings.
    """
    path = Path(path)
    _refuse_special(path)
    try:
        with open(path, "rb") as f:
            # read(size): read(MAX_JSON_BYTES + 1) would first allocate a 512 MiB buffer
            size = os.fstat(f.fileno()).st_size
            raw = f.read(size) if size <= MAX_JSON_BYTES else b""
    except OSError:
        raw = b""  # read_json reports it
    if 0 < len(raw) <= MAX_JSON_BYTES:
        try:
            with _gc_paused():
                index = _DECODE_INDEX(raw)
            return {"metadata": index.metadata, "weight_map": index.weight_map}
        except _MSGSPEC_REFUSED:
            pass
    data = read_json(path, INDEX_NAME)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFormatError(f"{INDEX_NAME}: `weight_map` must map tensor names to shard file names",
                                    path=path)
    return data


def _safe_member(folder: Path, rel: str, what: str) -> Path:
    """Resolve ``rel`` inside ``folder``, refusing absolute paths, ``..`` and symlinks that leave the folder."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts or "\\" in rel \
            or "\x00" in rel or len(rel) > 1024 or any(len(part) > 255 for part in Path(rel).parts):
        raise UnsafeCheckpointError(f"{what} names {_SHOW.repr(rel)}, which is not a plain file name inside the "
                                    "checkpoint", path=folder,
                                    hint="shard names must be relative paths without '..', NUL or over-long parts")
    path = folder / rel
    try:
        root = folder.resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # pathlib raises RuntimeError on a symlink loop (Python < 3.13)
        raise UnsafeCheckpointError(f"{what} {rel!r} cannot be resolved inside the checkpoint: {exc}",
                                    path=folder) from None
    if root != real and root not in real.parents and not _hf_cache_blob(root, real) \
            and not _recorded_attach_link(root, rel, real):
        raise UnsafeCheckpointError(f"{what} {rel!r} is a link that resolves outside the checkpoint folder "
                                    f"(to {real})", path=folder)
    return path


def file_identity(path: str | Path) -> tuple[int, int, int]:
    """``(device, inode, size)`` of the file ``path`` (links followed): what an attach record stores for each target
    file it symlinked, and what a reader compares a link out of the checkpoint against.

    Raises:
        OSError: ``path`` cannot be stat'ed.
    """
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size


@functools.lru_cache(maxsize=16)
def _attach_symlinks(root: Path, stamp: int) -> dict[str, tuple[int, int, int]]:
    """``{file: (device, inode, size)}`` of the target files ``attach --symlink`` linked into ``root``, from its
    :data:`ATTACH_RECORD` (``stamp`` is the record's mtime, so that a rewritten record is read again); ``{}`` without
    a readable record."""
    try:
        rec = json.loads((root / ATTACH_RECORD).read_text())
        if rec.get("tool") != "dsparkhub" or rec.get("command") != "attach":
            return {}
        return {k: tuple(v) for k, v in rec["target"]["links"].items()
                if isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _recorded_attach_link(root: Path, rel: str, real: Path) -> bool:
    """An ``attach --symlink`` output's link to the target's own file: its attach record names the file's device,
    inode and size as attach saw them (:func:`file_identity`), and the link must lead to that very file. A record
    copied or written elsewhere cannot name another local file (the only other outside link a checkpoint may
    have)."""
    try:
        stamp = (root / ATTACH_RECORD).stat().st_mtime_ns
        identity = file_identity(real)
    except OSError:
        return False
    return _attach_symlinks(root, stamp).get(rel) == identity


def _hf_cache_blob(root: Path, real: Path) -> bool:
    """A Hugging Face cache snapshot's link into its own blob store: ``models--ns--name/snapshots/<rev>/f`` ->
    ``models--ns--name/blobs/<hash>`` (huggingface_hub's cache layout)."""
    return (root.parent.name == "snapshots" and real.parent == root.parent.parent / "blobs"
            and root.parent.parent.name.startswith(("models--", "datasets--")))


class LazyTensors(Mapping):
    """``{tensor name: TensorInfo}`` of a sharded checkpoint whose shard headers are parsed on first use.

    Names, ``in`` and ``len`` come from ``model.safetensors.index.json`` alone; looking a tensor up parses the
    header of the one shard that holds it (once). Validating a drafter against a 1T-parameter target (64 shards,
    ~200k tensors, ~30 MB of header JSON) thus reads the index plus the one or two shards holding the embedding and
    LM head. Iterating ``values()`` / ``items()`` parses every shard, exactly like the eager path.

    Each parsed shard gets the eager path's consistency checks against the index; the checkpoint's ``metadata``
    gains a shard's ``__metadata__`` when that shard is parsed.

    Raises (on access):
        KeyError: the index does not list the name.
        CheckpointFormatError: the shard's header is malformed, does not hold a tensor the index maps to it, or holds
            one the index does not list (or maps elsewhere).
    """

    def __init__(self, folder: Path, weight_map: dict[str, str], metadata: dict[str, dict]):
        self._folder, self._map, self._metadata = folder, weight_map, metadata
        self._parsed: dict[str, TensorInfo] = {}
        self._done: set[str] = set()

    def _load(self, fname: str) -> None:
        index_path = self._folder / INDEX_NAME
        shard, meta = read_header(_safe_member(self._folder, fname, INDEX_NAME), name=fname)
        for name in shard:
            if self._map.get(name) != fname:
                raise CheckpointFormatError(
                    f"shard {fname!r} holds tensor {_SHOW.repr(name)}, which the index "
                    + ("does not list" if name not in self._map else f"maps to {self._map[name]!r}"),
                    path=index_path)
        self._metadata[fname] = meta
        self._parsed.update(shard)
        self._done.add(fname)

    def __getitem__(self, name: str) -> TensorInfo:
        fname = self._map[name]
        if fname not in self._done:
            self._load(fname)
        info = self._parsed.get(name)
        if info is None:  # the index's side of the eager consistency check, made per tensor
            raise CheckpointFormatError(f"{INDEX_NAME} maps tensor {_SHOW.repr(name)} to {fname!r}, but that shard "
                                        "does not hold it", path=self._folder / INDEX_NAME)
        return info

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def __iter__(self):
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)


@dataclass
class Checkpoint:
    """A checkpoint's config and tensor headers, read without loading weights.

    Attributes:
        path: the folder (local) or ``hub:REPO@REV`` (remote).
        config: parsed ``config.json`` (empty dict when the folder has none).
        tensors: every tensor by name, with its shard file (a :class:`LazyTensors` when opened with ``lazy``).
        files: shard file names, in index order.
        index: parsed ``model.safetensors.index.json`` or None.
        metadata: ``__metadata__`` per shard file.
        remote: True when headers came over HTTP (no local data access).
    """

    path: str
    config: dict
    tensors: Mapping[str, TensorInfo]
    files: list[str]
    index: dict | None = None
    metadata: dict[str, dict] = field(default_factory=dict)
    remote: bool = False

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data over all shards."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def num_parameters(self) -> int:
        """Number of elements over all tensors."""
        return sum(t.numel for t in self.tensors.values())

    def dtypes(self) -> dict[str, int]:
        """``{dtype code: number of tensors}``."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.dtype] = out.get(t.dtype, 0) + 1
        return out

    def file_path(self, info: TensorInfo | str) -> Path:
        """Local path of the shard holding a tensor (or of a shard file name)."""
        if self.remote:
            raise CheckpointFormatError("tensor data of a remote checkpoint is not available locally",
                                        path=self.path)
        return Path(self.path) / (info.file if isinstance(info, TensorInfo) else info)

    def tensor_sha256(self, name: str) -> str:
        """sha256 of one tensor's raw bytes, read in 8 MiB chunks straight from its shard (no torch).

        Raises:
            KeyError: no such tensor.
        """
        info = self.tensors[name]
        h = hashlib.sha256()
        with open(self.file_path(info), "rb") as f:
            f.seek(info.start)
            left = info.nbytes
            while left:
                chunk = f.read(min(left, 8 << 20))
                if not chunk:
                    raise CheckpointFormatError(f"tensor {name!r} is cut short by the end of the file",
                                                path=self.file_path(info))
                h.update(chunk)
                left -= len(chunk)
        return h.hexdigest()

    def read_tensor(self, name: str):
        """Load one tensor as a torch tensor (copies only that tensor's bytes into memory).

        Returns:
            ``torch.Tensor`` with the dtype and shape of the header.
        """
        from safetensors import safe_open

        info = self.tensors[name]
        with safe_open(str(self.file_path(info)), framework="pt") as f:
            return f.get_tensor(name)


def pickle_weight_files(folder: Path) -> list[str]:
    """Names of the pickle weights files in ``folder`` (``.bin`` / ``.pt`` / ... ; training state excluded), sorted."""
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and p.suffix in PICKLE_SUFFIXES and not p.name.startswith(TRAINING_STATE_PREFIXES))


def _state_dict_of(obj, source: Path) -> dict:
    """The ``{name: tensor}`` inside what ``torch.load`` returned (plain, or under state_dict / model / module)."""
    import torch

    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and set(obj) == {key} and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                       for k, v in obj.items()):
        kinds = sorted({type(v).__name__ for v in obj.values()}) if isinstance(obj, dict) else [type(obj).__name__]
        raise CheckpointFormatError(f"pickle file holds {kinds[:5]}, not a state dict of named tensors",
                                    path=source, hint="save the model's state_dict() to safetensors yourself")
    return obj


def pickle_as_safetensors(folder: str | Path) -> Path:
    """Copy a checkpoint whose weights are pickle files into a temporary safetensors folder (``--allow-pickle``).

    Each weights file (``.bin`` / ``.pt`` / ``.pth`` / ``.pkl`` / ``.ckpt``, training state excluded) is read with
    ``torch.load(weights_only=True, map_location="cpu")`` — PyTorch's restricted unpickler, which refuses anything
    but tensors and plain containers — and all tensors are written to one ``model.safetensors`` next to copies of
    the folder's ``*.json`` files, in a temporary folder removed when the process exits. The source folder is never
    modified.

    Returns:
        the temporary folder (named like the source folder).

    Raises:
        CheckpointNotFoundError: the folder holds no pickle weights.
        UnsafeCheckpointError: ``weights_only=True`` refused a file (it asks to build arbitrary objects).
        CheckpointFormatError: a file is not a state dict of tensors, or two files hold the same tensor name.
    """
    import atexit
    import pickle
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    names = pickle_weight_files(folder)
    if not names:
        raise CheckpointNotFoundError("no pickle weights (.bin / .pt / .pth) to convert", path=folder)
    tensors: dict = {}
    for name in names:
        try:
            obj = torch.load(folder / name, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError, ValueError) as exc:
            raise UnsafeCheckpointError(f"torch.load(weights_only=True) refused {name}: {str(exc)[:300]}",
                                        path=folder / name,
                                        hint="the file asks to build more than tensors; dsparkhub will not load it "
                                             "with a full unpickler — re-save it as safetensors where you trust it"
                                        ) from None
        for key, value in _state_dict_of(obj, folder / name).items():
            if key in tensors:
                raise CheckpointFormatError(f"tensor {key!r} appears in two pickle files", path=folder)
            tensors[key] = value.detach().contiguous().clone()  # clone: safetensors refuses shared storage
    tmp = Path(tempfile.mkdtemp(prefix="dsparkhub-pickle-")) / folder.name
    atexit.register(shutil.rmtree, tmp.parent, True)
    tmp.mkdir()
    for extra in folder.glob("*.json"):
        if extra.is_file() and not extra.name.endswith(".index.json"):
            shutil.copyfile(extra, tmp / extra.name)
    save_file(tensors, str(tmp / "model.safetensors"),
              metadata={"format": "pt", "dsparkhub_converted_from": ",".join(names)})
    return tmp


def resolve_pickle(path: str | Path) -> Path:
    """``path``, or a safetensors copy of it (:func:`pickle_as_safetensors`) when its only weights are pickle files.

    Follows ``step_latest`` like every reader. Used by the CLI's ``--allow-pickle``.
    """
    folder = resolve_step_dir(path)
    if folder.is_dir() and not any(p.suffix == ".safetensors" for p in folder.iterdir()) \
            and pickle_weight_files(folder):
        return pickle_as_safetensors(folder)
    return Path(path)


def open_checkpoint(path: str | Path, *, require_config: bool = True, lazy: bool = False,
                    allow_pickle: bool = False) -> Checkpoint:
    """Index a local checkpoint folder (or a single ``.safetensors`` file) from its config and headers.

    Args:
        path: folder holding ``config.json`` plus ``model.safetensors`` / shards with
            ``model.safetensors.index.json``, or one ``.safetensors`` file.
        require_config: raise when ``config.json`` is missing.
        lazy: for a sharded folder (with an index), parse a shard's header only when one of its tensors is looked
            up (:class:`LazyTensors`); the shards' existence and paths are still checked here. Used for targets,
            where only the embedding / LM head are needed. Single-file checkpoints are always parsed eagerly.
        allow_pickle: when the only weights are pickle files, read them with ``torch.load(weights_only=True)``
            into a temporary safetensors copy (:func:`pickle_as_safetensors`) and open that instead.

    Returns:
        :class:`Checkpoint`.

    Raises:
        CheckpointNotFoundError: folder, config.json or a shard named by the index is missing; no safetensors file.
        CheckpointFormatError: malformed config / index / header; a tensor in two shards; an index entry whose
            shard does not hold that tensor.
        UnsafeCheckpointError: the only weights are pickle files, or the index names paths outside the folder.
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        tensors, meta = read_header(path)
        return Checkpoint(str(path.parent), {}, tensors, [path.name], None, {path.name: meta})
    if not path.exists():
        raise CheckpointNotFoundError("checkpoint folder does not exist", path=path)
    if not path.is_dir():
        if path.suffix in PICKLE_SUFFIXES:
            raise UnsafeCheckpointError(
                "this is a pickle file; dsparkhub does not unpickle weights because loading a pickle can run "
                "arbitrary code", path=path, hint="pass the folder that holds it with --allow-pickle (loads with "
                "torch.load(weights_only=True)), or convert it to safetensors first")
        raise CheckpointFormatError("expected a checkpoint folder or a .safetensors file", path=path)
    config_path = path / "config.json"
    if config_path.exists():
        config = read_json(config_path, "config.json")
    elif require_config:
        raise CheckpointNotFoundError("config.json not found in the checkpoint folder", path=path,
                                      hint="point at the folder that holds config.json and the safetensors files")
    else:
        config = {}
    index = None
    index_path = path / INDEX_NAME
    if index_path.exists():
        index = read_index(index_path)
        weight_map = index["weight_map"]
        files = list(dict.fromkeys(weight_map.values()))
    else:
        weight_map = None
        # optimizer.safetensors & co. lie beside the weights in some training outputs: never shards
        files = sorted(p.name for p in path.iterdir() if p.name.endswith(".safetensors") and p.is_file()
                       and not p.name.startswith(TRAINING_STATE_PREFIXES))
    if not files:
        pickles = pickle_weight_files(path)
        if pickles and allow_pickle:
            return open_checkpoint(pickle_as_safetensors(path), require_config=require_config, lazy=lazy)
        if pickles:
            raise UnsafeCheckpointError(
                f"the only weights here are pickle files ({', '.join(pickles)}); dsparkhub does not unpickle "
                "weights because loading a pickle can run arbitrary code", path=path,
                hint="convert them to safetensors first (e.g. torch.load(..., weights_only=True) then "
                     "safetensors.torch.save_file), or pass --allow-pickle where the command offers it")
        raise CheckpointNotFoundError("no safetensors weights found in the checkpoint folder", path=path)
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict] = {}
    if lazy and weight_map is not None:
        for fname in files:
            if not _safe_member(path, fname, INDEX_NAME).exists():
                raise CheckpointNotFoundError(f"shard {fname!r} named by {INDEX_NAME} is missing", path=path)
        return Checkpoint(str(path), config, LazyTensors(path, weight_map, metadata), files, index, metadata)
    for fname in files:
        fpath = _safe_member(path, fname, INDEX_NAME if weight_map is not None else "shard")
        if not fpath.exists():
            raise CheckpointNotFoundError(f"shard {fname!r} named by {INDEX_NAME} is missing", path=path)
        shard_tensors, meta = read_header(fpath, name=fname)
        metadata[fname] = meta
        for name, info in shard_tensors.items():
            if name in tensors:
                raise CheckpointFormatError(f"tensor {name!r} appears in both {tensors[name].file!r} and "
                                            f"{fname!r}", path=path)
            tensors[name] = info
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in tensors or tensors[name].file != fname:
                raise CheckpointFormatError(f"{INDEX_NAME} maps tensor {name!r} to {fname!r}, but that shard does "
                                            "not hold it", path=index_path)
        extra = sorted(set(tensors) - set(weight_map))
        if extra:
            raise CheckpointFormatError(f"shards hold tensors the index does not list: {extra[:5]}",
                                        path=index_path)
    return Checkpoint(str(path), config, tensors, files, index, metadata)


def resolve_step_dir(path: str | Path) -> Path:
    """Resolve a DeepSpec run folder to the step folder its ``step_latest`` link names — the one resolver of run
    folders (``open_draft``, ``convert``, ``verify`` and ``modeling.load_drafter`` all call it).

    A folder that holds ``config.json`` (or a file) is returned unchanged. A run folder (holding ``step_<N>``
    folders) must have a ``step_latest`` link. DeepSpec always writes it as an ABSOLUTE link
    (``Path(step_dir).resolve()``, deepspec/utils/io.py:13 ``safe_symlink``, called last by
    ``ckpt_manager.save_checkpoint``), so a run folder copied elsewhere still names the original location. A link
    whose target lies outside the run folder is therefore never followed: the run's own step folder of the same
    name is read (``step_latest -> /old/run/step_2`` in ``/new/run`` reads ``/new/run/step_2``), and when the run
    has no such step the link is refused. Without ``step_latest`` the run is refused too, never guessed from the
    highest step: DeepSpec writes the link after the step's files, so a step without it may be half-saved.

    Args:
        path: a drafter / step folder, a ``.safetensors`` file, or a DeepSpec run folder.

    Returns:
        The folder to read (the path itself, or a step folder inside the run folder).

    Raises:
        CheckpointNotFoundError: missing path; a run folder whose ``step_latest`` is missing, dangling inside the
            run, or names a folder outside the run that the run does not hold a copy of.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError("path does not exist", path=path)
    if (path / "config.json").exists() or path.is_file():
        return path
    latest = path / "step_latest"
    steps = sorted((p.name for p in path.glob("step_*") if p.name != "step_latest" and p.is_dir()),
                   key=lambda n: (0, int(n[5:]), n) if n[5:].isdigit() else (1, 0, n))  # step_1000 after step_99
    if latest.is_symlink():
        link = os.readlink(latest)
        named = Path(link) if os.path.isabs(link) else path / link
        # compare resolved folders: /data -> /mnt/data must still count as inside
        if named.parent.resolve() == path.resolve():
            if not named.is_dir():
                raise CheckpointNotFoundError(f"`step_latest` points to {link!r}, which does not exist",
                                              path=path, hint=f"pass one of the step folders directly: {steps[-3:]}")
            return named.resolve()
        own = path / named.name
        if named.name.startswith("step_") and own.is_dir():
            return own
        raise CheckpointNotFoundError(
            f"`step_latest` points to {link!r}, outside this run folder (DeepSpec writes absolute links, so the "
            f"run was copied from elsewhere), and the run holds no `{named.name}` of its own", path=path,
            hint=f"pass a step folder directly, e.g. {path / steps[-1]}" if steps
            else "copy the step folders together with the run folder")
    if latest.is_dir():  # a copy made without links (cp -rL): the step's own files
        return latest
    if steps:
        raise CheckpointNotFoundError("this looks like a DeepSpec run folder but it has no `step_latest` link "
                                      "(DeepSpec writes it after a step is fully saved)", path=path,
                                      hint=f"pass a step folder directly, e.g. {path / steps[-1]}")
    return path
