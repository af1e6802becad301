"""File hashing for provenance, results fingerprints and push comparisons.

sha256 over file bytes in 8 MiB chunks; several files are hashed in parallel threads (hashlib releases the GIL on
large buffers, so two cores are used). A checkpoint *fingerprint* identifies a drafter independently of where it
lies: the sha256 of the sorted ``name sha256`` lines of its config and weight files. A *target* fingerprint
(:func:`target_fingerprint`) hashes the config and the safetensors headers only: a target's weights are too large.

:func:`hash_and_scan` also counts NaN / Inf in every ``*.safetensors`` file in the same pass: each 8 MiB chunk, once
read, is handed to a :class:`~dsparkhub.io.finite.FiniteScan` by the reader thread (numpy on the raw bytes of each
floating-point tensor's slice) while the main thread hashes the chunk before it, so the data is read once and the
scan overlaps the hashing (``scripts/bench.py push`` reports the cost against the hash alone).
"""

from __future__ import annotations

import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsparkhub.errors import ResultsError
from dsparkhub.io.finite import FiniteScan, NonFinite

CHUNK = 8 << 20
FINGERPRINT_FILES = ("config.json",)
FINGERPRINT_SUFFIXES = (".safetensors",)


def sha256_file(path: str | Path) -> str:
    """Return the hex sha256 of the file's bytes.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    return _digest(path, None)


def _digest(path: str | Path, scan: FiniteScan | None) -> str:
    """sha256 of the file; with ``scan``, every chunk is also fed to it (in the reader thread, in file order)."""
    h = hashlib.sha256()
    views = [memoryview(bytearray(CHUNK)), memoryview(bytearray(CHUNK))]
    with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(max_workers=1) as reader:
        # double buffering: the next chunk is read (disk, or a page-cache copy) while this one is hashed; both
        # release the GIL, so a cold file costs max(read, sha256) instead of their sum. The scan runs in the reader
        # thread right after its read (numpy releases the GIL too), one chunk ahead of the hash.
        def read(view: memoryview) -> int:
            n = f.readinto(view)
            if scan is not None and n:
                scan.feed(view[:n])
            return n

        pending = reader.submit(read, views[0])
        i = 0
        while n := pending.result():
            pending = reader.submit(read, views[1 - i])
            h.update(views[i][:n])
            i = 1 - i
    return h.hexdigest()


def _pool_map(fn, paths: list[str], workers: int | None) -> list:
    workers = workers or min(len(paths), os.cpu_count() or 1) or 1
    if workers == 1 or len(paths) <= 1:
        return [fn(p) for p in paths]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, paths))


def sha256_files(paths: list[str | Path], workers: int | None = None) -> dict[str, str]:
    """Hash several files in parallel; returns ``{str(path): hex sha256}`` in input order."""
    paths = [str(p) for p in paths]
    return dict(zip(paths, _pool_map(sha256_file, paths, workers)))


def hash_and_scan(paths: list[str | Path], workers: int | None = None) -> tuple[dict[str, str], list[NonFinite]]:
    """Hash several files in parallel and count NaN / Inf in the ``*.safetensors`` ones in the same read.

    Args:
        paths: files to hash; those named ``*.safetensors`` are also scanned (:mod:`dsparkhub.io.finite`).
        workers: threads (default: one per file, at most the CPU count).

    Returns:
        ``({str(path): hex sha256}`` in input order, every tensor holding NaN / Inf (``NonFinite.file`` is
        ``str(path)``), in input and file order).

    Raises:
        FileNotFoundError: a file does not exist.
        CheckpointFormatError: a ``*.safetensors`` file's header is malformed (as ``read_header`` says).
    """
    paths = [str(p) for p in paths]

    def one(p: str) -> tuple[str, list[NonFinite]]:
        if not p.endswith(FINGERPRINT_SUFFIXES):
            return sha256_file(p), []
        scan = FiniteScan(p, os.path.getsize(p))
        return _digest(p, scan), scan.found()

    done = _pool_map(one, paths, workers)
    return {p: sha for p, (sha, _) in zip(paths, done)}, [x for _, found in done for x in found]


def fingerprint_files(folder: str | Path) -> list[Path]:
    """The files that define a drafter: ``config.json`` and every ``*.safetensors`` directly in ``folder``."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and (p.name in FINGERPRINT_FILES or p.name.endswith(FINGERPRINT_SUFFIXES)))


def checkpoint_fingerprint(folder: str | Path, hashes: dict[str, str] | None = None) -> str:
    """sha256 over ``"<file name> <sha256>\\n"`` lines of :func:`fingerprint_files`, sorted by name.

    Two folders holding the same config and weights have the same fingerprint wherever they lie.

    Args:
        folder: the drafter folder.
        hashes: ``{str(path): sha256}`` already computed (:func:`hash_and_scan`); files it lacks are hashed here.

    Raises:
        FileNotFoundError: ``folder`` does not exist.
    """
    files = fingerprint_files(folder)
    known = hashes or {}
    missing = sha256_files([p for p in files if str(p) not in known])
    lines = "".join(f"{p.name} {known.get(str(p)) or missing[str(p)]}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def target_fingerprint(folder: str | Path) -> str | None:
    """A cheap identity of a local target: sha256 over ``config.json`` and every safetensors *header*.

    Hashing a 1T-parameter target's weights would take hours, so this hashes what defines its layout and names
    (config bytes; each ``*.safetensors`` file name, size and JSON header, which holds every tensor's dtype, shape
    and offsets). Returns None when ``folder`` is not a local directory (a Hub repo id, a served model name).

    Raises:
        ResultsError: a safetensors file is shorter than the header length it declares.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        h.update(b"config.json\n" + config.read_bytes() + b"\n")
    for p in sorted(folder.glob("*.safetensors")):
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ResultsError(f"safetensors file is {size} bytes, too short for a header", path=p)
            (n,) = struct.unpack("<Q", head)
            header = f.read(n)
            if len(header) != n:
                raise ResultsError(f"safetensors header declares {n} bytes but the file holds {size}", path=p)
        h.update(f"{p.name} {size}\n".encode() + header + b"\n")
    return h.hexdigest()
