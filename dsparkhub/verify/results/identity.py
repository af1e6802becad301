"""The identity of a local target recorded in a results file (``target.fingerprint``)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from dsparkhub.errors import ResultsError


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
