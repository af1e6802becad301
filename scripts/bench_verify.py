#!/usr/bin/env python
"""Figure ``verify``: reference verify speedup against what its own step times predict.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench_common import PY, load_note, report, run_child


VERIFY_CHILD = r"""
import json, sys, time
import torch
from dsparkhub.verify.reference.engine import ReferenceEngine
target, drafter = sys.argv[1], sys.argv[2]
n, new_tokens, nprompts, vocab = (int(x) for x in sys.argv[3:7])
prompts_file = sys.argv[7] if len(sys.argv) > 7 else ""
if prompts_file:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(target)
    rows = [json.loads(l) for l in open(prompts_file) if l.strip()][:nprompts]
    prompts = []
    for r in rows:
        text = r.get("prompt") or (r.get("turns") or [""])[0] or r.get("text", "")
        prompts.append(tok(text)["input_ids"][:64])
else:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (16,), generator=g).tolist() for _ in range(nprompts)]
eng = ReferenceEngine(target, drafter, ignore_eos=True)
base = eng.run(prompts, num_speculative_tokens=None, max_new_tokens=new_tokens)
spec = eng.run(prompts, num_speculative_tokens=n, max_new_tokens=new_tokens)
print(json.dumps({"base_wall": base.wall_s, "base_tokens": base.output_tokens, "spec_wall": spec.wall_s,
                  "spec_tokens": spec.output_tokens, "draft_s": spec.draft_s, "verify_s": spec.verify_s,
                  "drafts": spec.num_drafts, "tau": spec.tau, "steps": spec.steps,
                  "lossless": base.outputs == spec.outputs}))
"""


def bench_verify(work: Path, size: str) -> None:
    """Reference engine: measured speedup vs the one L = (T_draft + T_verify) / τ predicts from its own timings."""
    prompts_file = ""
    example = None
    if size != "tiny":  # the shipped example is laid out in well under a second
        from dsparkhub.example import build_example

        example = build_example()
    if example is not None:
        target, drafter, vocab = example.target, example.dspark_step, 0
        prompts_file = str(example.prompts)
        what = f"the embedded example (trained drafter, {example.root})"
    else:
        from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

        hidden, layers, vocab = {"tiny": (32, 4, 128), "small": (256, 6, 4096), "full": (512, 8, 8192)}[size]
        target = work / f"verify-target-{size}"
        run = work / f"verify-drafter-{size}"
        if not (target / "config.json").exists():
            make_qwen3_target(target, hidden=hidden, layers=layers, vocab=vocab, heads=4, kv_heads=2,
                              head_dim=hidden // 4, intermediate=hidden * 3)
        if not (run / "step_latest").exists():
            make_deepspec_drafter(run, target, layers=1, target_layer_ids=(0, layers // 2, layers - 2),
                                  markov_rank=16)
        drafter = run
        what = f"random Qwen3 target (hidden {hidden}, {layers} layers, vocab {vocab}) + random DSpark drafter " \
               "(size tiny: τ near 1)"
    n, new_tokens, nprompts = {"tiny": (3, 8, 1), "small": (7, 48, 4), "full": (7, 96, 8)}[size]
    print(f"\n== reference verify: {what}; n = {n}, {nprompts} prompts x {new_tokens} tokens, greedy "
          f"({load_note()})")
    r = run_child([PY, "-c", VERIFY_CHILD, str(target), str(drafter), str(n), str(new_tokens), str(nprompts),
                   str(vocab), prompts_file])
    m = json.loads(r.out.strip().splitlines()[-1])
    measured = (m["spec_tokens"] / m["spec_wall"]) / (m["base_tokens"] / m["base_wall"])
    per_step = (m["draft_s"] + m["verify_s"]) / m["drafts"]
    latency = per_step / m["tau"]  # L = (T_draft + T_verify) / τ
    predicted = (m["base_wall"] / m["base_tokens"]) / latency
    ratio = measured / predicted
    print(f"  τ = {m['tau']:.2f}, T_draft = {m['draft_s'] / m['drafts'] * 1e3:.1f} ms, T_verify = "
          f"{m['verify_s'] / m['drafts'] * 1e3:.1f} ms per step, baseline "
          f"{m['base_wall'] / m['base_tokens'] * 1e3:.1f} "
          f"ms per token; lossless: {m['lossless']}")
    report("verify", f"measured speedup {measured:.2f}x = {ratio:.2f}x of the prediction",
           f"L = (T_draft + T_verify) / τ predicts {predicted:.2f}x; target >= 0.9x", ratio >= 0.9)
