"""DeepSpec run folders: the one resolver from a run folder (``step_<N>`` folders + ``step_latest``) to the step
folder to read, and the ``--allow-pickle`` entry point that follows it.

Upstream convention: DeepSpec ``deepspec/utils/io.py`` ``safe_symlink`` and ``ckpt_manager.save_checkpoint``.
"""

from __future__ import annotations

import os
from pathlib import Path

from dsparkhub.errors import CheckpointNotFoundError
from dsparkhub.io.pickle_weights import pickle_as_safetensors, pickle_weight_files


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


def resolve_pickle(path: str | Path) -> Path:
    """``path``, or a safetensors copy of it (:func:`pickle_as_safetensors`) when its only weights are pickle files.

    Follows ``step_latest`` like every reader. Used by the CLI's ``--allow-pickle``.
    """
    folder = resolve_step_dir(path)
    if folder.is_dir() and not any(p.suffix == ".safetensors" for p in folder.iterdir()) \
            and pickle_weight_files(folder):
        return pickle_as_safetensors(folder)
    return Path(path)
