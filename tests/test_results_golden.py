"""Golden outputs of the results file: a fixed RunStats input must give byte-identical JSON, summary table and /1
upgrade, so a refactor of ``dsparkhub.verify.results`` proves it changed nothing (tests/data/results_golden.*).

Regenerate (only on a deliberate schema change): ``DSPARKHUB_REGEN_GOLDEN=1 pytest tests/test_results_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from dsparkhub.verify.results.derive import build_results
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings
from dsparkhub.verify.results.table import format_summary_table
from dsparkhub.verify.stats import RunStats

DATA = Path(__file__).parent / "data"
OUT_A = [[10, 11, 12, 13, 14, 15], [20, 21, 22]]
OUT_B = [[30, 31, 32, 33], [40, 41], [50, 51, 52, 53, 54]]


def _spec(outputs, wall, drafts, acc, draft_tokens=None, **kw):
    return RunStats(outputs=[list(o) for o in outputs], wall_s=wall, num_drafts=drafts,
                    num_draft_tokens=drafts * len(acc) if draft_tokens is None else draft_tokens,
                    num_accepted_tokens=sum(acc), accepted_per_pos=list(acc), **kw)


def _timed(outputs, wall, k):
    """Per-request timings that differ by prompt and by repeat ``k``."""
    return dict(ttft_s=[0.05 + 0.01 * i + 0.001 * k for i in range(len(outputs))],
                latency_s=[0.1 * len(o) + 0.02 * k for o in outputs])


def golden_results():
    """Two datasets x n in {2, 4} x concurrency {1, 4} x three interleaved repeats, latencies, one mismatch, one
    spread-unreliable run and one latency-law-unreliable run: every derived figure of the schema is exercised."""
    runs = []
    for name, source, outs, walls in (("alpha", "alpha.jsonl (sha256 0123456789ab)", OUT_A, (3.0, 3.1, 2.9)),
                                      ("beta", "builtin:code", OUT_B, (2.2, 2.3, 2.25))):
        base, by = {}, {}
        for c in (1, 4):
            base[c] = [RunStats(outputs=outs, wall_s=w / c, concurrency=c, **_timed(outs, w, k))
                       for k, w in enumerate(walls)]
            for n, acc, factor in ((2, [4, 2], 1.6), (4, [4, 3, 1, 0], 2.1)):
                found = [list(o) for o in outs]
                if name == "beta" and n == 4 and c == 4:
                    found[1][1] = 99  # one greedy mismatch
                reps = []
                for k, w in enumerate(walls):
                    jitter = 1.9 if (name == "alpha" and n == 2 and c == 4 and k == 2) else 1.0  # spread
                    f = 3.5 if (name == "beta" and n == 2 and c == 1) else factor  # speedup > tau at c=1
                    reps.append(_spec(found, w / c / f * jitter, 5, acc, draft_tokens=5 * n - 1, concurrency=c,
                                      **_timed(found, w / f, k)))
                by[n, c] = reps
        runs.append((name, source, base, by))
    return build_results(engine=EngineInfo("vllm", "vllm 0.32.0", "NVIDIA H200 x1"), method="dspark",
                         target=ModelRef("org/target", "cd" * 32), drafter=ModelRef("drafter", "ab" * 32),
                         settings=Settings(temperature=0.0, max_new_tokens=6, seed=7, num_speculative_tokens=[4, 2],
                                           concurrency=[4, 1], repeats=3, order="interleaved", spread_limit=0.2,
                                           batch_size=4, max_model_len=4096),
                         runs=runs, date="2026-12-01T00:00:00+00:00", warnings=["[DSH401] a warning"],
                         incomplete=["n=8 at concurrency 16: server died"])


def _check(path: Path, text: str):
    if os.environ.get("DSPARKHUB_REGEN_GOLDEN"):
        path.write_bytes(text.encode())
    assert text.encode() == path.read_bytes(), f"{path.name} changed"


def test_results_json_golden(tmp_path):
    saved = golden_results().save(tmp_path / "results.json")
    _check(DATA / "results_golden.json", saved.read_text(encoding="utf-8"))


def test_summary_table_golden():
    _check(DATA / "results_golden.txt", format_summary_table(golden_results()) + "\n")


def test_read_and_rewrite_golden(tmp_path):
    """Reading the golden file and writing it again gives the same bytes."""
    again = read_results(DATA / "results_golden.json").save(tmp_path / "again.json")
    assert again.read_bytes() == (DATA / "results_golden.json").read_bytes()


def test_v1_upgrade_golden(tmp_path):
    """A /1 file upgraded in memory and written as /2 (tests/data/results_v1.json -> results_v1_upgraded.json)."""
    up = read_results(DATA / "results_v1.json").save(tmp_path / "up.json")
    _check(DATA / "results_v1_upgraded.json", up.read_text(encoding="utf-8"))
