"""Per-request figures of a results file: each request's τ, accepted tokens per step and latency, the
request-weighted τ, the latency percentile speedups, and the per-category matrix of a SPEED-Bench run.

Why per request: a token-weighted τ (accepted over drafts of the whole run) leans toward long completions, whose
many steps outvote short ones (ai-dynamo/aiperf #1191, vllm-project/vllm#42690); the request-weighted τ is the
plain mean of per-request τ, each request counting once. Both are stored.

Definitions (vLLM 0.32 ``v1/metrics/stats.py`` ``RequestSpecDecodeMetrics``, ``vllm/benchmarks/serve.py``):

- per-request τ = 1 + accepted / verify steps with drafts (bonus included); accepted tokens per step = accepted /
  steps (bonus excluded); a request with no drafted step has neither (``null``);
- TTFT = first token - start, E2E = last token - start, TPOT = (E2E - TTFT) / (output tokens - 1) (ms);
- percentile speedup = the baseline's percentile / the drafter's (latency: lower is better, so > 1 is faster), at
  the same concurrency on the same prompts, percentiles pooled over every request of every repeat;
- a category (SPEED-Bench: one dataset ``NAME/category`` per category, ``prompts.speed_bench``) has τ and speedup
  of its own dataset; the matrix is a view of those runs, one row per category x n x concurrency.

This module holds the additive ``/2`` types (defaults keep older files readable) and their arithmetic; it does not
run engines or render tables (``table``, ``card``).
"""

from __future__ import annotations

from dataclasses import field

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from dsparkhub.verify.stats import RunStats

_STRICT = ConfigDict(extra="forbid", strict=True)
#: the percentiles reported for TPOT and E2E
PERCENTILES = (50, 95, 99)
_CATEGORY_MARK = " category "  # ``speed_bench.read_categories`` ends a category dataset's source with it


@dataclass(config=_STRICT)
class PerRequest:
    """One value per request (prompt order) of the first repeat; ``null`` where a request has none.

    Attributes:
        tau: τ of each request (None: no drafted step, or no drafter).
        accepted_per_step: draft tokens accepted per verify step of each request (bonus excluded).
        ttft_ms / tpot_ms / e2e_ms: latency of each request in milliseconds (empty lists: the backend did not time
            requests).
    """

    tau: list[float | None] = field(default_factory=list)
    accepted_per_step: list[float | None] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float | None] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)


@dataclass(config=_STRICT)
class LatencySpeedup:
    """Baseline percentile / drafter percentile of TPOT and E2E (> 1: faster with the drafter); None where either
    side is missing."""

    tpot_p50: float | None = None
    tpot_p95: float | None = None
    tpot_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p95: float | None = None
    e2e_p99: float | None = None


@dataclass(config=_STRICT)
class CategoryRow:
    """One category x n x concurrency of a SPEED-Bench run: its dataset's τ (token- and request-weighted) and
    speedup."""

    category: str
    dataset: str
    num_speculative_tokens: int
    concurrency: int
    prompts: int
    tau: float | None
    request_tau: float | None
    speedup: float | None
    speedup_reliable: bool = True  # False: the run's ``unreliable`` lists why the speedup is not to be trusted


def per_request_of(stats: RunStats) -> PerRequest | None:
    """:class:`PerRequest` of one run (None when the backend reported neither request counters nor timings)."""
    taus = stats.request_taus
    if taus is None and stats.latency_s is None:
        return None
    out = PerRequest()
    if taus is not None and any(d for d in stats.request_drafts or []):
        out.tau = taus
        out.accepted_per_step = [a / d if d else None for d, a in zip(stats.request_drafts, stats.request_accepted)]
    if stats.latency_s is not None:
        out.e2e_ms = [lat * 1000 for lat in stats.latency_s]
        if stats.ttft_s is not None:
            out.ttft_ms = [t * 1000 for t in stats.ttft_s]
            out.tpot_ms = [(lat - t) / (len(o) - 1) * 1000 if len(o) > 1 else None
                           for o, t, lat in zip(stats.outputs, stats.ttft_s, stats.latency_s)]
    return out


def request_weighted_tau(per_request: PerRequest | None) -> float | None:
    """Mean of the per-request τ (requests without drafted steps left out); None when there is none."""
    vals = [t for t in (per_request.tau if per_request else []) if t is not None]
    return sum(vals) / len(vals) if vals else None


def latency_speedup(baseline, drafter) -> LatencySpeedup | None:
    """Baseline / drafter of each TPOT and E2E percentile of two ``Latency`` objects (None: either untimed)."""
    if baseline is None or drafter is None:
        return None

    def ratio(key: str) -> float | None:
        b, d = getattr(baseline, key), getattr(drafter, key)
        return b / d if b is not None and d else None

    return LatencySpeedup(**{f"{m}_p{q}": ratio(f"{m}_p{q}_ms") for m in ("tpot", "e2e") for q in PERCENTILES})


def mean_latency_speedup(items: list[LatencySpeedup | None]) -> LatencySpeedup | None:
    """Unweighted mean of each field over datasets (None when no dataset has one)."""
    items = [x for x in items if x is not None]
    if not items:
        return None
    out = {}
    for key in LatencySpeedup.__dataclass_fields__:
        vals = [getattr(x, key) for x in items if getattr(x, key) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    return LatencySpeedup(**out)


def category_of(source: str) -> str | None:
    """The SPEED-Bench category a dataset's ``source`` names (``... category X``), else None."""
    return source.rsplit(_CATEGORY_MARK, 1)[1] if source.startswith("speed-bench:") and _CATEGORY_MARK in source \
        else None


def category_rows(datasets) -> list[CategoryRow]:
    """The per-category matrix: one row per SPEED-Bench category dataset x n x concurrency (``[]`` without one)."""
    rows = []
    for ds in datasets:
        cat = category_of(ds.source)
        if cat is None:
            continue
        for r in sorted(ds.runs, key=lambda r: (r.concurrency, r.num_speculative_tokens)):
            rows.append(CategoryRow(category=cat, dataset=ds.name, num_speculative_tokens=r.num_speculative_tokens,
                                    concurrency=r.concurrency, prompts=r.prompts, tau=r.tau,
                                    request_tau=r.request_tau, speedup=r.speedup, speedup_reliable=r.reliable))
    return rows
