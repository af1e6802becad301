"""Comparing drafters of one target from their ``dsparkhub verify`` results files: the two seed tables.

This module owns ``dsparkhub compare R1.json R2.json ...`` and the comparison section of ``dsparkhub card ...
--compare FILE``. It reads :class:`~dsparkhub.verify.results.VerifyResults` (schema ``dsparkhub.verify.results/2``,
or /1 upgraded on reading) and derives, per target:

- **drafter rows** (Novita's table, FORMATS.md §9): per results file the mean speedup at n = 3 and at n = 7 and the
  change from the one to the other, at the file's lowest concurrency;
- **load rows** (LightSeek's Kimi K3 table): per concurrency and drafter, τ and total output tokens/s of the
  drafter's best reliable n there (the n with the highest reliable mean speedup; where none is reliable, the n
  with the highest mean tokens/s, marked ``?``), and the *crossover*: the lowest concurrency at which a drafter
  other than the one leading at the lowest shared concurrency gives at least its throughput.

Every mean is the file's own summary mean, i.e. *unweighted* over datasets (each dataset counts once whatever its
prompt count), as the seeds' tables are. It does not run engines, write files or print (the CLI prints
:func:`format_text`; the card embeds :func:`format_markdown`).

Two files are of the same target when both carry a target fingerprint and the fingerprints are equal, or (when
either has none) when their ``target.id`` are equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub.errors import ResultsError
from dsparkhub.verify.results.curves import tables as curve_tables
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import VerifyResults

#: the two n values of Novita's table
SEED_NS = (3, 7)


class CompareError(ResultsError):
    """Results files that cannot be compared (another target given to ``card --compare``, no file)."""


@dataclass(frozen=True)
class Source:
    """One results file and the label its rows carry (the drafter id, plus the file name where two files share
    a drafter id, e.g. the two arms of ``--adaptive-verification both``)."""

    path: str
    results: VerifyResults
    label: str


@dataclass(frozen=True)
class DrafterRow:
    """Novita's row: mean speedups (unweighted over datasets) at the lowest concurrency of one file.

    Attributes:
        label / method / backend: who was measured, and on what engine.
        speedup: ``{n: mean speedup}`` for n in :data:`SEED_NS`, None where that n was not measured.
        unreliable: the n values whose mean rests on a run marked unreliable.
        change: ``speedup[7] - speedup[3]`` (None if either is missing).
        concurrency: the concurrency these means were measured at.
        baseline: what the speedups are measured against (``BaselineRef.label``: ``no speculation``, ``DFlash n=7``).
    """

    label: str
    method: str
    backend: str
    speedup: dict[int, float | None]
    unreliable: tuple[int, ...]
    change: float | None
    concurrency: int
    baseline: str = "no speculation"


@dataclass(frozen=True)
class LoadCell:
    """LightSeek's cell: one drafter at one concurrency, at its best n there.

    Attributes:
        n: the n chosen (best reliable mean speedup; else highest mean tokens/s, ``reliable`` False).
        tau: mean acceptance length τ (bonus included), None when not counted.
        tokens_per_s: mean total output tokens/s with the drafter.
        speedup: mean speedup against the target alone at the same concurrency.
        reliable: False when no n at this concurrency had a reliable speedup.
    """

    n: int
    tau: float | None
    tokens_per_s: float | None
    speedup: float | None
    reliable: bool


@dataclass(frozen=True)
class Crossover:
    """Where the throughput lead changes hands: ``at`` the lowest concurrency where ``to`` gives at least the
    throughput of ``leader``, the drafter leading at ``from_concurrency``."""

    leader: str
    to: str
    from_concurrency: int
    at: int


@dataclass(frozen=True)
class TargetComparison:
    """Both seed tables for one target, and per file its throughput-curve tables
    (:func:`dsparkhub.verify.results.curves.tables`: matched throughput, SLA, best configuration)."""

    target: str
    rows: list[DrafterRow]
    concurrencies: list[int]
    load: dict[str, dict[int, LoadCell]]  # label -> concurrency -> cell
    crossover: Crossover | None
    curves: dict[str, list[tuple[str, list[str], list[list[str]]]]] = field(default_factory=dict)


# ---- reading ---------------------------------------------------------------------------------------------------


def same_target(a: VerifyResults, b: VerifyResults) -> bool:
    """True when two results files measured the same target (fingerprints when both have one, else ids)."""
    if a.target.fingerprint is not None and b.target.fingerprint is not None:
        return a.target.fingerprint == b.target.fingerprint
    return a.target.id == b.target.id


def _target_words(res: VerifyResults) -> str:
    fp = f" (fingerprint {res.target.fingerprint[:16]})" if res.target.fingerprint else ""
    return f"{res.target.id}{fp}"


def check_same_target(primary: VerifyResults, other: VerifyResults, path: str | Path) -> None:
    """Refuse a ``--compare`` file measured on another target than the card's results.

    Raises:
        CompareError: one paragraph naming both targets and the file.
    """
    if same_target(primary, other):
        return
    raise CompareError(
        f"{path} was measured on target {_target_words(other)}, but this card's results were measured on target "
        f"{_target_words(primary)}; a drafter comparison only means something on one target, the same prompts and "
        "the same engine, so the file was not compared", path=path,
        hint="pass --compare files from `dsparkhub verify` runs on the card's target, or compare across targets "
             "with `dsparkhub compare`, which prints one table per target")


def load_sources(paths: list[str | Path]) -> list[Source]:
    """Load results files and label them (drafter id; ``id [file name]`` where ids repeat).

    Raises:
        CompareError: no file given.
        FileNotFoundError / ResultsError: a file is missing or malformed (see ``read_results``).
    """
    if not paths:
        raise CompareError("nothing to compare: give at least one results file from `dsparkhub verify`")
    loaded = [(str(p), read_results(p)) for p in paths]
    return label_sources(loaded)


def label_sources(loaded: list[tuple[str, VerifyResults]]) -> list[Source]:
    """:class:`Source` for each ``(path, results)``: the drafter id, with the file name where ids repeat."""
    ids = [r.drafter.id for _, r in loaded]
    return [Source(p, r, r.drafter.id if ids.count(r.drafter.id) == 1 else f"{r.drafter.id} [{Path(p).name}]")
            for p, r in loaded]


# ---- the tables --------------------------------------------------------------------------------------------------


def drafter_row(src: Source, ns: tuple[int, ...] = SEED_NS) -> DrafterRow:
    """Novita's row for one file: summary means at its lowest concurrency."""
    res = src.results
    c = res.settings.concurrency[0] if res.settings.concurrency else 1
    by_n = {row.num_speculative_tokens: row for row in res.summary_at(c)}
    speedup = {n: by_n[n].mean_speedup if n in by_n else None for n in ns}
    a, b = speedup[ns[0]], speedup[ns[-1]]
    return DrafterRow(label=src.label, method=res.method, backend=res.engine.backend, speedup=speedup,
                      unreliable=tuple(n for n in ns if n in by_n and not by_n[n].reliable),
                      change=b - a if a is not None and b is not None else None, concurrency=c,
                      baseline=res.baseline.label)


