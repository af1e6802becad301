#!/usr/bin/env python
"""Shared machinery of the benchmarks (``scripts/bench.py``): child processes timed through ``/usr/bin/time``,
page-cache control, the result table and its PASS / MISS marks.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path



REPO = Path(__file__).resolve().parent.parent


PY = sys.executable


SIZES = ("tiny", "small", "full")


RESULTS: list[tuple[str, str, str, bool | None]] = []  # (benchmark, figure, baseline, target met)


def report(bench: str, figure: str, baseline: str, ok: bool | None) -> None:
    """Record one result line (printed immediately and again in the summary)."""
    RESULTS.append((bench, figure, baseline, ok))
    mark = "" if ok is None else ("PASS" if ok else "MISS")
    print(f"  [{mark:4}] {figure}   | baseline: {baseline}", flush=True)


def fmt_b(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


@dataclass
class Run:
    wall: float
    maxrss: int  # bytes, the command's own peak
    rc: int
    out: str
    err: str
    cpu: float = 0.0  # user + system seconds of the command
    sync: float = 0.0  # seconds spent making its output durable (fsync), included in wall


TIME_BIN = "/usr/bin/time"


def run_child(cmd: list[str], *, env: dict | None = None, check: bool = True) -> Run:
    """Run ``cmd``; return its wall seconds, CPU seconds and own peak RSS.

    Peak RSS and CPU come from ``/usr/bin/time`` (GNU time) wrapped around the command: a child forked straight
    from this (large) benchmark process would inherit its high-water RSS mark through exec and report it. Without
    GNU time, a small Python trampoline does the ``os.wait4``.

    Raises:
        RuntimeError: non-zero exit with ``check``.
    """
    stats = tempfile.NamedTemporaryFile(prefix="bench-time-", delete=False)
    stats.close()
    if os.path.exists(TIME_BIN):
        wrapped = [TIME_BIN, "-q", "-f", "%M %U %S", "-o", stats.name, *map(str, cmd)]
    else:
        tramp = ("import os, sys, subprocess; p = subprocess.Popen(sys.argv[2:]); _, st, ru = os.wait4(p.pid, 0); "
                 "open(sys.argv[1], 'w').write(f'{ru.ru_maxrss} {ru.ru_utime} {ru.ru_stime}'); "
                 "sys.exit(os.waitstatus_to_exitcode(st))")
        wrapped = [PY, "-c", tramp, stats.name, *map(str, cmd)]
    out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    t0 = time.perf_counter()
    rc = subprocess.call(wrapped, stdout=out_f, stderr=err_f, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    out_f.seek(0), err_f.seek(0)
    out, err = out_f.read().decode(errors="replace"), err_f.read().decode(errors="replace")
    try:
        fields = Path(stats.name).read_text().split()
        rss_kb, cpu = int(fields[-3]), float(fields[-2]) + float(fields[-1])
    except (ValueError, IndexError):
        rss_kb, cpu = 0, 0.0
    os.unlink(stats.name)
    if check and rc != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {rc}:\n{out[-2000:]}\n{err[-4000:]}")
    return Run(wall, rss_kb * 1024, rc, out, err, cpu)


def best_of(n: int, cmd: list[str], **kw) -> Run:
    """The fastest of ``n`` runs (the peak RSS reported is the largest seen)."""
    runs = [run_child(cmd, **kw) for _ in range(n)]
    best = min(runs, key=lambda r: r.wall)
    best.maxrss = max(r.maxrss for r in runs)
    return best


def dsparkhub_cli(*args: str) -> list[str]:
    return [PY, "-c", "import sys; from dsparkhub.cli import main; sys.exit(main())", *map(str, args)]


def drop_caches_of(paths) -> None:
    """Ask the kernel to forget cached pages of ``paths`` (posix_fadvise DONTNEED), so reads hit the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd) if os.access(p, os.W_OK) else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def compile_bytecode() -> None:
    """Write the ``.pyc`` files of the dsparkhub package the children import, as ``pip install`` does.

    With ``PYTHONDONTWRITEBYTECODE=1`` (or a read-only checkout that never ran) every child would compile the
    package's sources again (~55 ms on the validate path) and the figures would measure the compiler, not the tool.
    """
    import compileall

    spec = subprocess.run([PY, "-c", "import dsparkhub, os; print(os.path.dirname(dsparkhub.__file__))"],
                          capture_output=True, text=True, check=True)
    compileall.compile_dir(spec.stdout.strip(), quiet=1)


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def busy() -> bool:
    """True when other work competes for the cores (1-minute load average above the core count)."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def fast_enough(r: Run, limit: float) -> bool:
    """Wall time under ``limit``; on a machine busy with other work, the command's own CPU time stands in for
    wall time (the wall clock then measures the other jobs; the line printed shows both)."""
    return r.wall < limit or (busy() and r.cpu < limit)


def load_note() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.1f} on {os.cpu_count()} cores"


def sync_files(paths) -> None:
    """fsync each file (what makes written bytes durable; applied equally to baseline and measured run)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def median_run(runs: list[Run]) -> Run:
    """The run with the median wall time (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r.wall)[len(runs) // 2]


EMPTY_CACHE = True


def drop_page_cache() -> bool:
    """Empty the whole page cache (``/proc/sys/vm/drop_caches``, root only) so that every timed run starts from
    the same memory state: with the cache full of other files, the kernel must reclaim pages while a run copies,
    which costs CPU and varied cp's own time by up to 2x here. Returns False (and does nothing) without the
    permission (or at size tiny); the source files are still evicted one by one (:func:`drop_caches_of`)."""
    if not EMPTY_CACHE:
        return False
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def cache_note() -> str:
    if not EMPTY_CACHE:
        return "source evicted from the page cache before each timed run (size tiny leaves the rest of the cache)"
    if os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "page cache emptied before each timed run"
    return "source evicted from the page cache before each timed run (not root: the rest of the cache stays)"


def timed_shell(cmd: list[str], out_dir: Path | None = None, cold: list[Path] = ()) -> Run:
    """Run ``cmd`` with ``cold`` files evicted from the page cache first; fsync what it wrote under ``out_dir``
    (included in the time). Pending writes and deletions of earlier steps are flushed first (``sync``: on a disk
    mounted with ``discard``, deleting the previous run's output otherwise costs the next timed run)."""
    os.sync()
    drop_caches_of(cold)
    drop_page_cache()
    t0 = time.perf_counter()
    r = run_child(cmd)
    t1 = time.perf_counter()
    if out_dir is not None:
        sync_files([p for p in out_dir.rglob("*") if p.is_file()])
    r.wall = time.perf_counter() - t0
    r.sync = time.perf_counter() - t1
    return r


def resident_bytes(path: Path, skip: int) -> int:
    """Bytes of ``path`` beyond offset ``skip`` that sit in the page cache (``mincore``): what anyone read there
    since the file was evicted, by ``read`` or ``mmap`` alike (plus kernel read-ahead)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    if size <= skip:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed", str(path))
        try:
            pages = (size + page - 1) // page
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed", str(path))
            first = skip // page
            return sum(1 for b in vec.raw[first:pages] if b & 1) * page
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def file_state(folder: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_blocks, p.stat().st_ino)
            for p in sorted(folder.iterdir()) if p.is_file()}


def header_end(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def spread(runs: list[Run]) -> str:
    return f"{min(r.wall for r in runs):.2f}-{max(r.wall for r in runs):.2f} s"
