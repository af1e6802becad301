"""Terminal rendering of a results file: the per-concurrency summary tables and the serving-load table that
``dsparkhub verify`` prints (library code never prints)."""

from __future__ import annotations

from dsparkhub.verify.results.derive import mean_of
from dsparkhub.verify.results.schema import LawRow, VerifyResults


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_summary_table(results: VerifyResults) -> str:
    """A line naming the baseline of every speedup (``... vs no speculation``), then a plain-text table per
    concurrency, dataset rows x n: ``τ / speedup / lossless``, plus the unweighted mean
    row; an unreliable speedup carries ``?`` and its reason is listed below; with several concurrencies, a load
    table (tokens/s, per-user tokens/s, TPOT, TTFT, best n) follows; with per-request figures, the token- vs
    request-weighted τ and TPOT / E2E percentile speedups (:func:`request_table`); with SPEED-Bench categories, the
    category matrix (:func:`category_table`); with step costs (reference engine) the
    latency-law table (:func:`law_table`).

    The CLI prints it after ``dsparkhub verify``; library code never prints.
    """
    ns = results.settings.num_speculative_tokens
    cs = results.settings.concurrency
    verdict = {True: "ok", False: "FAIL", None: "n/a"}
    out: list[str] = []
    reasons: list[str] = []
    out.append(f"speedups below are vs {results.baseline.label} (same prompts, same concurrency)")
    checked = [b.lossless for ds in results.datasets for b in ds.baselines if b.lossless is not None]
    if checked:  # a speculative baseline: its own greedy outputs against the target alone
        out.append(f"baseline {results.baseline.label} lossless against the target alone: "
                   f"{'ok' if all(checked) else 'FAIL'}")
    taus = [f"{ds.name} {b.tau:.2f}" + (f" @{b.concurrency}" if len(results.settings.concurrency) > 1 else "")
            for ds in results.datasets for b in ds.baselines if b.tau is not None]
    if taus:  # a speculative baseline's own acceptance length
        out.append(f"baseline {results.baseline.label} tau: {', '.join(taus)}")
    for c in cs:
        head = ["dataset" if len(cs) == 1 else f"dataset @ concurrency {c}"] + \
            [f"n={n}: tau / speedup / lossless" for n in ns]
        rows = []
        for ds in results.datasets:
            cells = [ds.name]
            for n in ns:
                r = ds.run(n, c)
                if r is not None and r.unreliable:
                    reasons += [f"? {ds.name} n={n} concurrency {c}: {why}" for why in r.unreliable]
                cells.append("-" if r is None else f"{_fmt(r.tau)} / {_fmt(r.speedup, '.2f', 'x')}"
                             f"{'?' if r.unreliable else ''} / {verdict[r.lossless]}")
            rows.append(cells)
        mean = ["mean (unweighted)"]
        for row in results.summary_at(c):
            mean.append(f"{_fmt(row.mean_tau)} / {_fmt(row.mean_speedup, '.2f', 'x')}"
                        f"{'?' if row.unreliable else ''} / {verdict[row.lossless]}")
        rows.append(mean)
        out += _table(head, rows) + [""]
    if len(cs) > 1 or any(b.latency for ds in results.datasets for b in ds.baselines):
        out += _table(*load_table(results)) + [""]
    if any(r.mean_request_tau is not None or r.mean_latency_speedup is not None for r in results.summary):
        out += _table(*request_table(results)) + [""]
    if results.categories:
        out += _table(*category_table(results)) + [""]
    if results.step_costs is not None and results.step_costs.law:
        out += law_table(results.step_costs.law) + [""]
    out += reasons
    for row in results.load:
        out.append(f"concurrency {row.concurrency}: best n = {row.best_n if row.best_n is not None else '-'}"
                   + ("" if row.best_n is not None else " (no reliable speedup)"))
    if results.stops_paying_at is not None:
        out.append(f"the drafter does not pay from concurrency {results.stops_paying_at} on")
    out += [f"incomplete: {line}" for line in results.incomplete]
    return "\n".join(out).rstrip()