def load_cell(res: VerifyResults, concurrency: int) -> LoadCell | None:
    """The drafter's cell at ``concurrency``: the results' best n there
    (:meth:`~dsparkhub.verify.results.schema.VerifyResults.best_n`: the best reliable speedup, else the highest mean
    τ, marked unreliable); None when nothing was measured at that concurrency."""
    rows = res.summary_at(concurrency) if concurrency in res.settings.concurrency else []
    if not rows:
        return None
    n, reliable = res.best_n(concurrency)
    row = next(r for r in rows if r.num_speculative_tokens == n)
    return LoadCell(n=row.num_speculative_tokens, tau=row.mean_tau, tokens_per_s=row.mean_tokens_per_s,
                    speedup=row.mean_speedup, reliable=reliable)


def crossover(load: dict[str, dict[int, LoadCell]], concurrencies: list[int]) -> Crossover | None:
    """The lowest concurrency at which another drafter gives at least the throughput of the one leading at the
    lowest concurrency two or more drafters share; None with one drafter, or when the leader keeps its lead."""
    shared = [c for c in concurrencies
              if sum(1 for cells in load.values() if c in cells and cells[c].tokens_per_s is not None) >= 2]
    if not shared:
        return None
    first = shared[0]
    leader = max((lab for lab, cells in load.items() if first in cells and cells[first].tokens_per_s is not None),
                 key=lambda lab: load[lab][first].tokens_per_s)
    for c in shared[1:]:
        lead = load[leader].get(c)
        if lead is None or lead.tokens_per_s is None:
            continue
        rivals = [(cells[c].tokens_per_s, lab) for lab, cells in load.items()
                  if lab != leader and c in cells and cells[c].tokens_per_s is not None]
        best = max(rivals, default=None)
        if best is not None and best[0] >= lead.tokens_per_s:
            return Crossover(leader=leader, to=best[1], from_concurrency=first, at=c)
    return None


def compare(sources: list[Source], ns: tuple[int, ...] = SEED_NS,
            slas: tuple[float, ...] = ()) -> list[TargetComparison]:
    """Group the files by target (in order of first appearance) and build both tables for each target, plus each
    file's throughput-curve tables with an SLA row per entry of ``slas`` (per-user tokens/s)."""
    groups: list[list[Source]] = []
    for src in sources:
        group = next((g for g in groups if same_target(g[0].results, src.results)), None)
        if group is None:
            groups.append([src])
        else:
            group.append(src)
    out = []
    for group in groups:
        cs = sorted({c for s in group for c in s.results.settings.concurrency})
        load = {s.label: {c: cell for c in cs for cell in [load_cell(s.results, c)] if cell is not None}
                for s in group}
        out.append(TargetComparison(target=group[0].results.target.id, rows=[drafter_row(s, ns) for s in group],
                                    concurrencies=cs, load=load, crossover=crossover(load, cs),
                                    curves={s.label: curve_tables(s.results, slas) for s in group}))
    return out


