#!/usr/bin/env python
"""Nightly-size fuzz of every parser of a stranger's checkpoint (safetensors headers, index files, configs).

Runs the same properties as ``tests/test_fuzz_headers.py`` (see ``dsparkhub.testing.fuzz``) with many more, random
examples, and prints how many cases each family ran and how they ended (``ok`` / ``findings`` / the dsparkhub
error type). Any other exception, a hang (> 10 s per case) or a header read whose memory peak is out of proportion
to the file's size fails the run with exit code 1 and hypothesis's minimal failing example.

Usage::

    python scripts/fuzz_headers.py --examples 10000        # nightly: 10,000 cases in all
    python scripts/fuzz_headers.py --examples 500 --seed 7  # quick, reproducible

The examples are split 40% safetensors files / 40% raw headers / 20% checkpoint folders (folder cases copy and
validate a whole tiny drafter + target, so they are ~50x slower).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

from dsparkhub.testing import fuzz


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10_000, help="cases in all (default 10000)")
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    n_file, n_header = int(args.examples * 0.4), int(args.examples * 0.4)
    n_folder = args.examples - n_file - n_header

    def cfg(n):
        return settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                        print_blob=True)

    with tempfile.TemporaryDirectory(prefix="dsparkhub-fuzz-") as tmp:
        work = Path(tmp)
        base = fuzz.make_base(work / "base")

        @cfg(n_file)
        @given(case=fuzz.safetensors_files())
        def files(case):
            fuzz.check_file(case[0], work)

        @cfg(n_header)
        @given(raw=fuzz.header_json())
        def headers(raw):
            fuzz.check_header_bytes(raw, 64)

        @cfg(n_folder)
        @given(ops=fuzz.folder_mutations())
        def folders(ops):
            fuzz.check_folder(base, ops, work / "folder")

        failed = False
        for name, fn in (("safetensors files", files), ("raw headers", headers), ("checkpoint folders", folders)):
            if args.seed is not None:
                fn = seed(args.seed)(fn)
            t0 = time.perf_counter()
            try:
                fn()
            except Exception as exc:  # report every family, then fail
                failed = True
                for sub in getattr(exc, "exceptions", [exc]):
                    where = traceback.extract_tb(sub.__traceback__)[-1]
                    print(f"FAILED {name}: {type(sub).__name__}: {str(sub)[:300]} at {Path(where.filename).name}:"
                          f"{where.lineno}", file=sys.stderr)
                    for note in getattr(sub, "__notes__", [])[:3]:
                        print(f"    {note[:600]}", file=sys.stderr)
            print(f"{name}: done in {time.perf_counter() - t0:.1f} s")
    total = sum(fuzz.COUNTS.values())
    print(f"cases run: {total} (includes hypothesis's shrinking / replay calls)")
    for key, count in sorted(fuzz.COUNTS.items()):
        print(f"  {key:45} {count}")
    print("result:", "FAILED" if failed else "every case ended in success or a dsparkhub error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
