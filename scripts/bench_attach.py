#!/usr/bin/env python
"""Figure ``attach``: attaching a drafter into a DeepSeek-V4-Flash-sized target skeleton against writing the drafter
alone.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bench_common import (PY, Run, file_state, header_end, spread, cache_note, dir_bytes, drop_caches_of, fmt_b,
                          load_note, median_run, report, resident_bytes, sync_files, timed_shell)
from bench_fixtures import make_v4_pair, v4_real_drafter


def _attach_vs_cp(work: Path, target: Path, draft: Path, rounds: int) -> tuple[list[Run], list[Run]]:
    """``rounds`` interleaved pairs: ``cp -r`` of the drafter (+ fsync), then attach into ``target`` (which fsyncs
    its own output); each output is deleted once measured."""
    code = ("import sys; from dsparkhub.attach import attach; "
            # force: the bench drafter is a Qwen3 one (DSH311 against a V4 target); only the bytes are measured
            "r = attach(sys.argv[1], sys.argv[2], sys.argv[3], force=True); "
            "print(r.drafter_bytes_written, r.target_data_bytes_read)")
    src_files = [p for p in draft.rglob("*") if p.is_file()]
    shards = sorted(target.glob("*.safetensors"))
    known = {p.name for p in target.iterdir()}
    out_cp, out_at = work / "attach-cp-out", work / "attach-out"
    cps, ats = [], []
    for _ in range(rounds):
        shutil.rmtree(out_cp, ignore_errors=True), shutil.rmtree(out_at, ignore_errors=True)
        cps.append(timed_shell(["cp", "-r", str(draft), str(out_cp)], out_cp, src_files))
        shutil.rmtree(out_cp, ignore_errors=True)
        drop_caches_of(shards)
        at = timed_shell([PY, "-c", code, draft, target, out_at], None, src_files)
        t0 = time.perf_counter()
        sync_files([p for p in out_at.iterdir() if p.is_file() and p.name not in known])
        at.wall += time.perf_counter() - t0
        ats.append(at)
    return cps, ats


def bench_attach(work: Path, size: str) -> None:
    """attach a drafter into a V4-Flash-sized target skeleton vs ``cp -r`` of the drafter alone; counts target
    bytes read (page-cache residency after eviction) and written (size / mtime / blocks / inode).

    At full size the drafter has the real V4-Flash drafter's geometry (:func:`v4_real_drafter`, ~11 GB), and a
    second, 1 GB drafter shows attach's fixed cost (Python start-up, reading and rewriting the target's index),
    which no copy hides at that size."""
    target, small_draft = make_v4_pair(work, size)
    draft = (v4_real_drafter(work) if size == "full" else None) or small_draft
    shards = sorted(target.glob("*.safetensors"))
    tbytes, dbytes = sum(p.stat().st_size for p in shards), dir_bytes(draft)
    from dsparkhub.io.header import read_header

    ntensors = sum(len(read_header(f)[0]) for f in draft.glob("*.safetensors"))
    print(f"\n== attach: {fmt_b(dbytes)} drafter ({ntensors:,} tensors, real bytes) into a {fmt_b(tbytes)} "
          f"DeepSeek-V4-Flash-sized target ({len(shards)} shards, sparse); {cache_note()}, outputs fsynced "
          f"({load_note()})")
    before = file_state(target)
    skip = {p: header_end(p) for p in shards}
    # median of 5 interleaved runs each: cp's own time varies by up to 3x on this disk
    cps, ats = _attach_vs_cp(work, target, draft, 1 if size == "tiny" else 5)
    best_cp, best_at = median_run(cps), median_run(ats)
    resident = sum(resident_bytes(p, skip[p]) for p in shards)
    read_ahead = int(Path("/sys/block/vda/queue/read_ahead_kb").read_text()) * 1024 \
        if Path("/sys/block/vda/queue/read_ahead_kb").exists() else 128 << 10
    beyond = sum(max(0, resident_bytes(p, skip[p] + read_ahead)) for p in shards)
    ratio = best_at.wall / best_cp.wall
    report("attach", f"attach {best_at.wall:.2f} s = {ratio:.2f}x writing the drafter alone (medians of "
           f"{len(ats)} interleaved runs; attach {spread(ats)})",
           f"cp -r drafter {best_cp.wall:.2f} s ({spread(cps)}); target <= 1.2x", ratio <= 1.2)
    if draft != small_draft:
        cps1, ats1 = _attach_vs_cp(work, target, small_draft, 5)
        c1, a1 = median_run(cps1), median_run(ats1)
        report("attach", f"fixed cost, seen with a {fmt_b(dir_bytes(small_draft))} drafter: attach {a1.wall:.2f} s "
               f"({spread(ats1)}) = cp + {a1.wall - c1.wall:.2f} s = {a1.wall / c1.wall:.2f}x; "
               f"{(a1.wall - c1.wall) / best_cp.wall:.0%} of the real-size cp",
               f"cp -r {c1.wall:.2f} s ({spread(cps1)}); information: Python start-up and the target's index "
               "are paid once", None)
    after = file_state(target)
    changed = sorted(k for k in before if before[k] != after.get(k)) + sorted(set(after) - set(before))
    report("attach", f"target data read: {fmt_b(beyond)} beyond each header + read-ahead window "
           f"({fmt_b(resident)} resident incl. kernel read-ahead of {read_ahead >> 10} KiB after headers); "
           f"attach's own count: {best_at.out.split()[-1]} B",
           "0 bytes of the target's tensor data", beyond == 0)
    report("attach", f"target files changed (size / mtime / blocks / inode): {len(changed)} of {len(before)}"
           + (f" {changed[:3]}" if changed else ""), "0 written", not changed)
    shutil.rmtree(work / "attach-out", ignore_errors=True)
