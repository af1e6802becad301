"""Which files a push sends and which remote files it deletes (``hf upload`` rules plus dsparkhub's own).

Sent: every regular file of the drafter folder, filtered by ``--include`` / ``--exclude`` (fnmatch,
``huggingface_hub.utils.filter_repo_objects``). Never sent: caches and VCS litter (:data:`SKIP_PARTS`), leftovers
(``*.tmp`` / ``*.lock`` / ``*.partial``), dotfiles (may hold secrets), pickles (a release ships safetensors) and
training state (optimizer, RNG, ...). Deleted on the Hub: remote files the folder lacks that match ``--delete``
(``.gitattributes`` never, ``README.md`` only when named exactly).

No network: the remote side is given as ``{path: RepoFile}`` read by :mod:`dsparkhub.hub.remote`.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import unquote

from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import filter_repo_objects

from dsparkhub.errors import CheckpointNotFoundError, DsparkhubError
from dsparkhub.io.safety import PICKLE_SUFFIXES, TRAINING_STATE_PREFIXES

#: remote files a push never deletes even when the local folder lacks them (the Hub creates it with the repo).
NEVER_DELETE = frozenset({".gitattributes"})
README = "README.md"
#: local path components that are never pushed (caches, VCS, editor and OS litter).
SKIP_PARTS = frozenset({".git", ".cache", ".huggingface", "__pycache__", ".ipynb_checkpoints", ".DS_Store"})


def local_files(draft_dir: str | Path, left_out: dict[str, str] | None = None) -> dict[str, Path]:
    """The files a push would upload: every regular file under ``draft_dir``, by POSIX path relative to it.

    Skipped silently: :data:`SKIP_PARTS` anywhere in the path, ``*.tmp`` / ``*.lock`` / ``*.partial`` leftovers.
    Left out and recorded in ``left_out`` (``{path: why}``): dotfiles and dot-folders (``.env`` ...; ``.gitattributes``
    excepted), pickle files (``.bin`` / ``.pt`` / ``.pth`` / ``.pkl`` / ``.ckpt``: a release ships safetensors, and a
    pickle runs code when loaded) and training state (``training_state*``, ``optimizer*``, ...).

    Raises:
        CheckpointNotFoundError: ``draft_dir`` is not a folder.
        DsparkhubError: a file is a link that resolves outside ``draft_dir``.
    """
    root = Path(draft_dir)
    if not root.is_dir():
        raise CheckpointNotFoundError("drafter folder to push does not exist or is not a folder", path=root)
    real_root = root.resolve()
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_PARTS for part in rel.parts) or path.name.endswith((".tmp", ".lock", ".partial")):
            continue
        if not path.is_file():
            continue
        why = _left_out_reason(rel)
        if why:
            if left_out is not None:
                left_out[rel.as_posix()] = why
            continue
        real = path.resolve()
        if real_root not in real.parents:
            raise DsparkhubError(f"{rel.as_posix()} is a link that resolves outside the folder (to {real})",
                                 path=root, hint="copy the file into the folder instead of linking it")
        out[rel.as_posix()] = path
    return out


def _left_out_reason(rel: Path) -> str | None:
    if any(part.startswith(".") for part in rel.parts) and rel.as_posix() != ".gitattributes":
        return "dotfile: may hold local settings or secrets"
    if rel.name.startswith(TRAINING_STATE_PREFIXES):
        return "training state"
    if rel.suffix.lower() in PICKLE_SUFFIXES:
        return "pickle file: a release ships safetensors"
    return None


def select_files(files: dict[str, Path], include: list[str] | None, exclude: list[str] | None,
                 draft_dir: Path) -> dict[str, Path]:
    """``files`` filtered as ``hf upload --include / --exclude`` does (fnmatch over the POSIX paths).

    Raises:
        CheckpointNotFoundError: no file is left.
    """
    if not (include or exclude):
        return files
    chosen = set(filter_repo_objects(list(files), allow_patterns=include or None, ignore_patterns=exclude or None))
    files = {p: f for p, f in files.items() if p in chosen}
    if not files:
        raise CheckpointNotFoundError(f"no file of the folder matches --include {include or []} / --exclude "
                                      f"{exclude or []}: nothing to push", path=draft_dir)
    return files


def deletions(files: dict[str, Path], remote: dict[str, RepoFile], patterns: list[str] | None,
              left_out: set[str]) -> set[str]:
    """Remote paths a push deletes, as ``hf upload --delete PATTERN`` does (huggingface_hub
    ``_prepare_folder_deletions``: fnmatch over repo paths, ``*`` crossing ``/``; ``.gitattributes`` never): remote
    files the folder lacks that match a pattern. Files the folder holds but left out (a pickle, a dotfile) are never
    deleted on their account, and ``README.md`` only when a pattern is exactly ``README.md``: a card on the Hub may
    be written by hand."""
    if not patterns:
        return set()
    gone = [p for p in remote if p not in files and p not in left_out and p not in NEVER_DELETE]
    hits = set(filter_repo_objects(gone, allow_patterns=list(patterns)))
    if README in hits and README not in patterns:
        hits.discard(README)
    return hits


#: a Markdown image ``![alt](path "title")`` or an HTML ``<img src="path">``: the path group
_IMAGE_LINK = re.compile(r"""!\[[^\]]*\]\(\s*<?([^)\s>]+)|<img\b[^>]*?\bsrc\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def missing_image_links(readme_text: str, present: set[str] | frozenset[str]) -> list[str]:
    """The images a card links by relative path that are not among ``present`` (the folder's POSIX paths), in
    order of appearance: the Hub would show them broken. URLs (``https:``, ``data:`` ...) are not checked; a
    ``./`` prefix, ``?query`` / ``#fragment`` and %-escapes are resolved first."""
    missing = []
    for m in _IMAGE_LINK.finditer(readme_text):
        link = m.group(1) or m.group(2)
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", link):
            continue
        path = posixpath.normpath(unquote(re.split(r"[?#]", link, maxsplit=1)[0]))
        if path not in present and link not in missing:
            missing.append(link)
    return missing
