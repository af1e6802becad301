#!/usr/bin/env python
"""Figure ``convert``: conversion throughput against ``cp`` of the same files, and peak memory.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

from bench_common import busy, cache_note, dir_bytes, dsparkhub_cli, fmt_b, load_note, median_run, report, timed_shell
from bench_fixtures import make_qwen3_pair

from dsparkhub.io.header import tensor_nbytes


def bench_convert(work: Path, size: str) -> None:
    """convert (DeepSpec -> vLLM layout) of a drafter with real bytes vs ``cp -r`` of the same files."""
    target, draft = make_qwen3_pair(work, size)
    nbytes = dir_bytes(draft)
    largest = max(tensor_nbytes(d, s) for d, s in
                  ((v["dtype"], v["shape"]) for k, v in json.loads(
                      (draft / "model.safetensors").open("rb").read(8 + struct.unpack(
                          "<Q", (draft / "model.safetensors").open("rb").read(8))[0])[8:]).items()
                   if k != "__metadata__"))
    print(f"\n== convert: {fmt_b(nbytes)} DeepSpec drafter (real random bytes, largest tensor {fmt_b(largest)}) "
          f"-> vLLM layout; {cache_note()}, outputs fsynced ({load_note()})")
    src_files = [p for p in draft.rglob("*") if p.is_file()]
    cps, cvs = [], []
    out_cp, out_cv = work / "cp-out", work / "convert-out"
    out_bytes = 0
    rounds = {"tiny": 1, "small": 3, "full": 5}[size]
    for i in range(rounds):  # interleaved, order alternating, the median of each: cp's own time varies by ~1.5x
        runs = {}
        for which in (("cp", "convert") if i % 2 == 0 else ("convert", "cp")):
            # each output is deleted right after it is measured, so neither run pays for the other's page cache
            shutil.rmtree(out_cp, ignore_errors=True), shutil.rmtree(out_cv, ignore_errors=True)
            if which == "cp":
                runs[which] = timed_shell(["cp", "-r", str(draft), str(out_cp)], out_cp, src_files)
            else:
                # its copies are random on purpose (see make_qwen3_pair): DSH312 unless allowed
                runs[which] = timed_shell(dsparkhub_cli("convert", draft, "--target", target, "--out", out_cv,
                                                        "--allow-different-embeddings"), out_cv, src_files)
                out_bytes = dir_bytes(out_cv)
        shutil.rmtree(out_cp, ignore_errors=True), shutil.rmtree(out_cv, ignore_errors=True)
        cps.append(runs["cp"])
        cvs.append(runs["convert"])
    best_cp, best_cv = median_run(cps), median_run(cvs)
    best_cv.maxrss = max(r.maxrss for r in cvs)
    ratio = (nbytes / best_cv.wall) / (nbytes / best_cp.wall)
    # convert's CPU work is one sha256 pass over the source files (for provenance, on a second thread) plus the
    # kernel's copy; on a machine busy with other jobs its wall clock measures them, so the
    # figure that stands in for wall is its CPU seconds spread over its 2 threads plus the fsync wait after it exits
    # (0 for convert, which flushes its shards itself before renaming OUT into place; cp's is measured after it).
    idle = best_cv.cpu / min(2, os.cpu_count() or 1) + best_cv.sync
    report("convert", f"convert throughput {fmt_b(nbytes / best_cv.wall)}/s ({best_cv.wall:.2f} s, median of "
           f"{len(cvs)}, {min(r.wall for r in cvs):.2f}-{max(r.wall for r in cvs):.2f} s; wrote "
           f"{fmt_b(out_bytes)}) = {ratio:.2f}x cp; CPU {best_cv.cpu:.2f} s on 2 threads + fsync "
           f"{best_cv.sync:.2f} s -> {idle:.2f} s on idle cores = {best_cp.wall / idle:.2f}x cp",
           f"cp -r {fmt_b(nbytes / best_cp.wall)}/s ({best_cp.wall:.2f} s, {min(r.wall for r in cps):.2f}-"
           f"{max(r.wall for r in cps):.2f} s, fsync {best_cp.sync:.2f} s); "
           "target >= 0.8x", ratio >= 0.8 or (busy() and best_cp.wall / idle >= 0.8))
    cap = 2 * largest + 300e6
    report("convert", f"convert peak RSS {fmt_b(best_cv.maxrss)}",
           f"2 x largest tensor + 300 MB = {fmt_b(cap)}", best_cv.maxrss <= cap)
