"""safetensors headers: the 8-byte little-endian length + JSON, parsed with every sanity check a hostile file needs.

Owns: :class:`TensorInfo`, the dtype-size table (:data:`DTYPE_BITS`, the one copy in the package), the JSON decoding
of headers and the safetensors layout rule. Used for local files (:func:`read_header`) and for headers fetched over
HTTP (:func:`parse_header_bytes`, ``dsparkhub.hub.push``).

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

import gc
import json
import math
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError
from dsparkhub.io.safety import SHOW, refuse_special

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
def gc_paused():
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


def tensor_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of safetensors dtype code ``dtype`` and ``shape`` (sub-byte dtypes rounded up to whole
    bytes, as safetensors does). Raises KeyError for an unknown dtype."""
    return (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8


def _check_entry(name: str, entry, file: str, data_size: int | None) -> tuple[str, tuple[int, ...], int, int, int]:
    """Check one header entry; returns ``(dtype, shape, begin, end, nbytes)`` or raises CheckpointFormatError."""
    where = f"tensor {SHOW.repr(name)}"
    if not isinstance(entry, dict):
        raise CheckpointFormatError(f"{where}: header entry must be an object, found {type(entry).__name__}",
                                    path=file)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise CheckpointFormatError(f"{where}: unknown dtype {SHOW.repr(dtype)}; expected one of "
                                    f"{sorted(DTYPE_BITS)}",
                                    path=file)
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**53 for d in shape):
        raise CheckpointFormatError(f"{where}: shape must be a list of non-negative integers, found "
                                    f"{SHOW.repr(shape)}",
                                    path=file)
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise CheckpointFormatError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                                    f"found {SHOW.repr(offsets)}", path=file)
    shape_t = tuple(shape)
    expected = tensor_nbytes(dtype, shape_t)
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
MSGSPEC_REFUSED = (msgspec.DecodeError, RecursionError)


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
        raise CheckpointFormatError(f"safetensors header names key {SHOW.repr(dupes[0])} more than once (a tensor "
                                    "or field declared twice)", path=file)
    return header


def _decode_header(raw: bytes, file: str) -> Any:
    """``raw`` decoded by msgspec when that is provably what :func:`_decode_header_strict` returns, else by it."""
    try:
        header = _DECODE(raw)
    except MSGSPEC_REFUSED:  # invalid UTF-8 / JSON, or what only the stdlib takes (NaN, 1e400, lone surrogates)
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
                                    f"{SHOW.repr(metadata)} ({type(metadata).__name__})", path=file)
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
    with gc_paused():
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
    refuse_special(path)
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
