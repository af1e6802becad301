#!/usr/bin/env python
"""Benchmark: the reference engine's batched decoding against its batch-1 loop, measured in the same run.

Usage::

    python scripts/bench_batching.py [--concurrency 8,32] [--prompts 32] [--max-new-tokens 64] [--repeats 3]

On the embedded example (tiny trained target + DSpark drafter, ``dsparkhub.example``) it times, interleaved and
``--repeats`` times each, the target alone and the drafter at n = 3 and 7: once through the batch-1 loop
(``ReferenceEngine.run``, concurrency 1) and once batched at every ``--concurrency``. It prints total output
tokens/s, the median ratio batched / batch-1 with its spread, and whether the outputs are token-identical to the
batch-1 loop's (they must be: batching is lossless). Exit 1 if any batched output differs.

Threads: one (the example has ~2M parameters; ``torch_threads.threads_for``).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cs = [int(c) for c in args.concurrency.split(",")]

    from dsparkhub.example import build_example
    from dsparkhub.torch_threads import threads_for
    from dsparkhub.prompts.datasets import load_datasets
    from dsparkhub.verify.reference.engine import ReferenceEngine

    ex = build_example()
    prompts = load_datasets([str(ex.prompts)], str(ex.target))[0].prompts
    prompts = (prompts * (args.prompts // max(1, len(prompts)) + 1))[:args.prompts]
    engine = ReferenceEngine(str(ex.target), str(ex.dspark_step))
    threads = threads_for(engine.num_parameters())
    torch.set_num_threads(threads)
    print(f"example target + DSpark drafter, {engine.num_parameters():,} parameters, {threads} thread(s), "
          f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, {args.repeats} interleaved repeats")
    ok = True
    for n in (None, 3, 7):
        tps: dict[int, list[float]] = {c: [] for c in [1] + cs}
        ref = None
        for _ in range(args.repeats):
            for c in [1] + cs:
                st = engine.run(prompts, num_speculative_tokens=n, max_new_tokens=args.max_new_tokens,
                                concurrency=c)
                if c == 1:
                    ref = ref or st.outputs
                elif st.outputs != ref:
                    ok = False
                    print(f"  n={n} concurrency {c}: outputs DIFFER from the batch-1 loop")
                tps[c].append(st.tokens_per_s)
        label = "baseline" if n is None else f"n={n}"
        one = statistics.median(tps[1])
        print(f"{label}: batch-1 loop {one:.0f} tok/s")
        for c in cs:
            ratios = [b / a for a, b in zip(tps[1], tps[c])]
            med = statistics.median(ratios)
            print(f"  concurrency {c:>3}: {statistics.median(tps[c]):.0f} tok/s = {med:.2f}x the batch-1 loop "
                  f"(spread {(max(ratios) - min(ratios)) / med:.0%}) | baseline: batch-1 loop, same run"
                  f"{'' if ok else ' | NOT LOSSLESS'}")
    print("lossless under batching:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
