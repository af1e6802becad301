"""Smoke test of ``scripts/bench.py``: every benchmark runs at its smallest size and prints its figures beside
their baselines, so the benchmarks cannot rot.

Timing targets are not asserted here (a shared CI runner cannot hold them); the invariants the benchmarks measure
that do not depend on timing are: attach reads and writes zero bytes of the target, an unchanged push uploads
nothing, ``sha256_files`` agrees with ``sha256sum``, and the reference engine stays lossless.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def run_bench(name: str, work: Path) -> str:
    proc = subprocess.run([sys.executable, str(BENCH), name, "--size", "tiny", "--workdir", str(work)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"bench {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout
    assert "== summary" in out
    m = re.search(r"(\d+) of (\d+) figures meet their target", out)
    assert m and int(m.group(2)) >= 1, out
    figures = [line for line in out.splitlines() if "| baseline:" in line]
    assert len(figures) == int(m.group(2)), out  # every figure is printed beside its baseline
    return out


def test_validate_bench(tmp_path):
    out = run_bench("validate", tmp_path)
    assert re.search(r"validate drafter vs 1T target: [\d.]+ s wall / [\d.]+ s CPU, peak RSS [\d.]+ [KMG]?B", out)
    assert re.search(r"inspect real-size Kimi drafter", out)
    # the shard-growth table has one row per target
    rows = re.findall(r"^\s+\d+\s+[\d,]+\s+[\d.]+ [KMGT]?B\s+[\d.]+\s+[\d.]+\s+[\d.]+ [KMG]?B$", out, re.M)
    assert len(rows) == 3, out


def test_convert_bench(tmp_path):
    out = run_bench("convert", tmp_path)
    m = re.search(r"convert throughput .* = ([\d.]+)x cp", out)
    assert m and float(m.group(1)) > 0, out
    assert re.search(r"convert peak RSS [\d.]+ [KMG]?B", out)


def test_attach_bench_touches_no_target_bytes(tmp_path):
    out = run_bench("attach", tmp_path)
    assert re.search(r"attach [\d.]+ s = [\d.]+x writing the drafter alone", out)
    assert re.search(r"\[PASS\] target data read: 0 B beyond", out), out
    assert re.search(r"\[PASS\] target files changed .*: 0 of \d+", out), out


def test_hash_bench_matches_sha256sum(tmp_path):
    out = run_bench("hash", tmp_path)  # the script asserts identical digests before printing
    assert re.search(r"sha256_files .* \(.*same digests\) = [\d.]+x sha256sum", out), out


def test_push_bench_unchanged_release_uploads_nothing(tmp_path):
    out = run_bench("push", tmp_path)
    assert re.search(r"\[PASS\] re-run of the unchanged release: 0 B uploaded, server received 0 B, 0 write", out), \
        out


def test_verify_bench(tmp_path):
    out = run_bench("verify", tmp_path)
    assert "lossless: True" in out, out
    assert re.search(r"measured speedup [\d.]+x = [\d.]+x of the prediction", out), out


def test_index_bench_prints_both_formats_beside_json_load(tmp_path):
    out = run_bench("index", tmp_path)
    for label in ("save_pretrained (indent=2, sorted keys)", "compact"):
        assert re.search(rf"index {re.escape(label)} \([\d.]+ [KMG]?B\): [\d.]+ s wall / [\d.]+ s CPU, peak RSS "
                         rf"[\d.]+ [KMG]?B .*\| baseline: bare json.load of the same index: [\d.]+ s as a process", out)
    floors = re.findall(r"start-up \(dsparkhub --version\) (\d+) ms, read \+ decode index (\d+) ms, "
                        r"embedding / LM-head shard headers (\d+) ms", out)
    assert len(floors) == 2 and all(int(f[0]) > 0 for f in floors), out  # the floor beside each figure
