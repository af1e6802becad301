#!/usr/bin/env python
"""Benchmarks for dsparkhub at real scale, each printed as a ratio against a baseline measured in the same run.

Usage::

    python scripts/bench.py all --size small        # every benchmark, ~200 MB of real bytes (minutes)
    python scripts/bench.py all --size full         # real scale: 1T-param Kimi skeleton, 3 GB and 11 GB drafters
                                                    # (needs ~40 GB free)
    python scripts/bench.py validate|index|convert|attach|hash|push|verify --size tiny|small|full [--workdir DIR]

Targets (issue 6; "PASS"/"MISS" is printed beside each):

- validate / inspect of a Kimi-K2.6-sized target (about 1T parameters, 64 shards, sparse skeleton): < 0.5 s wall
  and < 200 MB peak RSS for the CLI run as a child process; the time follows the number of tensors, not shards or
  bytes (a 1 / 10 / 100-shard table is printed);
- index (issue 18): validate against a Kimi-K2.6-shaped target (208,215 tensors) whose index is written the way
  ``save_pretrained`` writes it (indent 2, sorted keys) and compactly: < 0.25 s wall and < 150 MB each, printed
  beside a bare ``json.load`` of the same index file;
- convert of a drafter holding real random bytes: throughput >= 0.8x ``cp`` of the same files on the same disk;
  peak RSS <= 2x the largest tensor + 300 MB;
- attach into a DeepSeek-V4-Flash-sized target skeleton (sparse): time <= 1.2x writing the drafter alone, zero
  bytes of the target read or written; at full size the drafter has the real V4-Flash drafter's geometry (3 stages,
  4,704 tensors, ~11 GB), and a 1 GB drafter shows the fixed cost separately;
- hashing: >= 0.9x ``sha256sum`` of the same files; both cores used when there are several files;
- push re-run of an unchanged release against the local Hub: 0 bytes uploaded, time dominated by hashing;
- reference verify: measured speedup >= 0.9x what L = (T_draft + T_verify) / τ predicts from its own step times.

Timings are wall clock of child processes started through ``/usr/bin/time`` (their own peak RSS and CPU seconds;
a child forked straight from this process would inherit its RSS high-water mark). Baselines run interleaved with
the measured command, best of 2-3 each (median of 5 for the copy benchmarks). Copy benchmarks evict their source
files from the page cache (``posix_fadvise``), empty the whole page cache first when run as root (a cache full of
other files makes every run pay for reclaim, and varied cp's own time by up to 2x), and fsync what was written, for
baseline and tool alike. Skeletons are sparse files: a real
safetensors header followed by a hole, so a 1T-parameter checkpoint costs a few MB of disk; the headline targets come
from ``dsparkhub.skeleton`` (``manifests/targets/*.yaml``) when it is available.

On a machine busy with other jobs (1-minute load average above the core count, printed with every section) the wall
clock measures the other jobs: the CPU-bound checks (validate / inspect, convert) then also accept the command's own
CPU seconds (spread over its threads, plus its fsync wait) in place of wall time, and say so on the line.

Size ``tiny`` exists for ``tests/test_bench_smoke.py`` (seconds): it checks that every benchmark runs and prints
its ratios; timing targets are only meaningful at ``small`` / ``full``.

"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import sys
from pathlib import Path

import bench_common
from bench_attach import bench_attach
from bench_common import RESULTS, SIZES, compile_bytecode, fmt_b, load_note
from bench_convert import bench_convert
from bench_hash import bench_hash
from bench_push import bench_push
from bench_validate import bench_index, bench_validate
from bench_verify import bench_verify


BENCHES = {"validate": bench_validate, "index": bench_index, "convert": bench_convert, "attach": bench_attach,
           "hash": bench_hash, "push": bench_push, "verify": bench_verify}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=[*BENCHES, "all"], help="benchmark to run")
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="tiny: seconds (smoke test); small: ~0.4 GB of real bytes; full: real scale "
                             "(3 GB and 11 GB drafters, 1T-parameter / 150 GB skeletons; needs ~40 GB free)")
    parser.add_argument("--workdir", type=Path, help="where skeletons and drafters are built and cached "
                        "(default: a temporary folder, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dsparkhub-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    need = {"tiny": 0.2e9, "small": 3e9, "full": 40e9}[args.size]
    bench_common.EMPTY_CACHE = args.size != "tiny"  # the smoke test leaves the machine's page cache alone
    if free < need:
        print(f"warning: {fmt_b(free)} free under {work}; size {args.size} needs about {fmt_b(need)}", flush=True)
    print(f"dsparkhub benchmarks, size {args.size}, work folder {work}, {os.cpu_count()} cores, {load_note()}",
          flush=True)
    compile_bytecode()
    t0 = time.perf_counter()
    try:
        for name in (BENCHES if args.which == "all" else [args.which]):
            BENCHES[name](work, args.size)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s, {load_note()})")
    for bench, figure, baseline, ok in RESULTS:
        mark = "-" if ok is None else ("PASS" if ok else "MISS")
        print(f"  {mark:4}  {bench:8} {figure}  [baseline: {baseline}]")
    missed = [r for r in RESULTS if r[3] is False]
    print(f"{len(RESULTS) - len(missed)} of {len(RESULTS)} figures meet their target"
          + (f"; missed: {', '.join(sorted({r[0] for r in missed}))}" if missed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
