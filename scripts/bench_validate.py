#!/usr/bin/env python
"""Figures ``validate`` (header-only validate / inspect of a 1T-parameter target) and ``index`` (issue 18: a
208,215-tensor index written by ``save_pretrained`` and compactly, beside a bare ``json.load`` and the floor of
start-up, index read + decode and the embedding / LM-head shard headers).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from statistics import median
from pathlib import Path

from bench_common import (PY, spread, best_of, dir_bytes, dsparkhub_cli, fast_enough, fmt_b, load_note, median_run,
                          report, run_child)
from bench_fixtures import (kimi_drafter, kimi_target_config, kimi_target_tensors, manifest_skeleton,
                            v4_attached_skeleton, write_skeleton)


def bench_validate(work: Path, size: str) -> None:
    """validate (drafter vs a Kimi-K2.6-sized target) and inspect (a real-size Kimi drafter), as CLI children."""
    print(f"\n== validate / inspect: Kimi-K2.6-sized target skeleton ({load_note()})")
    layers, experts = {"tiny": (4, 8), "small": (61, 384), "full": (61, 384)}[size]
    reps = 1 if size == "tiny" else 3
    draft = work / f"kimi-drafter-L{layers}"
    if not (draft / "config.json").exists():
        kimi_drafter(draft, target_layers=layers)

    def target(shards: int, lay: int = layers, moe_inter: int = 2048) -> Path:
        folder = work / f"kimi-target-L{lay}-E{experts}-I{moe_inter}-S{shards}"
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            write_skeleton(folder, kimi_target_config(lay, experts, moe_inter),
                           kimi_target_tensors(lay, experts, moe_inter), shards, single_name=shards == 1)
            (folder / ".complete").write_text("")
        return folder

    def describe(folder: Path) -> tuple[int, int, int]:
        files = sorted(folder.glob("*.safetensors"))
        n = 0
        for f in files:
            with open(f, "rb") as fh:
                (h,) = struct.unpack("<Q", fh.read(8))
                n += len(json.loads(fh.read(h))) - 1
        return len(files), n, sum(f.stat().st_size for f in files)

    startup = best_of(reps, dsparkhub_cli("--version"))
    main_target = (manifest_skeleton(work, "kimi-k2.6") if size != "tiny" else None) or target(64)
    print(f"  target skeleton: {main_target.name}"
          + (" (dsparkhub.skeleton, manifests/targets/kimi-k2.6.yaml)" if "skeleton" in main_target.name else ""))
    shards, tensors, nbytes = describe(main_target)
    r = best_of(reps, dsparkhub_cli("validate", draft, "--target", main_target))
    print(f"  target: {shards} shards, {tensors:,} tensors, {fmt_b(nbytes)} (sparse: "
          f"{fmt_b(sum(f.stat().st_blocks * 512 for f in main_target.iterdir()))} on disk)")
    base = (f"CLI start-up (dsparkhub --version) {startup.wall:.3f} s wall / {startup.cpu:.2f} s CPU, "
            f"{fmt_b(startup.maxrss)}; target < 0.5 s, < 200 MB")
    report("validate", f"validate drafter vs 1T target: {r.wall:.3f} s wall / {r.cpu:.2f} s CPU, peak RSS "
           f"{fmt_b(r.maxrss)}", base, fast_enough(r, 0.5) and r.maxrss < 200e6)
    i = best_of(reps, dsparkhub_cli("inspect", draft))
    report("validate", f"inspect real-size Kimi drafter ({fmt_b(dir_bytes(draft))}): {i.wall:.3f} s wall / "
           f"{i.cpu:.2f} s CPU, peak RSS {fmt_b(i.maxrss)}", base, fast_enough(i, 0.5) and i.maxrss < 200e6)

    v4 = v4_attached_skeleton(work) if size != "tiny" else None
    if v4 is not None:
        ns, nt, nb = describe(v4)
        j = best_of(reps, dsparkhub_cli("inspect", v4))
        report("validate", f"inspect DeepSeek-V4-Flash with its attached drafter ({ns} shards, {nt:,} tensors, "
               f"{fmt_b(nb)}): {j.wall:.3f} s wall / {j.cpu:.2f} s CPU, peak RSS {fmt_b(j.maxrss)}", base,
               fast_enough(j, 0.5) and j.maxrss < 200e6)

    print("  how validate's time grows (bytes and shard count change; it must follow the tensors it reads):")
    print(f"    {'shards':>6} {'tensors':>9} {'bytes':>10} {'wall s':>7} {'CPU s':>6} {'RSS':>9}")
    rows = [(1, layers, 2048), (10, layers, 2048), (100, layers, 2048), (64, layers, 256),
            (10, max(2, layers // 10), 2048)]
    if size == "tiny":
        rows = [(1, layers, 2048), (10, layers, 2048), (10, layers, 256)]
    for s, lay, inter in rows:
        folder = target(s, lay, inter)
        d = work / f"kimi-drafter-L{lay}"
        if not (d / "config.json").exists():
            kimi_drafter(d, target_layers=lay)
        ns, nt, nb = describe(folder)
        rr = best_of(reps, dsparkhub_cli("validate", d, "--target", folder))
        print(f"    {ns:>6} {nt:>9,} {fmt_b(nb):>10} {rr.wall:>7.3f} {rr.cpu:>6.2f} {fmt_b(rr.maxrss):>9}")
    print("    (one shard = no index: every header is parsed; with an index only the index and the shards holding "
          "the embedding / LM head are)")


_FLOOR_CODE = """
import sys, time
from dsparkhub.io.checkpoint import read_index
from dsparkhub.io.header import read_header
from dsparkhub.target import EMBED_NAMES, HEAD_NAMES
folder = sys.argv[1]
t0 = time.perf_counter()
wm = read_index(folder + "/model.safetensors.index.json")["weight_map"]
t1 = time.perf_counter()
# the shards validate parses: those of the first embedding / LM-head name present (target_from_checkpoint's order)
shards = {wm[next(n for n in names if n in wm)] for names in (EMBED_NAMES, HEAD_NAMES) if any(n in wm for n in names)}
for s in shards:
    read_header(folder + "/" + s)