def law_table(law: list[LawRow]) -> list[str]:
    """The latency law beside the measured speedup, one line per (n, concurrency): median ms per steady step
    (every request in flight) of the target alone, drafting and verifying, τ, the predicted speedup T_target x τ /
    (T_draft + T_verify) with its spread (the steps' quartiles), the ceiling (every draft accepted), the measured
    speedup (with the repeats' range), and a note for a figure above its ceiling or well below its prediction."""
    head = ["n", "conc", "T_target ms", "T_draft ms", "T_verify ms", "tau", "predicted (spread)", "ceiling",
            "measured", "note"]
    rows = []
    for r in law:
        measured = f"{r.measured:.2f}x" + (f" ({r.measured_spread[0]:.2f}-{r.measured_spread[1]:.2f})"
                                            if len(r.measured_spread) == 2 else "")
        rows.append([str(r.num_speculative_tokens), str(r.concurrency), f"{r.t_target_s * 1e3:.2f}",
                     f"{r.t_draft_s * 1e3:.2f}", f"{r.t_verify_s * 1e3:.2f}", f"{r.tau:.2f}",
                     f"{r.predicted:.2f}x ({r.spread[0]:.2f}-{r.spread[1]:.2f})", f"{r.ceiling:.2f}x",
                     ("! " if r.flag == "above ceiling" else "") + measured,
                     f"{r.flag}: {r.note}" if r.flag else ""])
    return ["latency law L = (T_draft + T_verify) / tau, per steady step (every request in flight)"] + \
        _table(head, rows)


def load_table(results: VerifyResults) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the serving-load view: per concurrency and configuration (baseline, each n) the unweighted
    means over datasets of total tokens/s, per-user tokens/s (mean), TPOT p50 / p99, TTFT p50 (ms), τ and speedup."""
    head = ["concurrency", "config", "tok/s", "user tok/s", "TPOT p50/p99 ms", "TTFT p50 ms", "tau",
            results.speedup_label]
    rows = []

    def lat(items, key):
        return mean_of([getattr(x.latency, key) for x in items if x is not None and x.latency is not None])

    for c in results.settings.concurrency:
        bases = [ds.baseline_at(c) for ds in results.datasets]
        rows.append([str(c), "baseline", _fmt(mean_of([b.tokens_per_s for b in bases if b]), ".1f"),
                     _fmt(lat(bases, "per_user_tokens_per_s_mean"), ".1f"),
                     f"{_fmt(lat(bases, 'tpot_p50_ms'), '.1f')} / {_fmt(lat(bases, 'tpot_p99_ms'), '.1f')}",
                     _fmt(lat(bases, "ttft_p50_ms"), ".1f"), "-", "1.00x"])
        for row in results.summary_at(c):
            runs = [ds.run(row.num_speculative_tokens, c) for ds in results.datasets]
            rows.append([str(c), f"n={row.num_speculative_tokens}", _fmt(row.mean_tokens_per_s, ".1f"),
                         _fmt(lat(runs, "per_user_tokens_per_s_mean"), ".1f"),
                         f"{_fmt(lat(runs, 'tpot_p50_ms'), '.1f')} / {_fmt(lat(runs, 'tpot_p99_ms'), '.1f')}",
                         _fmt(lat(runs, "ttft_p50_ms"), ".1f"), _fmt(row.mean_tau),
                         _fmt(row.mean_speedup, ".2f", "x") + ("?" if row.unreliable else "")])
    return head, rows


def request_table(results: VerifyResults) -> tuple[list[str], list[list[str]]]:
    """(header, rows) per concurrency and n: token-weighted and request-weighted mean τ, and the speedups of TPOT
    and E2E at p50 / p95 / p99 (baseline percentile / drafter percentile; means over datasets)."""
    head = ["concurrency", "config", "tau token-weighted", "tau request-weighted", "TPOT p50/p95/p99 speedup",
            "E2E p50/p95/p99 speedup"]
    rows = []
    for row in results.summary:
        ls = row.mean_latency_speedup

        def trio(m):
            return "-" if ls is None else " / ".join(_fmt(getattr(ls, f"{m}_p{q}"), ".2f", "x") for q in (50, 95, 99))

        rows.append([str(row.concurrency), f"n={row.num_speculative_tokens}", _fmt(row.mean_tau),
                     _fmt(row.mean_request_tau), trio("tpot"), trio("e2e")])
    return head, rows


def category_table(results: VerifyResults) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the SPEED-Bench category matrix: per category, one ``τ / speedup`` cell per (n,
    concurrency); an unreliable speedup carries ``?`` (its reason is listed under the summary table)."""
    keys = sorted({(r.concurrency, r.num_speculative_tokens) for r in results.categories})
    head = ["category"] + [f"n={n} @{c}: tau / speedup" for c, n in keys]
    cells: dict[str, dict] = {}
    for r in results.categories:
        cells.setdefault(r.category, {})[r.concurrency, r.num_speculative_tokens] = \
            f"{_fmt(r.tau)} / {_fmt(r.speedup, '.2f', 'x')}{'' if r.speedup_reliable else '?'}"
    return head, [[cat] + [by.get(k, "-") for k in keys] for cat, by in cells.items()]
