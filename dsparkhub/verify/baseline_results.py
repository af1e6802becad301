"""``dsparkhub verify --baseline RESULTS.json[@n]``: speedups against another results file (issue 25).

A second ``verify --out`` file (another drafter, or no speculation) measured on the same target, engine and
version, prompts (dataset names and sources, which carry the sha256 of a local file), temperature, max_new_tokens
and concurrency values. Its comparison tokens/s per (dataset, concurrency) is:

- ``RESULTS.json@n``: that file's run at ``n`` draft tokens;
- ``RESULTS.json``: its best n per concurrency (:meth:`~dsparkhub.verify.results.schema.VerifyResults.best_n`,
  the n a user would serve with);
- ``RESULTS.json@0``: that file's own baseline run (its ``baselines``: no speculation, or that file's
  ``--baseline``, as its ``baseline`` records).

This run still measures its own drafter and its own no-speculation baseline (the lossless check needs it); only the
speedups are rebased on the file's numbers. The two were not interleaved, so each rebased run is marked
``unreliable`` (spreads of the two files are not comparable). ``BaselineRef.fingerprint`` is the file's sha256.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from dsparkhub.verify.results.schema import BaselineRef, VerifyResults
from dsparkhub.verify.settings import VerifyArgumentError

#: what a rebased run's ``unreliable`` says
NOT_INTERLEAVED = "baseline from another results file: not interleaved with this run, spreads not comparable"


@dataclass(frozen=True)
class BaselineFile:
    """A results file as baseline: its ``path``, the chosen ``n`` (None: best n per concurrency; 0: its own
    baseline run), the file read, and its sha256 (hex)."""

    path: str
    n: int | None
    results: VerifyResults
    sha256: str

    @property
    def ref(self) -> BaselineRef:
        """The :class:`BaselineRef` this run's results record (kind ``results``, id the file's name)."""
        return BaselineRef(kind="results", id=Path(self.path).name, n=self.n, fingerprint=self.sha256,
                           method=self.results.method)


def read_baseline_file(text: str) -> BaselineFile | None:
    """``PATH.json[@n]`` into a :class:`BaselineFile`; None when ``text`` does not name a ``.json`` file.

    Raises:
        VerifyArgumentError: ``@n`` not an integer >= 0.
        ResultsError: the file is not a valid results file (``read_results``'s message, naming the file).
    """
    from dsparkhub.verify.results.reading import read_results

    path, at, n = text.rpartition("@") if "@" in text and not Path(text).exists() else (text, "", "")
    if not path.endswith(".json") or not Path(path).is_file():
        return None
    if at and not n.isdigit():
        raise VerifyArgumentError(f"--baseline {text}: the part after @ must be the file's num_speculative_tokens "
                                  f"(0: its own baseline run), found {n!r}")
    data = Path(path).read_bytes()
    return BaselineFile(path=path, n=int(n) if at else None, results=read_results(path),
                        sha256=hashlib.sha256(data).hexdigest())


def differences(base: BaselineFile, *, target_fingerprint: str | None, target_id: str, backend: str,
                version: str | None, datasets: list[tuple[str, str]], temperature: float, max_new_tokens: int,
                concurrency: list[int]) -> list[str]:
    """Every way this run's setup differs from the baseline file's, one ``key: expected X, found Y`` each
    (expected: this run; found: the file). ``version`` None is not compared (not known before the engine loads)."""
    other = base.results
    out = []

    def differ(key: str, expected, found) -> None:
        if expected != found:
            out.append(f"{key}: expected {expected!r}, found {found!r}")

    if target_fingerprint and other.target.fingerprint:
        differ("target.fingerprint", target_fingerprint, other.target.fingerprint)
    else:
        differ("target.id", target_id, other.target.id)
    differ("engine.backend", backend, other.engine.backend)
    if version is not None:
        differ("engine.version", version, other.engine.version)
    differ("datasets (name, source)", sorted(datasets), sorted((d.name, d.source) for d in other.datasets))
    differ("settings.temperature", float(temperature), other.settings.temperature)
    differ("settings.max_new_tokens", max_new_tokens, other.settings.max_new_tokens)
    differ("settings.concurrency", sorted(concurrency), sorted(other.settings.concurrency))
    if base.n:
        have = sorted(other.settings.num_speculative_tokens)
        if base.n not in have:
            out.append(f"settings.num_speculative_tokens: expected {base.n} (the @n asked for), found {have}")
    return out


def check_baseline_file(base: BaselineFile, **setup) -> None:
    """Refuse a baseline file measured differently, in one paragraph naming the file and each difference
    (``setup``: :func:`differences`' keyword arguments).

    Raises:
        VerifyArgumentError: at least one difference.
    """
    found = differences(base, **setup)
    if found:
        raise VerifyArgumentError(
            f"--baseline {base.path}: this results file was not measured like this run, so its tokens/s is no "
            f"baseline for it; {'; '.join(found)}. Nothing was loaded.",
            hint="measure the baseline file with the same target, engine, --datasets, --temperature, "
                 "--max-new-tokens and --concurrency")


def comparison_tokens_per_s(base: BaselineFile) -> dict[tuple[str, int], float]:
    """The file's tokens/s per (dataset, concurrency) that this run's speedups divide by (see the module doc)."""
    other, out = base.results, {}
    for c in other.settings.concurrency:
        n = base.n
        if n is None:
            best = other.best_n(c)
            n = best[0] if best is not None else 0
        for ds in other.datasets:
            if n == 0:
                b = ds.baseline_at(c)
                tps = b.tokens_per_s if b is not None else None
            else:
                r = ds.run(n, c)
                tps = r.tokens_per_s if r is not None else None
            if tps:
                out[ds.name, c] = tps
    return out


def rebase(results: VerifyResults, base: BaselineFile) -> VerifyResults:
    """``results`` with every speedup against the file's tokens/s (:func:`comparison_tokens_per_s`), each rebased
    run marked :data:`NOT_INTERLEAVED`, summary / load rows recomputed, and ``baseline`` the file's ref."""
    from dsparkhub.verify.results.derive import load_rows, summarize

    tps = comparison_tokens_per_s(base)
    datasets = []
    for ds in results.datasets:
        runs = []
        for r in ds.runs:
            other = tps.get((ds.name, r.concurrency))
            if other is None:
                runs.append(replace(r, speedup=None, speedup_repeats=[], speedup_spread=None))
                continue
            runs.append(replace(r, baseline_tokens_per_s=other, speedup=r.tokens_per_s / other,
                                speedup_repeats=[t / other for t in r.tokens_per_s_repeats], speedup_spread=None,
                                unreliable=[*r.unreliable, NOT_INTERLEAVED], latency_speedup=None))
        datasets.append(replace(ds, runs=runs))
    cs = list(results.settings.concurrency)
    summary, change = summarize(datasets, list(results.settings.num_speculative_tokens), cs)
    load, stops = load_rows(summary, cs)
    return replace(results, datasets=datasets, summary=summary, change=change, load=load, stops_paying_at=stops,
                   baseline=base.ref)