print(t1 - t0, time.perf_counter() - t1)
"""


def _floor(target: Path, reps: int) -> dict[str, float]:
    """Medians over ``reps`` child runs of the pieces no exact header-only validate can skip: interpreter + click
    start-up (``dsparkhub --version``), reading and decoding the index (``read_index``: msgspec, typed), and parsing
    the shard headers holding the embedding and LM head (the names ``dsparkhub.target`` looks for, in its order)."""
    start, index, headers = [], [], []
    for _ in range(reps):
        start.append(run_child(dsparkhub_cli("--version")).wall)
        a, b = map(float, run_child([PY, "-c", _FLOOR_CODE, target]).out.split())
        index.append(a), headers.append(b)
    return {"start-up (dsparkhub --version)": median(start), "read + decode index": median(index),
            "embedding / LM-head shard headers": median(headers)}


INDEX_FORMATS = {
    # transformers save_pretrained / huggingface_hub: json.dumps(index, indent=2, sort_keys=True) + "\n"
    "save_pretrained (indent=2, sorted keys)": {"indent": 2, "sort_keys": True},
    "compact": {"separators": (",", ":")},
}


def bench_index(work: Path, size: str) -> None:
    """validate against a Kimi-K2.6-shaped target (208,215 tensors at small / full) whose index is written the way
    ``save_pretrained`` writes it and compactly, each beside a bare ``json.load`` of the same index file (issue 18).

    The target has no ``dsparkhub_skeleton.json`` marker: it stands for a checkpoint made elsewhere. Each figure is
    the median of 5 child runs; the baseline is the median of 5 child processes that only ``json.load`` the index
    (interpreter start-up included, as in the measured command), and the same load timed in-process. Beside each
    figure it prints the floor (:func:`_floor`): the pieces any exact header-only validate pays on this machine.
    """
    print(f"\n== index: validate against a Kimi-K2.6-shaped target, two index formats ({load_note()})")
    reps = 1 if size == "tiny" else 5
    layers = 4 if size == "tiny" else 61
    draft = work / f"kimi-drafter-L{layers}"
    if not (draft / "config.json").exists():
        kimi_drafter(draft, target_layers=layers)
    base = work / f"index-target-L{layers}"
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        if size == "tiny":
            write_skeleton(base, kimi_target_config(layers, 8), kimi_target_tensors(layers, 8), 8, single_name=False)
        else:
            from dsparkhub.skeleton import write_skeleton as manifest_write

            manifest_write("kimi-k2.6", base)
            (base / "dsparkhub_skeleton.json").unlink()
        (base / ".complete").write_text("")
    index = json.loads((base / "model.safetensors.index.json").read_text())
    load = [PY, "-c", "import json, sys; json.load(open(sys.argv[1]))"]
    for label, kw in INDEX_FORMATS.items():
        folder = work / f"index-target-L{layers}-{'sorted' if kw.get('sort_keys') else 'compact'}"
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for f in base.iterdir():
                if f.name.endswith(".safetensors"):
                    os.link(f, folder / f.name)  # same tensors, one set of (sparse) blocks
            shutil.copyfile(base / "config.json", folder / "config.json")
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, **kw) + "\n")
            (folder / ".complete").write_text("")
        path = folder / "model.safetensors.index.json"
        runs, loads, inproc = [], [], []
        for _ in range(reps):  # interleaved, so a busy spell hits both alike
            runs.append(run_child(dsparkhub_cli("validate", draft, "--target", folder)))
            loads.append(run_child([*load, path]))
            t0 = time.perf_counter()
            with open(path) as fh:
                json.load(fh)
            inproc.append(time.perf_counter() - t0)
        r, j = median_run(runs), median_run(loads)
        n = len(index["weight_map"])
        floor = _floor(folder, reps)
        report("index", f"validate vs {n:,}-tensor target, index {label} ({fmt_b(path.stat().st_size)}): "
               f"{r.wall:.3f} s wall / {r.cpu:.2f} s CPU, peak RSS {fmt_b(r.maxrss)} (median of {reps}; "
               f"{spread(runs)})",
               f"bare json.load of the same index: {j.wall:.3f} s as a process, "
               f"{sorted(inproc)[len(inproc) // 2]:.3f} s in-process; target < 0.25 s, < 150 MB",
               fast_enough(r, 0.25) and r.maxrss < 150e6)
        print("    where the time goes (same run, medians): "
              + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in floor.items()))
        print(f"    sum of those floors {sum(floor.values()):.3f} s: what any exact header-only validate pays on "
              "this machine")
