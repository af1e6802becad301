"""The arithmetic of the results file: :class:`~dsparkhub.verify.stats.RunStats` (baseline, drafter at n, each
at every concurrency and every repeat) into the published numbers of :mod:`dsparkhub.verify.results.schema`, the
reliability verdict of each timed figure, the summary means and the best n per concurrency.

Metric definitions (FORMATS.md §8, vLLM 0.32 ``v1/spec_decode/metrics.py``, ``vllm/benchmarks/serve.py``):

- acceptance length τ = 1 + num_accepted_tokens / num_drafts (includes the bonus token);
- per-position acceptance[k] = accepted_per_pos[k] / num_drafts, *unconditional* (vLLM's convention: the share of
  steps whose first k + 1 drafts were all accepted; non-increasing);
- conditional acceptance[k] = accepted_per_pos[k] / accepted_per_pos[k - 1] (k = 0: / num_drafts): the chance that
  draft k is accepted given every earlier one was;
- draft tokens per step = num_draft_tokens / num_drafts (< n when a confidence threshold truncates proposals);
- tokens/s = total output tokens of all requests / wall seconds of the whole run, at the run's concurrency (at
  concurrency c up to c requests are in flight; the next starts when one ends, as ``vllm bench serve
  --max-concurrency`` drives a server);
- per-user tokens/s = one request's output tokens / its end-to-end seconds; TTFT = seconds from the request's start
  to its first token; TPOT = (end-to-end - TTFT) / (output tokens - 1) (vLLM ``benchmarks/serve.py``); percentiles
  over every request of every repeat (p50 / p95 / p99 of TPOT and E2E); per-request τ, the request-weighted τ and
  the percentile speedups: :mod:`dsparkhub.verify.results.per_request`;
- speedup = tokens/s with the drafter / tokens/s without it, same prompts, same settings, same concurrency; with
  ``repeats`` > 1 baseline and drafter runs are interleaved (baseline, n1, n2, ..., baseline, n1, ...) and the
  speedup is the median of the per-repeat ratios;
- a timed figure is *unreliable* (``unreliable`` lists why) when the per-repeat speedups spread by more than
  ``settings.spread_limit`` of their median, or when at concurrency 1 the speedup exceeds τ, which the latency law
  L = (T_draft + T_verify) / τ forbids (T_verify of n + 1 tokens is never below one baseline step); unreliable
  figures never choose a best n;
- lossless = with temperature 0 every prompt's output is token-identical with and without the drafter at the same
  concurrency, in every repeat (``null`` when temperature > 0);
- summary means are *unweighted* over datasets (each dataset counts once whatever its prompt count), as the
  published tables quoted in FORMATS.md §9 are.

"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from datetime import datetime, timezone

from dsparkhub import __version__
from dsparkhub.errors import ResultsError
from dsparkhub.verify.results.per_request import (category_rows, latency_speedup, mean_latency_speedup,
                                                  per_request_of, request_weighted_tau)
from dsparkhub.verify.results.schema import (METHODS, Baseline, BaselineRef, Change, DatasetResult, EngineInfo,
                                             Latency, LoadRow, Mismatch, ModelRef, RunResult, Settings, SummaryRow,
                                             VerifyResults)
from dsparkhub.verify.stats import RunStats


def first_mismatch(expected: list[list[int]], found: list[list[int]]) -> Mismatch | None:
    """The first token where ``found`` differs from ``expected`` (prompt by prompt), or None when identical.

    Args:
        expected: generated token ids per prompt without the drafter.
        found: generated token ids per prompt with the drafter.

    Raises:
        ResultsError: the two runs did not cover the same number of prompts.
    """
    if len(expected) != len(found):
        raise ResultsError(f"the baseline generated for {len(expected)} prompts but the drafter run for "
                           f"{len(found)}; both runs must use the same prompts")
    for i, (a, b) in enumerate(zip(expected, found)):
        if a == b:
            continue
        pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return Mismatch(prompt_index=i, position=pos, expected=a[pos] if pos < len(a) else None,
                        found=b[pos] if pos < len(b) else None)
    return None


def conditional_acceptance(accepted_per_pos: list[int], num_drafts: int) -> list[float]:
    """``accepted_per_pos[k] / accepted_per_pos[k - 1]`` (k = 0: ``/ num_drafts``); 0.0 where nothing survived."""
    out, prev = [], num_drafts
    for a in accepted_per_pos if num_drafts else []:
        out.append(a / prev if prev else 0.0)
        prev = a
    return out


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_of(repeats: list[RunStats]) -> Latency | None:
    """Per-request figures pooled over repeats (vLLM ``benchmarks/serve.py`` definitions), None when untimed."""
    per_user, tpot, ttft, e2e = [], [], [], []
    for st in repeats:
        if st.latency_s is None:
            continue
        for i, (out, lat) in enumerate(zip(st.outputs, st.latency_s)):
            first = st.ttft_s[i] if st.ttft_s is not None else None
            e2e.append(lat * 1000)
            if lat > 0:
                per_user.append(len(out) / lat)
            if first is not None:
                ttft.append(first * 1000)
                if len(out) > 1:
                    tpot.append((lat - first) / (len(out) - 1) * 1000)
    if not per_user and not ttft:
        return None
    return Latency(per_user_tokens_per_s_mean=sum(per_user) / len(per_user) if per_user else None,
                   per_user_tokens_per_s_p50=_percentile(per_user, 50), tpot_p50_ms=_percentile(tpot, 50),
                   tpot_p99_ms=_percentile(tpot, 99), ttft_p50_ms=_percentile(ttft, 50),
                   tpot_p95_ms=_percentile(tpot, 95), e2e_p50_ms=_percentile(e2e, 50),
                   e2e_p95_ms=_percentile(e2e, 95), e2e_p99_ms=_percentile(e2e, 99))


def _repeats(stats: RunStats | list[RunStats]) -> list[RunStats]:
    reps = [stats] if isinstance(stats, RunStats) else list(stats)
    if not reps:
        raise ResultsError("a configuration has no timed repeat")
    return reps


def build_baseline(stats: RunStats | list[RunStats], concurrency: int = 1, *, kind: str = "none",
                   plain: RunStats | None = None) -> Baseline:
    """:class:`Baseline` from the baseline's run(s): one RunStats per repeat (medians of the timings).

    Args:
        kind: the ``baseline.kind`` these runs measured (``none``: the target alone).
        plain: for a speculative baseline with greedy decoding, an untimed run of the target alone on the same
            prompts at the same concurrency; every repeat's outputs are checked against it (``lossless``).
    """
    reps = _repeats(stats)
    tps = [s.tokens_per_s for s in reps]
    mismatch = None
    for s in reps if plain is not None else []:
        mismatch = mismatch or first_mismatch(plain.outputs, s.outputs)
    return Baseline(prompts=len(reps[0].outputs), output_tokens=reps[0].output_tokens,
                    wall_s=float(statistics.median(s.wall_s for s in reps)), tokens_per_s=statistics.median(tps),
                    concurrency=concurrency, tokens_per_s_repeats=tps, latency=latency_of(reps), kind=kind,
                    lossless=(mismatch is None) if plain is not None else None, first_mismatch=mismatch,
                    per_request=per_request_of(reps[0]), tau=reps[0].tau if reps[0].num_drafts else None,
                    per_position_acceptance=reps[0].per_position_acceptance if reps[0].num_drafts else None)


def assess_run(run: RunResult, settings: Settings) -> list[str]:
    """Why a run's timed figures are unreliable (``[]`` when they are not): a wide spread of the per-repeat speedups,
    or, at concurrency 1, a speedup above τ, which the latency law L = (T_draft + T_verify) / τ rules out."""
    why = []
    if run.speedup_spread is not None and run.speedup_spread > settings.spread_limit:
        why.append(f"speedups of {len(run.speedup_repeats)} repeats spread by {run.speedup_spread:.0%} of their "
                   f"median (limit {settings.spread_limit:.0%})")
    if run.concurrency == 1 and run.speedup is not None and run.tau is not None and run.speedup > run.tau:
        why.append(f"batch-1 speedup {run.speedup:.2f}x exceeds τ {run.tau:.2f}, which the latency law "
                   "L = (T_draft + T_verify) / τ rules out: the timing was disturbed")
    return why


def build_run_result(n: int, spec: RunStats | list[RunStats], baseline: RunStats | list[RunStats], *,
                     check_lossless: bool, concurrency: int = 1, settings: Settings | None = None) -> RunResult:
    """Derive the published numbers of one configuration from its counters and the same dataset's baseline.

    Args:
        n: ``num_speculative_tokens`` of ``spec``.
        spec: the run(s) with the drafter, one per repeat (counters are taken from the first).
        baseline: the run(s) without the drafter on the same prompts at the same concurrency, one per repeat,
            repeat ``i`` timed next to ``spec[i]``.
        check_lossless: compare outputs token by token, every repeat (only meaningful for greedy decoding).
        concurrency: requests in flight during these runs.
        settings: for the spread limit of the reliability check (default limit when None).

    Raises:
        ResultsError: ``accepted_per_pos`` is not of length n, the runs covered different prompt counts, or the
            drafter and baseline repeat counts differ.
    """
    reps, base = _repeats(spec), _repeats(baseline)
    if len(reps) != len(base):
        raise ResultsError(f"{len(reps)} drafter repeats but {len(base)} baseline repeats at n={n}; each repeat "
                           "pairs a drafter run with the baseline run timed next to it")
    first = reps[0]
    if len(first.accepted_per_pos) != n:
        raise ResultsError(f"the backend returned accepted_per_pos of length {len(first.accepted_per_pos)} for "
                           f"num_speculative_tokens={n}; expected {n} entries (one per draft position)")
    mismatch = None
    if check_lossless:
        for s in reps:
            mismatch = mismatch or first_mismatch(base[0].outputs, s.outputs)
    tps = [s.tokens_per_s for s in reps]
    ratios = [s.tokens_per_s / b.tokens_per_s for s, b in zip(reps, base) if b.tokens_per_s > 0]
    speedup = statistics.median(ratios) if ratios else None
    spread = (max(ratios) - min(ratios)) / speedup if len(ratios) > 1 and speedup else None
    run = RunResult(
        num_speculative_tokens=n,
        prompts=len(first.outputs),
        output_tokens=first.output_tokens,
        wall_s=float(statistics.median(s.wall_s for s in reps)),
        num_drafts=first.num_drafts,
        num_draft_tokens=first.num_draft_tokens,
        num_accepted_tokens=first.num_accepted_tokens,
        accepted_per_pos=list(first.accepted_per_pos),
        tau=first.tau,
        per_position_acceptance=first.per_position_acceptance,
        draft_tokens_per_step=first.draft_tokens_per_step,
        tokens_per_s=statistics.median(tps),
        baseline_tokens_per_s=statistics.median(b.tokens_per_s for b in base),
        speedup=speedup,
        lossless=(mismatch is None) if check_lossless else None,
        first_mismatch=mismatch,
        concurrency=concurrency,
        conditional_acceptance=conditional_acceptance(first.accepted_per_pos, first.num_drafts),
        tokens_per_s_repeats=tps,
        speedup_repeats=ratios,
        speedup_spread=spread,
        latency=latency_of(reps),
        per_request=per_request_of(first),
        latency_speedup=latency_speedup(latency_of(base), latency_of(reps)),
    )
    run.request_tau = request_weighted_tau(run.per_request)
    run.unreliable = assess_run(run, settings or Settings(0.0, 1, 0, [n]))
    return run


def mean_of(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _verdict(verdicts: list[bool | None]) -> bool | None:
    return False if False in verdicts else (True if verdicts and all(v is True for v in verdicts) else None)


def summarize(datasets: list[DatasetResult], ns: list[int],
              concurrencies: list[int] | None = None) -> tuple[list[SummaryRow], Change | None]:
    """Unweighted means over datasets per (n, concurrency), and the change of the means from the smallest to the
    largest n at the lowest concurrency."""
    rows = []
    for c in concurrencies or [1]:
        for n in ns:
            runs = [(ds, r) for ds, r in ((ds, ds.run(n, c)) for ds in datasets) if r is not None]
            with_pos = [r for _, r in runs if r.per_position_acceptance]
            per_pos = [sum(r.per_position_acceptance[k] for r in with_pos) / len(with_pos)
                       for k in range(n)] if with_pos else []
            bases = [ds.baseline_at(c) for ds, _ in runs]
            rows.append(SummaryRow(
                num_speculative_tokens=n, concurrency=c, mean_tau=mean_of([r.tau for _, r in runs]),
                mean_speedup=mean_of([r.speedup for _, r in runs]), mean_per_position_acceptance=per_pos,
                lossless=_verdict([r.lossless for _, r in runs]),
                mean_tokens_per_s=mean_of([r.tokens_per_s for _, r in runs]),
                mean_baseline_tokens_per_s=mean_of([b.tokens_per_s for b in bases if b is not None]),
                mean_per_user_tokens_per_s=mean_of([r.latency.per_user_tokens_per_s_mean for _, r in runs
                                                  if r.latency is not None]),
                unreliable=[f"{ds.name}: {why}" for ds, r in runs for why in r.unreliable],
                mean_request_tau=mean_of([r.request_tau for _, r in runs]),
                mean_latency_speedup=mean_latency_speedup([r.latency_speedup for _, r in runs])))
    change = None
    first = [r for r in rows if r.concurrency == (concurrencies or [1])[0]]
    if len(first) >= 2:
        a, b = first[0], first[-1]
        change = Change(from_n=a.num_speculative_tokens, to_n=b.num_speculative_tokens,
                        tau_delta=b.mean_tau - a.mean_tau if None not in (a.mean_tau, b.mean_tau) else None,
                        speedup_delta=(b.mean_speedup - a.mean_speedup
                                       if None not in (a.mean_speedup, b.mean_speedup) else None))
    return rows, change


def load_rows(summary: list[SummaryRow], concurrencies: list[int]) -> tuple[list[LoadRow], int | None]:
    """Per concurrency the best n among *reliable* mean speedups (ties: the smaller n), and the lowest concurrency
    from which the drafter no longer pays (every higher concurrency included; None if it pays throughout or no
    speedup is reliable)."""
    rows = []
    for c in concurrencies:
        ok = [r for r in summary if r.concurrency == c and r.reliable and r.mean_speedup is not None]
        best = max(ok, key=lambda r: (r.mean_speedup, -r.num_speculative_tokens)) if ok else None
        rows.append(LoadRow(concurrency=c, best_n=best.num_speculative_tokens if best else None,
                            best_speedup=best.mean_speedup if best else None,
                            pays=None if best is None else best.mean_speedup > 1.0))
    stops = None
    for row in reversed(rows):
        if row.pays is False:
            stops = row.concurrency
        elif row.pays is True:
            break
    return rows, stops


def build_results(*, engine: EngineInfo, method: str, target: ModelRef, drafter: ModelRef, settings: Settings,
                  runs: list[tuple], date: str | None = None, warnings: list[str] | None = None,
                  incomplete: list[str] | None = None, baseline: BaselineRef | None = None,
                  plain: dict[str, dict[int, RunStats]] | None = None) -> VerifyResults:
    """Assemble a :class:`VerifyResults` from RunStats.

    Args:
        engine / method / target / drafter / settings: as in the schema.
        runs: per dataset ``(name, source, baselines, by_config)`` where ``baselines`` is ``{concurrency: [RunStats
            per repeat]}`` and ``by_config`` is ``{(n, concurrency): [RunStats per repeat]}``; the batch-1 shorthand
            ``(name, source, RunStats, {n: RunStats})`` means one repeat at concurrency 1. A configuration missing
            from ``by_config`` (it could not be measured) is left out.
        date: UTC ISO time; now when None.
        warnings: the warnings printed when the run started (stored as ``warnings``).
        incomplete: one sentence per configuration that could not be measured.
        baseline: what the ``baselines`` runs measured (None: no speculation).
        plain: for a speculative baseline, per dataset name and concurrency an untimed run of the target alone,
            against which the baseline's greedy outputs are checked (:func:`build_baseline`).

    Lossless verdicts are computed only when ``settings.temperature == 0``.

    Raises:
        ResultsError: a run's counters do not fit its n (see :func:`build_run_result`), or ``method`` is unknown.
    """
    if method not in METHODS:
        raise ResultsError(f"unknown method {method!r}, expected one of {', '.join(METHODS)}")
    greedy = settings.temperature == 0
    ns = sorted(settings.num_speculative_tokens)
    cs = sorted(settings.concurrency)
    settings = Settings(**{**asdict(settings), "num_speculative_tokens": ns, "concurrency": cs})
    datasets = []
    baseline = baseline or BaselineRef()
    plain = plain or {}
    for name, source, base, by_config in runs:
        if isinstance(base, RunStats):  # batch-1 shorthand
            base, by_config = {1: [base]}, {(n, 1): [s] for n, s in by_config.items()}
        datasets.append(DatasetResult(
            name=name, source=source,
            baselines=[build_baseline(base[c], c, kind=baseline.kind,
                                      plain=plain.get(name, {}).get(c) if greedy else None) for c in cs if c in base],
            runs=[build_run_result(n, by_config[n, c], base[c], check_lossless=greedy, concurrency=c,
                                   settings=settings)
                  for c in cs for n in ns if (n, c) in by_config and c in base]))
    summary, change = summarize(datasets, ns, cs)
    load, stops = load_rows(summary, cs)
    # a speculative baseline's own check counts too (a ``none`` baseline has none: its lossless is null)
    lossless = _verdict([r.lossless for ds in datasets for r in ds.runs] +
                        [b.lossless for ds in datasets for b in ds.baselines if b.lossless is not None])
    return VerifyResults(
        dsparkhub_version=__version__,
        date=date or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        method=method, engine=engine, target=target, drafter=drafter, settings=settings,
        datasets=datasets, summary=summary, change=change, lossless=lossless, warnings=list(warnings or []),
        load=load, stops_paying_at=stops, incomplete=list(incomplete or []), baseline=baseline,
        categories=category_rows(datasets),
    )


def no_acceptance(res: VerifyResults) -> str | None:
    """One line (no ``warning:`` prefix) when runs proposed draft tokens and the target accepted none at any
    position (τ 1.00, per-position acceptance all 0), else None.

    That is not a slow drafter but a broken one: NaN / Inf weights, a drafter of another target, a wrong layout;
    ``dsparkhub verify`` prints the line and stores it in ``warnings``, which the card lists.
    """
    runs = [(ds.name, r) for ds in res.datasets for r in ds.runs]
    dead = [(name, r) for name, r in runs if r.num_draft_tokens > 0 and r.num_accepted_tokens == 0]
    if not dead:
        return None
    where = ("in every run" if len(dead) == len(runs) else
             "in " + ", ".join(f"{name} n={r.num_speculative_tokens}" + (f" @{r.concurrency}" if r.concurrency != 1
                                                                        else "") for name, r in dead))
    proposed = sum(r.num_draft_tokens for _, r in dead)
    return (f"no draft token was accepted at any position {where} ({proposed} proposed, 0 accepted, τ 1.00): the "
            "drafter is broken, not slow: check its weights for NaN / Inf (`dsparkhub push` refuses them) and that "
            "it was trained for this target")
