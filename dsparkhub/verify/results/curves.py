"""Throughput curves of a concurrency sweep: per configuration (the baseline, each n) per-user tokens/s against total
output tokens/s, the per-user speedup at *matched total throughput*, the highest total throughput meeting a per-user
SLA, and the best configuration per concurrency with its margin.

Everything is derived from a :class:`~dsparkhub.verify.results.schema.VerifyResults` as it is stored (no new keys):

- a point of the curve of n at concurrency c = (``summary`` row's ``mean_tokens_per_s``, ``mean_per_user_tokens_per_s``);
  of the baseline = the unweighted means over datasets of ``baselines[c].tokens_per_s`` and
  ``baselines[c].latency.per_user_tokens_per_s_mean`` (the same unweighted mean the summary rows use);
- **matched throughput** (DeepSeek's V4 headline "per-user speed at matched throughput"): for a drafter point of total
  T, the baseline's per-user tokens/s at total T is interpolated *linearly* between the two measured baseline points
  whose totals bracket T (points in concurrency order). Linear, not log-linear: the Pareto plot draws those straight
  segments on linear axes, so the table reads off the plotted line, and two adjacent measured loads support no curve
  shape beyond the chord. Outside the baseline's measured totals nothing is extrapolated
  (:data:`BEYOND_RANGE`);
- **SLA** (``--sla-tokens-per-s``): along a curve in concurrency order, the highest total tokens/s at which per-user
  tokens/s is still at least the SLA: a measured point, or the point where a segment crosses the SLA (both
  coordinates and the concurrency interpolated linearly on that segment); :data:`NOT_MET` when no measured point
  meets it;
- **best configuration per concurrency**: read from the results' ``load`` rows (:meth:`VerifyResults.best_n`, not a
  third computation); the baseline is best where that n does not pay (mean speedup <= 1). The margin is the best
  speedup minus the runner-up's (reliable rows only, the baseline counting 1.0x); it is *within the measured spread*
  when the relative margin ``(best - second) / second`` does not exceed the largest ``speedup_spread`` of the runs
  behind either (the card's ``recommendation`` criterion; None with one repeat: no spread measured).

It does not read files or render cards (``compare`` / ``card`` do).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from dsparkhub.verify.results.schema import VerifyResults

#: what a matched-throughput cell says when the drafter's total lies outside the baseline's measured totals
BEYOND_RANGE = "beyond the baseline's measured range"
#: what an SLA cell says when no measured point of a configuration meets it
NOT_MET = "not met at any measured load"


@dataclass(frozen=True)
class Point:
    """One measured load of a configuration: ``concurrency`` requests in flight, total output tokens/s of all
    requests, and mean per-user tokens/s (one request's output tokens / its end-to-end seconds)."""

    concurrency: int
    total_tokens_per_s: float
    per_user_tokens_per_s: float


@dataclass(frozen=True)
class Curve:
    """Per-user vs total tokens/s of one configuration, ascending concurrency; ``n`` None for the baseline."""

    label: str
    n: int | None
    points: list[Point]


@dataclass(frozen=True)
class Matched:
    """A drafter point at matched total throughput: ``baseline_per_user_tokens_per_s`` is the baseline's per-user
    tokens/s interpolated at the drafter's total, ``speedup`` = drafter per-user / that; both None when the
    total lies outside the baseline's measured range (``note`` says so)."""

    n: int
    point: Point
    baseline_per_user_tokens_per_s: float | None
    speedup: float | None
    note: str | None


@dataclass(frozen=True)
class SlaPoint:
    """The highest total tokens/s of one configuration meeting a per-user SLA, at the (interpolated)
    ``concurrency``; all None when not met (``note`` = :data:`NOT_MET`)."""

    label: str
    sla_tokens_per_s: float
    total_tokens_per_s: float | None
    concurrency: float | None
    note: str | None


@dataclass(frozen=True)
class Best:
    """The configuration to serve with at one concurrency.

    Attributes:
        label: ``n=K`` or the baseline's label (``BaselineRef.label``: ``no speculation``, ``DFlash n=7``); ``speedup`` its mean speedup (1.0 for the baseline).
        runner_up / margin: the next configuration and ``speedup - runner-up speedup`` (None when alone).
        within_spread: the relative margin is at most the measured spread of the repeats (None: one repeat).
        reliable: False when no speedup at this concurrency was reliable (best n then by τ, as ``best_n``).
    """

    concurrency: int
    label: str
    speedup: float | None
    runner_up: str | None
    margin: float | None
    within_spread: bool | None
    reliable: bool


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def curves(res: VerifyResults) -> list[Curve]:
    """The baseline's curve first, then one per n; loads without a per-user figure (untimed) are left out."""
    cs = res.settings.concurrency
    base = []
    for c in cs:
        bs = [b for b in (ds.baseline_at(c) for ds in res.datasets) if b is not None]
        total = _mean([b.tokens_per_s for b in bs])
        user = _mean([b.latency.per_user_tokens_per_s_mean for b in bs
                      if b.latency is not None and b.latency.per_user_tokens_per_s_mean is not None])
        if total is not None and user is not None:
            base.append(Point(c, total, user))
    out = [Curve(res.baseline.label, None, base)]
    for n in res.settings.num_speculative_tokens:
        pts = [Point(r.concurrency, r.mean_tokens_per_s, r.mean_per_user_tokens_per_s)
               for c in cs for r in res.summary_at(c) if r.num_speculative_tokens == n
               and r.mean_tokens_per_s is not None and r.mean_per_user_tokens_per_s is not None]
        out.append(Curve(f"n={n}", n, pts))
    return out


def per_user_at(curve: Curve, total_tokens_per_s: float) -> float | None:
    """Per-user tokens/s of ``curve`` at ``total_tokens_per_s``, linear between the first two consecutive points
    (concurrency order) whose totals bracket it; None outside the measured totals (never extrapolated)."""
    pts = curve.points
    for p in pts:
        if p.total_tokens_per_s == total_tokens_per_s:
            return p.per_user_tokens_per_s
    for p, q in pairwise(pts):
        lo, hi = sorted((p.total_tokens_per_s, q.total_tokens_per_s))
        if lo <= total_tokens_per_s <= hi and hi > lo:
            f = (total_tokens_per_s - p.total_tokens_per_s) / (q.total_tokens_per_s - p.total_tokens_per_s)
            return p.per_user_tokens_per_s + f * (q.per_user_tokens_per_s - p.per_user_tokens_per_s)
    return None


def matched(res: VerifyResults) -> list[Matched]:
    """Every drafter point (ascending n, then concurrency) against the baseline at the same total tokens/s."""
    base, *drafters = curves(res)
    out = []
    for cv in drafters:
        for p in cv.points:
            b = per_user_at(base, p.total_tokens_per_s)
            out.append(Matched(cv.n, p, b, p.per_user_tokens_per_s / b if b else None,
                               None if b else BEYOND_RANGE))
    return out


def sla_point(curve: Curve, sla: float) -> SlaPoint:
    """The highest total tokens/s on ``curve`` with per-user tokens/s >= ``sla`` (see the module docstring)."""
    cands = [(p.total_tokens_per_s, float(p.concurrency)) for p in curve.points if p.per_user_tokens_per_s >= sla]
    for p, q in pairwise(curve.points):
        if (p.per_user_tokens_per_s - sla) * (q.per_user_tokens_per_s - sla) < 0:  # the segment crosses the SLA
            f = (p.per_user_tokens_per_s - sla) / (p.per_user_tokens_per_s - q.per_user_tokens_per_s)
            cands.append((p.total_tokens_per_s + f * (q.total_tokens_per_s - p.total_tokens_per_s),
                          p.concurrency + f * (q.concurrency - p.concurrency)))
    if not cands:
        return SlaPoint(curve.label, sla, None, None, NOT_MET)
    total, c = max(cands)
    return SlaPoint(curve.label, sla, total, c, None)


def largest_spread(res: VerifyResults, ns: set[int], c: int) -> float | None:
    """The largest ``speedup_spread`` ((max - min) / median of the per-repeat speedups) over the datasets' runs of
    ``ns`` at ``c``; None when one of them has none (one timed repeat: no spread measured)."""
    spreads = [r.speedup_spread for ds in res.datasets for r in ds.runs
               if r.concurrency == c and r.num_speculative_tokens in ns]
    return None if not spreads or None in spreads else max(spreads)


def best_per_concurrency(res: VerifyResults) -> list[Best]:
    """Per measured concurrency the best configuration (from ``best_n``; the baseline where that n does not pay)
    with its margin over the runner-up among the reliable configurations."""
    out = []
    for c in res.settings.concurrency:
        chosen = res.best_n(c)
        if chosen is None:
            continue
        n, reliable = chosen
        rows = {r.num_speculative_tokens: r for r in res.summary_at(c)}
        if reliable:  # best_n is the top reliable row; the baseline (1.0x) outranks it where it does not pay
            ranked = sorted([(r.mean_speedup, k) for k, r in rows.items() if r.reliable and r.mean_speedup is not None]
                            + [(1.0, None)], key=lambda x: -x[0])
        else:  # n chosen by τ (no reliable timing): the baseline is the only comparison left
            ranked = [(rows[n].mean_speedup, n), (1.0, None)]
        (sp, top), rest = ranked[0], ranked[1:]
        second = rest[0] if rest else None
        within = None
        if second is not None and sp is not None:
            spread = largest_spread(res, {k for k in (top, second[1]) if k is not None}, c)
            within = None if spread is None else (sp - second[0]) / second[0] <= spread
        out.append(Best(c, _label(res, top), sp, _label(res, second[1]) if second else None,
                        sp - second[0] if second and sp is not None else None, within, reliable))
    return out


def _label(res: VerifyResults, n: int | None) -> str:
    return res.baseline.label if n is None else f"n={n}"


# ---- tables (compare's text and markdown renderers lay them out) ---------------------------------------------------


def _num(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _at(c: float | None) -> str:
    return "-" if c is None else (f"{c:g}" if float(c).is_integer() else f"~{c:.1f}")


def tables(res: VerifyResults, slas: list[float] | tuple[float, ...] = (),
           best: bool = True) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` of the matched-throughput table, the SLA table (when ``slas``) and, when ``best``,
    the best configuration per concurrency; none when the results hold no timed per-user figure of the baseline at
    two or more concurrencies (no curve to interpolate along)."""
    cvs = curves(res)
    if len(cvs[0].points) < 2:
        return []
    base = res.baseline.label
    out = [(f"Per-user tokens/s at matched total throughput, against {base} (linear along its curve)",
            ["n", "concurrency", "total tok/s", "per-user tok/s", f"{base} per-user tok/s at that total",
             "per-user speedup"],
            [[str(m.n), str(m.point.concurrency), _num(m.point.total_tokens_per_s),
              _num(m.point.per_user_tokens_per_s), _num(m.baseline_per_user_tokens_per_s),
              m.note or _num(m.speedup, ".2f", "x")] for m in matched(res)])]
    if slas:
        head = ["configuration"] + [f"max total tok/s at >= {s:g} tok/s per user (concurrency)" for s in slas]
        rows = [[cv.label] + [p.note or f"{p.total_tokens_per_s:.1f} ({_at(p.concurrency)})"
                              for p in (sla_point(cv, s) for s in slas)] for cv in cvs]
        out.append(("Highest total throughput meeting a per-user SLA", head, rows))
    if not best:
        return out
    spread = {True: "yes", False: "no", None: "one repeat"}
    out.append(("Best configuration per concurrency (mean speedup; margin over the runner-up)",
                ["concurrency", "best", "speedup", "runner-up", "margin", "within measured spread"],
                [[str(b.concurrency), b.label + ("" if b.reliable else "?"), _num(b.speedup, ".2f", "x"),
                  b.runner_up or "-", _num(b.margin, "+.2f", "x"), spread[b.within_spread]]
                 for b in best_per_concurrency(res)]))
    return out
