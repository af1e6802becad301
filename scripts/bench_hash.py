#!/usr/bin/env python
"""Figure ``hash``: ``dsparkhub.io.hashing`` against ``sha256sum`` of the same files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench_common import PY, busy, fmt_b, load_note, report, run_child
from bench_fixtures import make_qwen3_pair


def bench_hash(work: Path, size: str) -> None:
    """dsparkhub.io.hashing.sha256_files vs ``sha256sum`` on the same files (page cache warm for both)."""
    _, draft = make_qwen3_pair(work, size)
    n = {"tiny": 2, "small": 4, "full": 4}[size]
    files = []
    big = draft / "model.safetensors"
    per = big.stat().st_size // n
    for k in range(n):  # several files of one size: the case where both cores must work
        f = work / f"hash-{size}-{k}.bin"
        if not f.exists() or f.stat().st_size != per:
            with open(big, "rb") as src, open(f, "wb") as dst:
                src.seek(k * per)
                dst.write(src.read(per))
        files.append(f)
    total = per * n
    for f in files:  # warm: both runs read from the page cache
        subprocess.run(["cat", str(f)], stdout=subprocess.DEVNULL, check=True)
    print(f"\n== hashing: {n} files x {fmt_b(per)} ({load_note()})")
    # the child records the CPU time each worker thread spent (sha256_file is looked up at call time)
    code = ("import sys, time, threading; import dsparkhub.io.hashing as H; per = {}; one = H.sha256_file\n"
            "def timed(p):\n    c = time.thread_time(); r = one(p); k = threading.get_ident()\n"
            "    per[k] = per.get(k, 0) + time.thread_time() - c; return r\n"
            "H.sha256_file = timed; t = time.perf_counter(); h = H.sha256_files(sys.argv[1:]); "
            "print(time.perf_counter() - t); print(*h.values()); print(*per.values())")
    best_ss = best_py = best_one = None
    for _ in range(1 if size == "tiny" else 3):
        ss = run_child(["sha256sum", *map(str, files)])
        py = run_child([PY, "-c", code, *map(str, files)])
        single = code.replace("H.sha256_files(sys.argv[1:])", "H.sha256_files(sys.argv[1:], workers=1)")
        one = run_child([PY, "-c", single, *map(str, files)])
        best_ss = ss if best_ss is None or ss.wall < best_ss.wall else best_ss
        best_py = py if best_py is None or py.wall < best_py.wall else best_py
        best_one = one if best_one is None or one.wall < best_one.wall else best_one
    ours = best_py.out.split("\n")[1].split()
    theirs = [line.split()[0] for line in best_ss.out.strip().splitlines()]
    assert ours == theirs, f"sha256 mismatch: {ours} vs {theirs}"
    ratio = best_ss.wall / best_py.wall
    report("hash", f"sha256_files {fmt_b(total / best_py.wall)}/s ({best_py.wall:.2f} s, same digests) = "
           f"{ratio:.2f}x sha256sum", f"sha256sum {fmt_b(total / best_ss.wall)}/s ({best_ss.wall:.2f} s); "
           "target >= 0.9x", ratio >= 0.9)
    cores = best_one.wall / best_py.wall
    threads = sorted((float(x) for x in best_py.out.strip().splitlines()[2].split()), reverse=True)
    busy_threads = [x for x in threads if x >= 0.25 * sum(threads)]
    report("hash", f"{len(busy_threads)} threads each did >= 25% of the hashing (CPU s per thread: "
           f"{', '.join(f'{x:.2f}' for x in threads if x > 0)}); wall {cores:.2f}x faster than one thread "
           f"({best_one.wall:.2f} s)", "one busy thread = one core; both cores used when several files",
           len(busy_threads) >= min(2, os.cpu_count() or 1) and (cores > 1.3 or busy()))
