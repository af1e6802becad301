"""Which output paths dsparkhub may write, and which existing ones it may replace: only what it wrote itself.

Owns: :func:`claim_output`, the check every command makes on its output path before any work starts (``convert``,
``convert --attach``, ``detach`` and ``skeleton`` through :func:`dsparkhub.io.output.atomic_output` and before
planning; ``verify --out`` and ``calibrate --out`` for their files), and :func:`not_ours`, the one answer to "is this
ours to replace". A folder is ours when it holds one of dsparkhub's marker files (:data:`MARKERS`) and nothing
dsparkhub would not have written there (:data:`OWN_FILES`, a card ``README.md``, results files, and the files a
marker lists, such as the target files ``convert --attach`` linked); a file is ours when it is of the kind about to
be written (a results file: its ``schema`` key; an STS sidecar: its ``temperatures``). Everything else is refused,
with ``--overwrite`` too, in one paragraph naming the path, what was expected and what was found.

Does not: read formats beyond those marker names and keys (a leaf of ``io/``, below ``convert``, ``card`` and
``verify``, whose constants ``tests/test_output_safety.py`` checks against these), or write anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from pathlib import Path, PurePosixPath

from dsparkhub.errors import OutputExistsError, OutputNotWritableError

#: marker file -> the command that writes it at the top of its output folder
MARKERS = {
    "dsparkhub_provenance.json": "convert",  # dsparkhub.convert.PROVENANCE_FILE
    "dsparkhub_attach.json": "convert --attach",  # dsparkhub.io.attach_record.ATTACH_RECORD
    "dsparkhub_attach_subfolder.json": "convert --attach-as dspark-subfolder",  # dsparkhub.attach_subfolder
    "dsparkhub_skeleton.json": "skeleton",  # dsparkhub.skeleton.MARKER
    "dsparkhub_detach.json": "detach",  # dsparkhub.attach.DETACH_RECORD
}
#: what dsparkhub writes into a drafter folder over a release's life (convert, validate --save, calibrate, card), as
#: ``(folder, file name pattern)``; ``dspark/`` holds the same (``convert --attach-as dspark-subfolder``)
OWN_FILES = (("", "config.json"), ("", "model.safetensors.index.json"), ("", "*.safetensors"),
             ("", "validation.json"), ("", "dspark_sts.json"), ("", "dspark_sps_table.json"), ("", "mask_embedding.pt"),
             ("", "dsparkhub_*.json"),
             ("assets", "*.png"))
#: the last line of a README.md that ``dsparkhub card`` wrote (dsparkhub.card.CARD_MARKER)
CARD_MARKER = "<!-- written by `dsparkhub card`: running it again replaces this file -->"
#: the ``schema`` of a results file ``dsparkhub verify`` wrote starts with this (dsparkhub.verify.results.schema)
RESULTS_SCHEMA_PREFIX = "dsparkhub.verify.results/"
#: a drafter's or target's own files, which no file output (results, sidecar) may be named like
CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.index.json", "validation.json",
                    "dsparkhub_*.json", "README.md", "tokenizer*", "special_tokens_map.json", "*.bin", "*.pt", "*.pth",
                    "*.py")
#: the file kinds :func:`claim_output` knows, with the words its messages use
FILE_KINDS = {"results": "a results file of `dsparkhub verify` (a JSON object whose schema is "
                         f"{RESULTS_SCHEMA_PREFIX}N)",
              "sidecar": "an STS calibration sidecar (a JSON object with `temperatures`)",
              "sps_table": "an SGLang SPS cost table of `dsparkhub schedule` (a JSON object with "
                           "`sample_steps_per_sec`)",
              "schedule": "a `dsparkhub schedule` report (a JSON object with `policies`)"}
_EXAMPLE_NAMES = {"results": "results.json", "sidecar": "dspark_sts.json", "sps_table": "dspark_sps_table.json",
                  "schedule": "schedule.json"}
#: the JSON key that marks a file of each kind as dsparkhub's (results: the ``schema`` prefix, checked apart)
_KIND_KEYS = {"sidecar": "temperatures", "sps_table": "sample_steps_per_sec", "schedule": "policies"}
_SHOWN = 4
_MAX_JSON_BYTES = 64 << 20


def claim_output(out: str | Path, *, overwrite: bool = False, kind: str = "folder") -> None:
    """Check that ``out`` can be written, and replaced if it exists, before any work starts.

    Args:
        out: the output path (OUT).
        overwrite: whether the user asked to replace an existing ``out`` (``--overwrite``).
        kind: ``"folder"`` (an output folder) or a key of :data:`FILE_KINDS` (a file output).

    Raises:
        OutputNotWritableError: ``out`` is, or contains, the current folder; lies under a file; is named like a
            checkpoint's own file (file kinds: :data:`CHECKPOINT_FILES`); or its folder does not take new entries
            (read-only, no permission).
        OutputExistsError: ``out`` exists and ``overwrite`` is False, is of the other kind (a file for a folder, a
            folder for a file), or is not dsparkhub's to replace (:func:`not_ours`).
    """
    out = Path(out)
    what = f"OUT {out}" if kind == "folder" else f"--out {out}"
    real, cwd = Path(os.path.realpath(out)), Path(os.getcwd())
    if kind == "folder" and (real == cwd or real in cwd.parents):
        raise OutputNotWritableError(
            f"OUT {str(out)!r} is {'the current folder' if real == cwd else f'a folder above the current one ({cwd})'}"
            "; dsparkhub writes OUT whole in a temporary folder next to it and renames it into place, which the "
            "folder you are in cannot be", path=out, hint="give OUT a new folder's name, e.g. --out ./drafter")
    if kind != "folder":
        if kind not in FILE_KINDS:
            raise ValueError(f"unknown output kind {kind!r}")
        hit = next((p for p in CHECKPOINT_FILES if fnmatch.fnmatch(out.name, p)), None)
        if hit is not None:
            raise OutputNotWritableError(
                f"{what} is named like a checkpoint's own file ({hit}); this command writes {FILE_KINDS[kind]}, "
                "and never over or beside a drafter's config, weights or index under their names", path=out,
                hint=f"choose another name, e.g. --out {out.with_name(_EXAMPLE_NAMES[kind])}")
    folder = out.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputNotWritableError(f"{what} lies under {folder}, which is a file, not a folder; expected {folder} "
                                     "to be a folder (or not to exist)", path=out,
                                     hint="choose an OUT whose parents are folders")
    if out.exists() or out.is_symlink():
        wrong = _wrong_kind(out, kind)
        if wrong:
            raise OutputExistsError(f"{what} exists and {wrong}", path=out,
                                    hint="choose another --out, or move that path away yourself")
        if not overwrite:
            only = "a folder dsparkhub wrote, holding nothing else," if kind == "folder" else \
                "a file of the same kind that dsparkhub wrote"
            raise OutputExistsError(f"{what} already exists: {_describe(out)}", path=out,
                                    hint=f"choose another --out, or pass --overwrite to replace it (only {only} is "
                                         "replaced)")
        why = not_ours(out, kind)
        if why:
            raise OutputExistsError(f"{what} exists and is not dsparkhub's to replace, even with --overwrite: {why}",
                                    path=out, hint="choose another --out (a new name), or move the folder or the "
                                                   "files named away yourself")
    try:  # a probe in the folder that will hold OUT's temporary twin: refused before a run of minutes
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name or 'out'}.probe-", dir=folder))
    except OSError as exc:
        raise not_writable(out, folder, exc) from None


def not_writable(out: Path, folder: Path, exc: OSError) -> OutputNotWritableError:
    """The one paragraph for an OS error creating OUT or its temporary twin in ``folder`` (never names the
    temporary folder, which the user never asked for)."""
    return OutputNotWritableError(f"cannot write {out}: {folder} does not take new files or folders "
                                  f"({exc.strerror or exc}); dsparkhub writes OUT in a temporary folder next to it, "
                                  "then renames it into place", path=out,
                                  hint="choose an OUT in a folder you can write to (not read-only, with permission)")


def is_results(data) -> bool:
    """Whether a parsed JSON value is a results file of ``dsparkhub verify`` (an object whose ``schema`` starts with
    :data:`RESULTS_SCHEMA_PREFIX`); read here, in ``dsparkhub.hub.trust`` and nowhere else without pydantic."""
    return isinstance(data, dict) and str(data.get("schema", "")).startswith(RESULTS_SCHEMA_PREFIX)


def not_ours(path: str | Path, kind: str = "folder") -> str | None:
    """Why ``path`` is not dsparkhub's to replace, or None when it is (see the module docstring).

    Args:
        path: an existing path (a symlink is judged by what it leads to; the link itself is what gets replaced).
        kind: ``"folder"`` or a key of :data:`FILE_KINDS`.

    Returns:
        None, or a sentence naming what was expected and what was found (a few entries and their count).
    """
    path = Path(path)
    wrong = _wrong_kind(path, kind)
    if wrong:
        return wrong
    if kind != "folder":
        data = _json(path)
        ok = is_results(data) if kind == "results" else (isinstance(data, dict)
                                                         and isinstance(data.get(_KIND_KEYS[kind]), list))
        return None if ok else f"expected {FILE_KINDS[kind]}, found {_describe(path)} that is not one"
    markers = [m for m in MARKERS if (path / m).is_file()]
    if not markers:
        return (f"expected a folder dsparkhub wrote (it would hold {next(iter(MARKERS))} or another of its "
                f"dsparkhub_*.json markers), found {_describe(path)} without one")
    listed = _listed(path, markers)
    foreign = [rel for rel in _files(path) if rel not in listed and not _own(path, rel)]
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (", ..." if len(foreign) > _SHOWN else "")
        return (f"dsparkhub wrote it ({', '.join(MARKERS[m] for m in markers)}) but it also holds "
                f"{len(foreign)} file(s) dsparkhub did not write ({shown}), which replacing it would delete")
    return None


def _wrong_kind(path: Path, kind: str) -> str | None:
    """Why an existing ``path`` cannot be an output of ``kind`` at all (a file where a folder goes, or the reverse)."""
    if kind == "folder" and not path.is_dir():
        return f"is not a folder (found {_describe(path)}); OUT is an output folder, and only one dsparkhub wrote is " \
               "ever replaced"
    if kind != "folder" and not path.is_file():
        return f"is not a file (found {_describe(path)}); expected {FILE_KINDS[kind]}"
    return None


def _files(folder: Path) -> list[str]:
    """Every file and link under ``folder`` as a relative POSIX path, sorted; links are not followed."""
    found = []
    for root, dirs, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for d in list(dirs):
            if (Path(root) / d).is_symlink():
                dirs.remove(d)
                names.append(d)
        found += [(rel / n).as_posix() for n in names]
    return sorted(found)


def _own(folder: Path, rel: str) -> bool:
    """A file dsparkhub writes in a drafter folder (:data:`OWN_FILES`, a card README.md, a results file)."""
    p = PurePosixPath(rel)
    if p.parts[0].startswith(".dsparkhub-card-"):  # what a killed `dsparkhub card` left of its staging folder
        return True
    parent = "" if p.parent == PurePosixPath(".") else p.parent.as_posix()
    if parent.split("/")[0] == "dspark":  # the dspark-subfolder form: a converted drafter inside a target copy
        parent = parent.removeprefix("dspark").removeprefix("/")
    if any(parent == d and fnmatch.fnmatch(p.name, pat) for d, pat in OWN_FILES):
        return True
    full = folder / rel
    if rel == "README.md" and full.is_file():
        with open(full, "rb") as f:
            f.seek(max(0, full.stat().st_size - 4096))
            return CARD_MARKER.encode() in f.read()
    if parent == "" and p.suffix == ".json":
        return is_results(_json(full))
    return False


def _listed(folder: Path, markers: list[str]) -> set[str]:
    """The files the markers list as written or linked by dsparkhub: the target files ``convert --attach`` linked
    (``target.files``, ``added.files``) and a marker's own ``files``."""
    listed: set[str] = set()
    for m in markers:
        rec = _json(folder / m)
        if not isinstance(rec, dict):
            continue
        for files in (rec.get("files"), (rec.get("target") or {}).get("files") if isinstance(rec.get("target"), dict)
                      else None, (rec.get("added") or {}).get("files") if isinstance(rec.get("added"), dict) else None):
            if isinstance(files, (dict, list)):
                listed.update(f for f in files if isinstance(f, str))
    return listed


def _json(path: Path):
    try:
        if not path.is_file() or path.stat().st_size > _MAX_JSON_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _describe(path: Path) -> str:
    """``a folder of 3 entries (notes.txt, projects/, x.bin)`` / ``a file of 120 bytes`` / ``a link to X``."""
    if path.is_symlink() and not path.exists():
        return f"a broken link to {os.readlink(path)}"
    if path.is_dir():
        try:
            names = sorted(e.name + ("/" if e.is_dir() else "") for e in os.scandir(path))
        except OSError as exc:
            return f"a folder that cannot be listed ({exc.strerror})"
        shown = ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
        what = f"a folder of {len(names)} entr{'y' if len(names) == 1 else 'ies'}" + (f" ({shown})" if names else "")
    elif path.is_file():
        what = f"a file of {path.stat().st_size} bytes"
    else:
        what = "something that is neither a file nor a folder"
    return f"{what}, through a link to {os.readlink(path)}" if path.is_symlink() else what