# ---- rendering ---------------------------------------------------------------------------------------------------


def _f(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}x"


def _tables(cmp: TargetComparison, ns: tuple[int, ...]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of both tables of one target."""
    head = ["drafter", "method", "engine", "speedup vs"] + [f"speedup n={n}" for n in ns] + \
        [f"change n={ns[0]}->{ns[-1]}"]
    rows = [[r.label, r.method, r.backend, r.baseline]
            + [_f(r.speedup[n], ".2f", "x") + ("?" if n in r.unreliable else "") for n in ns] + [_signed(r.change)]
            for r in cmp.rows]
    at = sorted({r.concurrency for r in cmp.rows})
    first = (f"Mean speedup (unweighted over datasets) at concurrency {', '.join(map(str, at))}", head, rows)
    lhead = ["concurrency"] + [f"{lab}: tau / tok/s (n)" for lab in cmp.load]
    lrows = []
    for c in cmp.concurrencies:
        cells = [str(c)]
        for lab in cmp.load:
            cell = cmp.load[lab].get(c)
            cells.append("-" if cell is None else f"{_f(cell.tau)} / {_f(cell.tokens_per_s, '.1f')} (n={cell.n})"
                         + ("" if cell.reliable else "?"))
        lrows.append(cells)
    second = ("τ and total output tokens/s per concurrency, each drafter at its best reliable n there", lhead, lrows)
    return [first, second] + [(f"{lab}: {title}", head, rows)
                              for lab, tabs in cmp.curves.items() for title, head, rows in tabs]


def _crossover_line(cmp: TargetComparison) -> str:
    x = cmp.crossover
    if x is not None:
        return (f"crossover: {x.to} matches or passes {x.leader} (the leader at concurrency {x.from_concurrency}) "
                f"from concurrency {x.at}")
    if len(cmp.load) < 2:
        return "crossover: one drafter, nothing to cross"
    return "crossover: none measured (the throughput leader keeps its lead at every shared concurrency)"


def _text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


_UNRELIABLE_NOTE = "? = rests on a figure `dsparkhub verify` marked unreliable (wide spread, or speedup above τ)"


def format_text(comparisons: list[TargetComparison], ns: tuple[int, ...] = SEED_NS) -> str:
    """Plain-text tables, one block per target (``dsparkhub compare`` prints it)."""
    out: list[str] = []
    for cmp in comparisons:
        out.append(f"target {cmp.target}")
        for title, head, rows in _tables(cmp, ns):
            out += [title] + _text_table(head, rows) + [""]
        out += [_crossover_line(cmp), ""]
    if "?" in "\n".join(out):
        out.append(_UNRELIABLE_NOTE)
    return "\n".join(out).rstrip()


def format_markdown(comparisons: list[TargetComparison], ns: tuple[int, ...] = SEED_NS) -> str:
    """Markdown of the same tables for the model card (``card --compare``): a heading per target."""
    out = ["## Comparison with other drafters", ""]
    for cmp in comparisons:
        out += [f"Target `{cmp.target}`.", ""]
        for title, head, rows in _tables(cmp, ns):
            out += [f"{title}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
        out += [_crossover_line(cmp)[0].upper() + _crossover_line(cmp)[1:] + ".", ""]
    if "?" in "\n".join(out):
        out += [_UNRELIABLE_NOTE[0].upper() + _UNRELIABLE_NOTE[1:] + ".", ""]
    return "\n".join(out).rstrip() + "\n"


def read_compare(primary: VerifyResults, compare_paths: list[str | Path]) -> list[tuple[str, VerifyResults]]:
    """Read the card's ``--compare`` files, each checked to be of ``primary``'s target.

    Returns:
        ``(path, results)`` per file, in the order given.

    Raises:
        CompareError: a ``--compare`` file measured another target (one paragraph naming both and the file).
        FileNotFoundError / ResultsError: a ``--compare`` file is missing or malformed.
    """
    others = [(str(p), read_results(p)) for p in compare_paths]
    for path, res in others:
        check_same_target(primary, res, path)
    return others


def card_section(primary: list[tuple[str, VerifyResults]], others: list[tuple[str, VerifyResults]],
                 slas: tuple[float, ...] = ()) -> str:
    """The card's comparison markdown: the card's own results first, then each ``--compare`` file
    (:func:`read_compare`), all of the card's target.

    Args:
        primary: ``(path, results)`` of the card's ``--results`` files (already checked by the card).
        others: ``(path, results)`` of the ``--compare`` files, as :func:`read_compare` returns them.
    """
    return format_markdown(compare(label_sources(list(primary) + list(others)), slas=slas))
