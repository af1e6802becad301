#!/usr/bin/env python
"""Write a target checkpoint from a manifest: real-size sparse skeleton (default) or tiny version with data.

    python scripts/make_skeleton.py kimi-k2.6 --out /tmp/kimi-k2.6-skeleton
    python scripts/make_skeleton.py deepseek-v4-flash --out /tmp/v4 --with-drafter   # + attached mtp.* stages
    python scripts/make_skeleton.py deepseek-v4-flash --out /tmp/v4-tiny --tiny      # tiny dims, random values
    python scripts/make_skeleton.py --list

The library code is dsparkhub.skeleton (also `dsparkhub skeleton MANIFEST --out DIR`).
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from dsparkhub.errors import DsparkhubError
    from dsparkhub.layouts.manifests import load_manifests
    from dsparkhub.skeleton import write_skeleton

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", nargs="?", help="target manifest name (see --list)")
    ap.add_argument("--out", help="output folder (must not exist unless --overwrite)")
    ap.add_argument("--tiny", action="store_true", help="tiny dimensions with random values")
    ap.add_argument("--with-drafter", action="store_true", help="DeepSeek-V4: add the attached mtp.* stages")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--list", action="store_true", help="list target manifests with a tensor layout")
    args = ap.parse_args(argv)
    try:
        if args.list:
            targets, _ = load_manifests()
            for name, m in sorted(targets.items()):
                src = (m.checkpoint or {}).get("source", "none")
                print(f"{name:<20} layout: {src}")
            return 0
        if not args.manifest or not args.out:
            ap.error("MANIFEST and --out are required")
        t0 = time.perf_counter()
        r = write_skeleton(args.manifest, args.out, tiny=args.tiny, with_drafter=args.with_drafter,
                           overwrite=args.overwrite)
    except DsparkhubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {r.out}: {r.num_tensors} tensors, {len(r.files)} shard(s), {r.logical_bytes / 2**30:.1f} GiB "
          f"logical, {r.disk_bytes / 2**20:.1f} MiB on disk, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
