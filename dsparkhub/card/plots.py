"""The card's matplotlib plots (acceptance per position, speedup per n, speedup vs concurrency, per-user vs total
tokens/s) and their file
names under ``assets/``. Does not decide what the card says (``dsparkhub.card.tables``).
"""

from __future__ import annotations

from pathlib import Path

from dsparkhub.card.facts import public_text
from dsparkhub.card.tables import METHOD_LABELS, engine_label, is_reference
from dsparkhub.verify.results.curves import curves
from dsparkhub.verify.results.schema import VerifyResults


ASSETS_DIR = "assets"


def plot_acceptance(res: VerifyResults, path: Path, *, target: str | None = None) -> Path:
    """PNG: mean cumulative per-position acceptance (unweighted over datasets) vs draft position k, one line per n:
    the share of verify steps whose first k draft tokens were all accepted (``per_position_acceptance``), hence
    falling with k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    for row in res.summary_at():
        if row.mean_per_position_acceptance:
            xs = list(range(1, len(row.mean_per_position_acceptance) + 1))
            ax.plot(xs, row.mean_per_position_acceptance, marker="o", label=f"n={row.num_speculative_tokens}")
    ax.set_xticks(range(1, max(res.settings.num_speculative_tokens) + 1))
    ax.set_xlabel("draft position k")
    ax.set_ylabel("share of steps with the first k drafts all accepted\n(mean over datasets)")
    ax.set_ylim(-0.03, 1.05)
    ax.set_title(_plot_title("Cumulative acceptance", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save_png(fig, path)


def plot_speedup(res: VerifyResults, path: Path, *, target: str | None = None) -> Path:
    """PNG: speedup vs num_speculative_tokens at the lowest concurrency, one line per dataset (error bars: the
    lowest and highest of the timed repeats' speedups, when repeated) plus the unweighted mean when there are several
    datasets; unreliable timings hollow (the legend says so). The y axis spans the data and 1x with a margin (:func:`_speedup_limits`), not a fixed 0-based range
    that flattens small differences into a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    low = res.settings.concurrency[0]
    values, any_bad = [], False
    for ds in res.datasets:
        runs = [r for r in ds.runs if r.speedup is not None and r.concurrency == low]
        if not runs:
            continue
        ys = [r.speedup for r in runs]
        err = [[y - min(r.speedup_repeats or [y]) for y, r in zip(ys, runs)],
               [max(r.speedup_repeats or [y]) - y for y, r in zip(ys, runs)]]
        bar = ax.errorbar([r.num_speculative_tokens for r in runs], ys, yerr=err if any(map(any, err)) else None,
                          marker="o", capsize=4, label=ds.name)
        bad = [r for r in runs if not r.reliable]
        if bad:
            any_bad = True
            ax.plot([r.num_speculative_tokens for r in bad], [r.speedup for r in bad], marker="o",
                    linestyle="none", markerfacecolor="white", color=bar.lines[0].get_color(), zorder=3)
        values += ys + [v for r in runs for v in r.speedup_repeats]
    mean = [(r.num_speculative_tokens, r.mean_speedup) for r in res.summary_at() if r.mean_speedup is not None]
    if mean and len(res.datasets) > 1:  # with one dataset the mean is that dataset's line
        ax.plot(*zip(*mean), marker="s", color="black", linestyle="--", label="mean over datasets")
    if any_bad:  # a legend entry for the hollow markers, drawn nowhere
        ax.plot([], [], marker="o", linestyle="none", markerfacecolor="white", color="grey",
                label="hollow: unreliable timing")
    ax.axhline(1.0, color="grey", linewidth=0.8, label="target alone (1x)")
    ax.set_xticks(res.settings.num_speculative_tokens)
    ax.set_xlabel("num_speculative_tokens")
    ax.set_ylabel(res.speedup_label + (" (CPU reference engine)" if is_reference(res) else ""))
    ax.set_ylim(*_speedup_limits(values))
    repeats = res.settings.repeats
    ax.set_title(_plot_title("Speedup" + (f" (bars: range of {repeats} timed repeats)" if repeats > 1 else ""),
                             res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def _speedup_limits(values: list[float]) -> tuple[float, float]:
    """y-axis limits for speedups: the data and the 1x line, with a tenth of the span (at least 0.05x) as margin,
    never below 0."""
    lo, hi = min(values + [1.0]), max(values + [1.0])
    pad = max(0.05, 0.1 * (hi - lo))
    return max(0.0, lo - pad), hi + pad


#: plot size in inches and resolution: 1350 x 825 pixels, legible on a Hub model page
PLOT_SIZE, PLOT_DPI = (9, 5.5), 150


def _drafter_name(res: VerifyResults) -> str:
    """A compared drafter's legend name: its method label and public id (a local path is not shown on a card)."""
    return f"{METHOD_LABELS.get(res.method, res.method)} {public_text(res.drafter.id)}"


def _plot_title(what: str, res: VerifyResults, target: str | None = None) -> str:
    """Two lines: what is plotted for which drafter and target (``target``: the card's name for it, e.g. its Hub
    id; default the results' ``target.id``), then the engine and the datasets."""
    datasets = ", ".join(ds.name for ds in res.datasets)
    return (f"{what}: {METHOD_LABELS.get(res.method, res.method)} drafter {public_text(res.drafter.id)} "
            f"on {target or public_text(res.target.id)}\n{engine_label(res)}; datasets: {datasets}")


def plot_speedup_vs_concurrency(res: VerifyResults, path: Path, label: str | None = None,
                                others: list[VerifyResults] = (), *, target: str | None = None) -> Path:
    """PNG: mean speedup (unweighted over datasets) vs concurrency, one line per n; unreliable points hollow (the
    legend says so when there are any).

    ``others`` (further drafters' results) add one line each at their own best n per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    any_bad = False
    for n in res.settings.num_speculative_tokens:
        rows = [r for r in res.summary if r.num_speculative_tokens == n and r.mean_speedup is not None]
        if not rows:
            continue
        line, = ax.plot([r.concurrency for r in rows], [r.mean_speedup for r in rows], marker="o",
                        label=f"{label + ' ' if label else ''}n={n}")
        bad = [r for r in rows if not r.reliable]
        if bad:
            any_bad = True
            ax.plot([r.concurrency for r in bad], [r.mean_speedup for r in bad], marker="o", linestyle="none",
                    markerfacecolor="white", color=line.get_color())
    for other in others:
        pts = [(row.concurrency, row.best_speedup) for row in other.load if row.best_speedup is not None]
        if pts:
            ax.plot(*zip(*pts), marker="s", linestyle="--", label=f"{_drafter_name(other)} (best n)")
    if any_bad:  # a legend entry for the hollow markers, drawn nowhere
        ax.plot([], [], marker="o", linestyle="none", markerfacecolor="white", color="grey",
                label="hollow: unreliable timing")
    ax.axhline(1.0, color="grey", linewidth=0.8, label="target alone (1x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(res.settings.concurrency, [str(c) for c in res.settings.concurrency])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(f"{res.speedup_label}, same concurrency")
    ax.set_ylim(*_speedup_limits([r.mean_speedup for r in res.summary if r.mean_speedup is not None]
                                 + [row.best_speedup for o in others for row in o.load
                                    if row.best_speedup is not None]))
    ax.set_title(_plot_title("Speedup at serving load", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def plot_pareto(res: VerifyResults, path: Path, *, others: list[VerifyResults] = (),
                target: str | None = None) -> Path:
    """PNG: per-user vs total output tokens/s over the concurrency sweep
    (:func:`dsparkhub.verify.results.curves.curves`), one line per n and the baseline drawn distinctly (black,
    dashed, square markers); each point is labelled with its concurrency. Up and to the right is better: the
    matched-throughput speedup is the vertical gap to the baseline's line at the same x.

    ``others`` (the card's ``--compare`` drafters, same target) add one dotted line per n each, labelled with the
    drafter's method and id (the card's own lines then carry its name too); their own baselines are not drawn again
    (the card's baseline is the reference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    for cv in curves(res):
        if not cv.points:
            continue
        xs, ys = [p.total_tokens_per_s for p in cv.points], [p.per_user_tokens_per_s for p in cv.points]
        style = ({"color": "black", "linestyle": "--", "marker": "s", "linewidth": 2, "zorder": 3} if cv.n is None
                 else {"marker": "o"})
        own = f"{_drafter_name(res)} {cv.label}" if others and cv.n is not None else cv.label  # whose n, beside others
        ax.plot(xs, ys, label=own, **style)
        for p in cv.points:
            ax.annotate(f"c={p.concurrency}", (p.total_tokens_per_s, p.per_user_tokens_per_s), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    for other in others:
        name = _drafter_name(other)
        for cv in curves(other):
            if cv.n is None or not cv.points:
                continue
            ax.plot([p.total_tokens_per_s for p in cv.points], [p.per_user_tokens_per_s for p in cv.points],
                    linestyle=":", marker="^", label=f"{name} {cv.label}")
    ax.set_xlabel("total output tokens/s (all requests)")
    ax.set_ylabel("per-user tokens/s (mean over requests)")
    ax.set_title(_plot_title("Per-user vs total throughput", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def _save_png(fig, path: Path) -> Path:
    """Lay out, write ``fig`` to ``path`` as PNG and free it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path




def plot_names(results: list[VerifyResults]) -> list[tuple[str, str, str]]:
    """Relative plot paths per results file (acceptance, speedup vs n, speedup vs concurrency, per-user vs total
    tokens/s): plain names for one file, ``_<backend>[_b...]`` for several."""
    if len(results) == 1:
        return [(f"{ASSETS_DIR}/acceptance_per_position.png", f"{ASSETS_DIR}/speedup_vs_n.png",
                 f"{ASSETS_DIR}/speedup_vs_concurrency.png", f"{ASSETS_DIR}/per_user_vs_total.png")]
    names, used = [], set()
    for res in results:
        tag = res.engine.backend.replace("-", "_")
        k = 0
        while (t := tag + ("" if k == 0 else "_" + chr(ord("a") + k))) in used:
            k += 1
        used.add(t)
        names.append((f"{ASSETS_DIR}/acceptance_per_position_{t}.png", f"{ASSETS_DIR}/speedup_vs_n_{t}.png",
                      f"{ASSETS_DIR}/speedup_vs_concurrency_{t}.png", f"{ASSETS_DIR}/per_user_vs_total_{t}.png"))
    return names
