"""Header-only view of a safetensors checkpoint (local folder, or a Hub repo through ``dsparkhub.hub.remote``).

Owns: resolving ``model.safetensors.index.json`` to shard files, reading ``config.json`` and the index (size-capped,
strict), the :class:`Checkpoint` record and lazy per-tensor access (bytes hashing, torch tensors) for the few places
that need data. It never loads a whole shard: metadata comes from headers (``dsparkhub.io.header``); data is read
one tensor at a time. Paths are checked by ``dsparkhub.io.safety``; pickle weights are read only through
``dsparkhub.io.pickle_weights``.

Does not: know about layouts (``dsparkhub.layouts.recipes``) or write anything (``dsparkhub.io.writer``).

Measured (``scripts/bench.py index``, issue 18; 2-core machine, quiet, median of 5): ``validate`` against a
208,215-tensor Kimi-K2.6-shaped target takes 0.57 s wall / 78 MB (index written by ``save_pretrained``, indent 2 +
sorted keys) and 0.54 s / 77 MB (compact), beside a bare ``json.load`` of the same index as a process in 0.44 / 0.36 s
in the same run. The benchmark prints the floor beside it: start-up (``dsparkhub --version``: interpreter, click, the
CLI) 132-152 ms, reading + decoding the 23 MB index 204-205 ms (:func:`read_index`, msgspec typed; orjson measured
within 10 %), the shard headers holding the embedding and LM head 39 ms. A lazy scan of the index
text that answers only the names validate needs (one regular-expression pass proving the whole map is a flat
``{name: shard}`` object, then ``bytes.find`` per name and per shard prefix) was built and measured at 160-190 ms on
the same machine, no faster than the decode, and was not kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError
from dsparkhub.io.header import MSGSPEC_REFUSED, TensorInfo, gc_paused, read_header
from dsparkhub.io.pickle_weights import pickle_as_safetensors, pickle_weight_files
from dsparkhub.io.safety import PICKLE_SUFFIXES, SHOW, TRAINING_STATE_PREFIXES, refuse_special, safe_member

#: refuse config / index files larger than this (a 1T-parameter target's index is ~20 MB).
MAX_JSON_BYTES = 512 << 20
INDEX_NAME = "model.safetensors.index.json"
#: the config of a Mistral-native checkpoint (consolidated*.safetensors beside it), read when there is no config.json
MISTRAL_CONFIG = "params.json"


def read_json(path: str | Path, what: str = "JSON file") -> dict:
    """Read a JSON object from ``path``.

    Raises:
        CheckpointNotFoundError: missing file.
        CheckpointFormatError: not UTF-8 / not JSON / not an object.
    """
    path = Path(path)
    refuse_special(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise CheckpointFormatError(f"{what} is larger than {MAX_JSON_BYTES} bytes (corrupt or hostile file)",
                                        path=path)
        with gc_paused():  # indexes of 1T-parameter targets list ~200k tensors
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


def _decode_index_of_shards(raw: bytes, folder: Path):
    """``raw`` decoded as an :class:`_Index` whose values must be one of the ``*.safetensors`` files in ``folder``
    (a ``Literal`` type: msgspec then hands out the same few value strings instead of building 200k of them,
    ~15 % faster at 208k tensors); None when the folder cannot be listed or a value names another file (the caller
    then decodes it as ``dict[str, str]``, which gives the same result or the same refusal)."""
    try:
        shards = tuple(sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")))
    except OSError:
        return None
    if not shards:
        return None
    typed = msgspec.defstruct("_IndexOfShards", [("weight_map", dict[str, Literal[shards]]), ("metadata", Any, None)])
    try:
        return msgspec.json.Decoder(typed).decode(raw)
    except msgspec.ValidationError:
        return None


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
    refuse_special(path)
    try:
        with open(path, "rb") as f:
            # read(size): read(MAX_JSON_BYTES + 1) would first allocate a 512 MiB buffer
            size = os.fstat(f.fileno()).st_size
            raw = f.read(size) if size <= MAX_JSON_BYTES else b""
    except OSError:
        raw = b""  # read_json reports it
    if 0 < len(raw) <= MAX_JSON_BYTES:
        try:
            with gc_paused():
                index = _decode_index_of_shards(raw, path.parent) or _DECODE_INDEX(raw)
            return {"metadata": index.metadata, "weight_map": index.weight_map}
        except MSGSPEC_REFUSED:
            pass
    data = read_json(path, INDEX_NAME)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFormatError(f"{INDEX_NAME}: `weight_map` must map tensor names to shard file names",
                                    path=path)
    return data


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
        shard, meta = read_header(safe_member(self._folder, fname, INDEX_NAME), name=fname)
        for name in shard:
            if self._map.get(name) != fname:
                raise CheckpointFormatError(
                    f"shard {fname!r} holds tensor {SHOW.repr(name)}, which the index "
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
            raise CheckpointFormatError(f"{INDEX_NAME} maps tensor {SHOW.repr(name)} to {fname!r}, but that shard "
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
        import hashlib  # not at module level: the header-only paths never hash (saves ~4 ms of start-up)

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


def open_checkpoint(path: str | Path, *, require_config: bool = True, lazy: bool = False,
                    allow_pickle: bool = False) -> Checkpoint:
    """Index a local checkpoint folder (or a single ``.safetensors`` file) from its config and headers.

    Args:
        path: folder holding ``config.json`` (or a Mistral-native ``params.json``) plus ``model.safetensors`` /
            shards with ``model.safetensors.index.json``, or one ``.safetensors`` file.
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
    elif (path / MISTRAL_CONFIG).exists():  # Mistral-native (vLLM config_format "mistral" reads params.json)
        config = read_json(path / MISTRAL_CONFIG, MISTRAL_CONFIG)
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
            if not safe_member(path, fname, INDEX_NAME).exists():
                raise CheckpointNotFoundError(f"shard {fname!r} named by {INDEX_NAME} is missing", path=path)
        return Checkpoint(str(path), config, LazyTensors(path, weight_map, metadata), files, index, metadata)
    for fname in files:
        fpath = safe_member(path, fname, INDEX_NAME if weight_map is not None else "shard")
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
