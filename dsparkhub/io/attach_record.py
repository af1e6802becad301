"""The record ``dsparkhub attach --symlink`` leaves in its output, as the checkpoint readers check it.

Owns: the record's file name (:data:`ATTACH_RECORD`), the identity of a linked target file (:func:`file_identity`:
device, inode, size) and the one question a reader asks of the record: does this link out of the checkpoint lead
to the very target file attach linked (:func:`recorded_attach_link`)? ``dsparkhub.attach`` writes the record; the
path check of ``dsparkhub.io.safety`` reads it. It lives in ``io/`` (a leaf module: stdlib only) because the
readers below ``attach`` in the package's flow need it.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

#: the record ``dsparkhub attach`` writes into an attached checkpoint (``dsparkhub.attach``)
ATTACH_RECORD = "dsparkhub_attach.json"


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


def recorded_attach_link(root: Path, rel: str, real: Path) -> bool:
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
