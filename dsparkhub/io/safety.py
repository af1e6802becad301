"""File-safety policy of the checkpoint readers: which paths and files they refuse to touch.

Owns: refusing devices / FIFOs / sockets (:func:`refuse_special`), shard names that leave the checkpoint folder
(:func:`safe_member`: absolute paths, ``..``, NUL, over-long names, links resolving outside, except a Hugging Face
cache snapshot's links into its blob store and the links an attach record names), the file names that are pickle
weights or training state (never loaded, never copied), and the bounded repr used to quote hostile values.

Raises :class:`~dsparkhub.errors.UnsafeCheckpointError` / :class:`~dsparkhub.errors.CheckpointFormatError`.
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path

from dsparkhub.errors import CheckpointFormatError, UnsafeCheckpointError
from dsparkhub.io.attach_record import recorded_attach_link

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: pickle files that are training state, not weights; they are ignored (never loaded, never copied).
TRAINING_STATE_PREFIXES = ("training_state", "optimizer", "scheduler", "rng_state", "training_args")
#: bounded repr for values quoted from hostile files (depth, length and width capped; never recurses deeply).
SHOW = reprlib.Repr()
SHOW.maxlevel, SHOW.maxlist, SHOW.maxdict, SHOW.maxstring, SHOW.maxother = 3, 8, 8, 80, 80


def refuse_special(path: Path) -> None:
    """Refuse devices, FIFOs and sockets: reading ``/dev/zero`` never ends and opening a FIFO blocks forever."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # missing / unreadable: the caller's open() reports it
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise CheckpointFormatError("not a regular file (a device, FIFO or socket); refusing to read it", path=path)


def safe_member(folder: Path, rel: str, what: str) -> Path:
    """Resolve ``rel`` (a shard name from an index or a folder listing; ``what`` names its source in messages) inside
    ``folder``, refusing absolute paths, ``..`` and symlinks that leave the folder.

    Returns:
        ``folder / rel`` (not resolved: the caller opens it).

    Raises:
        UnsafeCheckpointError: not a plain relative name (absolute, ``..``, backslash, NUL, over 1024 characters or a
            part over 255), unresolvable (link loop), or a link leading outside ``folder`` other than a Hugging Face
            cache blob or a link the folder's attach record names.
    """
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts or "\\" in rel \
            or "\x00" in rel or len(rel) > 1024 or any(len(part) > 255 for part in Path(rel).parts):
        raise UnsafeCheckpointError(f"{what} names {SHOW.repr(rel)}, which is not a plain file name inside the "
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
            and not recorded_attach_link(root, rel, real):
        raise UnsafeCheckpointError(f"{what} {rel!r} is a link that resolves outside the checkpoint folder "
                                    f"(to {real})", path=folder)
    return path


def _hf_cache_blob(root: Path, real: Path) -> bool:
    """A Hugging Face cache snapshot's link into its own blob store: ``models--ns--name/snapshots/<rev>/f`` ->
    ``models--ns--name/blobs/<hash>`` (huggingface_hub's cache layout)."""
    return (root.parent.name == "snapshots" and real.parent == root.parent.parent / "blobs"
            and root.parent.parent.name.startswith(("models--", "datasets--")))
