"""DeepSpec run folders: the one resolver from a run folder (``step_<N>`` folders + ``step_latest``) to the step
folder to read, and the ``--allow-pickle`` entry point that follows it.

Upstream convention: DeepSpec ``deepspec/utils/io.py`` ``safe_symlink`` and ``ckpt_manager.save_checkpoint``.
"""

from __future__ import annotations

import os
import re
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


#: the ``train_config.py`` keys a card shows, per top-level dict (DeepSpec's ``model`` / ``train`` / ``data`` dicts;
#: the embedded example's spelling ``steps`` / ``batch_size`` too); anything else stays in the training folder
TRAINING_KEYS = {"": ("project_name", "exp_name", "seed"),
                 "train": ("lr", "max_train_steps", "steps", "num_train_epochs", "global_batch_size", "batch_size",
                           "warmup_ratio", "warmup", "weight_decay", "precision", "num_anchors", "loss_decay_gamma",
                           "ce_loss_alpha", "l1_loss_alpha", "confidence_head_alpha"),
                 "data": ("chat_template", "max_length"),
                 "model": ("num_anchors", "loss_decay_gamma", "ce_loss_alpha", "l1_loss_alpha",
                           "confidence_head_alpha")}


def training_facts(step_dir: str | Path) -> dict | None:
    """The few training facts a card shows, read from a DeepSpec step folder: the step (``step_<N>``) and the
    literal values of :data:`TRAINING_KEYS` in its ``train_config.py``, parsed with :mod:`ast` and never executed
    (a value that is not a literal, e.g. ``trainer_cls``, is skipped; so is a file that does not parse).

    Returns:
        ``{"step": int | None, "config": {"train.lr": 0.0006, ...}}`` (keys ``dict.key``, top-level names bare), or
        None when the folder is no ``step_<N>`` folder and has no ``train_config.py``.
    """
    import ast

    step_dir = Path(step_dir)
    step = int(step_dir.name[5:]) if re.fullmatch(r"step_\d+", step_dir.name) else None
    path = step_dir / "train_config.py"
    config: dict = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (SyntaxError, ValueError, UnicodeDecodeError):
        tree = None
    for node in tree.body if tree is not None else []:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if name in TRAINING_KEYS[""]:
            _literal(config, name, value)
        elif name in TRAINING_KEYS:
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
                pairs = [(k.arg, k.value) for k in value.keywords if k.arg]
            elif isinstance(value, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)]
            else:
                continue
            for key, v in pairs:
                if key in TRAINING_KEYS[name]:
                    _literal(config, f"{name}.{key}", v)
    if step is None and not config:
        return None
    return {"step": step, "config": config}


def _literal(out: dict, key: str, node) -> None:
    """``out[key] = `` the literal ``node`` holds (numbers, strings, booleans, None); anything else is skipped."""
    import ast

    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return
    if value is None or isinstance(value, (bool, int, float, str)):
        out[key] = value
