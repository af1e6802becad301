"""The output folder's life cycle: written in a temporary folder next to OUT, flushed to disk and renamed into place
only when complete.

Owns: :func:`claim_output`, the one decision every command makes about an output path before any work (is it
writable, and may an existing one be replaced: only what dsparkhub itself wrote, see :func:`not_ours`);
:func:`atomic_output` (claims OUT; a concurrent writer of the same OUT fails cleanly; leftovers of dead runs on this
host removed), :func:`refuse_overlap` (OUT may not be or contain a folder being read), durable writes
(:func:`background_flush`, :func:`write_json`) and the crash-safety test hook :func:`kill_point` that every write
step calls.

Does not: know the commands' formats beyond the few names and keys that mark dsparkhub's own files (this module is a
leaf below ``convert``, ``card`` and ``verify``; ``tests/test_output_safety.py`` checks the names against theirs).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from dsparkhub.errors import OutputExistsError
from dsparkhub.io.ownership import claim_output, not_ours, not_writable

_KILL_COUNT = 0


def kill_point(label: str) -> None:
    """Crash-safety test hook (a no-op unless ``DSPARKHUB_TEST_KILL_AT`` is set).

    Every write step (a shard's header, each tensor, each JSON file, each rename of the output folder) calls this.
    With ``DSPARKHUB_TEST_KILL_AT=n`` the process sends itself SIGKILL at the n-th call, so a test can prove that
    OUT is absent or complete after a crash at *every* point (``tests/test_crash_safety.py``). With
    ``DSPARKHUB_TEST_KILL_LOG=FILE`` each call appends its label to FILE (to count the points of a run).
    """
    at, log = os.environ.get("DSPARKHUB_TEST_KILL_AT"), os.environ.get("DSPARKHUB_TEST_KILL_LOG")
    if not at and not log:
        return
    global _KILL_COUNT
    _KILL_COUNT += 1
    if log:
        with open(log, "a") as f:
            f.write(f"{_KILL_COUNT} {label}\n")
    if at and _KILL_COUNT == int(at):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def atomic_output(out: str | Path, *, overwrite: bool = False):
    """Yield a temporary folder that becomes ``out`` only if the block finishes without an exception.

    The temporary folder ``.<name>.tmp-<host>-<pid>-<random>`` lies next to ``out`` (same filesystem, so the final
    rename is atomic). On any exception it is removed and ``out`` is untouched. ``out`` is first claimed with
    :func:`~dsparkhub.io.ownership.claim_output`: with ``overwrite``, an existing ``out`` is replaced only when
    dsparkhub wrote it and it holds nothing else (checked again before it is moved aside, then deleted). A run killed
    outright (SIGKILL, power cut) cannot clean up; the next run for the same ``out`` on the same host removes the
    temporary folders whose process no longer exists.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False (checked before and after the work), is not
            dsparkhub's to replace, or another run created ``out`` meanwhile.
        OutputNotWritableError: ``out`` is or holds the current folder, lies under a file, or its folder does not
            take new folders.
    """
    out = Path(out)
    claim_output(out, overwrite=overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temps(out)
        tmp = out.parent / f".{out.name}.tmp-{_host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
    except OSError as exc:
        raise not_writable(out, out.parent, exc) from None
    try:
        try:
            yield tmp
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # full disk / quota / file-size limit
                raise OSError(exc.errno, f"{exc.strerror} while writing the output; nothing was written to OUT (the "
                              "partial temporary folder is removed): free some space or write OUT on another disk",
                              str(out)) from None
            raise
        _fsync_tree(tmp)
        kill_point(f"before moving {tmp.name} into place")
        old = None
        if out.exists():
            if not overwrite:
                raise OutputExistsError("output folder appeared while this run was writing (another run?)",
                                        path=out)
            why = not_ours(out)  # files put into OUT while this run wrote are not ours to delete either
            if why:
                raise OutputExistsError(f"OUT changed while this run was writing and is no longer dsparkhub's to "
                                        f"replace: {why}", path=out, hint="move those files away, then run again")
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(out, old)
            kill_point(f"moved the old {out.name} aside")
        try:
            os.rename(tmp, out)
        except OSError as exc:
            if old is not None:
                os.rename(old, out)
            raise OutputExistsError(f"could not move the finished output into place: {exc.strerror}",
                                    path=out) from None
        _fsync(out.parent, os.O_DIRECTORY)
        kill_point(f"moved {tmp.name} to {out.name}")
        if old is not None:
            if old.is_symlink() or not old.is_dir():  # rmtree refuses links (and files): unlink, never follow
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            _remove_shielded(tmp)


def _remove_shielded(folder: Path) -> None:
    """Remove a temporary folder even if another Ctrl-C arrives meanwhile (``timeout`` and shells often deliver
    SIGINT twice); the first interrupt still propagates once the folder is gone."""
    while True:
        try:
            shutil.rmtree(folder, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


def refuse_overlap(out: str | Path, reads: dict[str, str | Path | None]) -> None:
    """Refuse an OUT that is, contains or lies inside a folder the run reads (the drafter, the target): with
    ``--overwrite`` the old OUT is deleted, and a write inside a source folder modifies it. Paths are compared
    after resolving symlinks; ``None`` entries (a Hub target) are skipped.

    Args:
        out: the output folder.
        reads: ``{what it is: folder}``, e.g. ``{"drafter": src, "target": target_dir}``.

    Raises:
        OutputExistsError: naming both paths and how they overlap.
    """
    o = Path(os.path.realpath(out))
    for label, folder in reads.items():
        if folder is None:
            continue
        q = Path(os.path.realpath(folder))
        if o == q:
            how = "is"
        elif o in q.parents:
            how = "contains"
        elif q in o.parents:
            how = "lies inside"
        else:
            continue
        raise OutputExistsError(f"OUT {out} {how} the {label} folder {folder}; writing there would delete or change "
                                f"the {label} (sources are never modified)", path=out,
                                hint="choose an OUT outside the folders this command reads")


def _host_tag() -> str:
    return "".join(c for c in socket.gethostname() if c.isalnum())[:32] or "host"


def _remove_dead_temps(out: Path) -> None:
    """Remove ``.<out>.tmp-<this host>-<pid>-*`` folders left by killed runs (their pid no longer exists).
    Folders of live processes, of other hosts (a shared filesystem) or named otherwise are left alone."""
    prefix = f".{out.name}.tmp-{_host_tag()}-"
    for p in out.parent.glob(f"{glob.escape(prefix)}*"):
        pid = p.name[len(prefix):].partition("-")[0]
        if not pid.isdigit() or p.is_symlink() or not p.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:  # alive, owned by someone else
            pass


def _fsync(path: Path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def background_flush():
    """Yield ``flush(path)``, which fsyncs ``path`` on a background thread while the caller writes the next file;
    leaving the block waits for every flush (and raises the first error)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = []
        yield lambda path: pending.append(pool.submit(_fsync, Path(path)))
        for f in pending:
            f.result()


def _fsync_tree(folder: Path) -> None:
    """Flush every file written under ``folder`` and the folders themselves, so that the rename into place never
    publishes a folder whose data a power cut could still lose. Hard links (``st_nlink > 1``: an attached target's
    own shards) and symlinks are not ours to flush. Shards are normally flushed already by
    :func:`background_flush`; flushing a clean file costs nothing."""
    for root, _, names in os.walk(folder):
        for name in names:
            p = Path(root) / name
            st = p.lstat()
            if not p.is_symlink() and st.st_nlink == 1:
                _fsync(p)
        _fsync(Path(root), os.O_DIRECTORY)


def write_json(path: str | Path, data: dict, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON with a trailing newline (indented, config.json style, unless ``indent`` is None).

    ``indent=None`` is for large files such as the index of a 160 GB target (~70k entries): Python's C encoder only
    runs without indentation, and is ~10x faster.
    """
    Path(path).write_text(json.dumps(data, indent=indent, sort_keys=False) + "\n")
    kill_point(f"wrote {Path(path).name}")


def umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, which races with other threads); 0o022
    where ``/proc/self/status`` does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def replace_text(path: str | Path, text: str, *, fsync: bool = False) -> Path:
    """Write a small text file atomically: a temporary file beside ``path``, then ``os.replace`` (a reader sees the
    old file or the new one, never a part), with the mode any written file gets (0666 less the umask; ``mkstemp``
    alone makes 0600). ``fsync`` flushes the data to disk before the rename. Used for dsparkhub's small JSON files
    (results, ``validation.json``, the STS sidecar, the SPS table); whether ``path`` may be written at all is
    :func:`dsparkhub.io.ownership.claim_output`'s call, made before.

    Raises:
        OSError: the folder cannot be written (the temporary file is removed).
    """
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_json(path: str | Path, data: dict, *, indent: int = 1) -> Path:
    """:func:`replace_text` of ``data`` as JSON with a trailing newline. NaN / Inf are refused (``allow_nan=False``:
    SGLang's and other strict readers refuse them). Used for the sidecars next to a drafter (``dspark_sts.json``,
    ``dspark_sps_table.json``).

    Raises:
        ValueError: ``data`` holds NaN / Inf (nothing is written).
        OSError: the folder cannot be written (the temporary file is removed).
    """
    return replace_text(path, json.dumps(data, indent=indent, allow_nan=False) + "\n")
