"""Confidence-head calibration math: recorded verify steps, sequential temperature scaling (STS), metrics, sweep.

The DSpark confidence head gives, per drafted position i, a raw logit ``c_i``; engines turn it into the *cumulative
survival* ``S_i = prod_{j <= i} sigmoid(c_j / T_j)``, the predicted probability that the first ``i + 1`` draft
tokens are all accepted (SGLang 0.5.23 ``srt/models/dspark.py`` ``DSparkConfidenceHead.apply_sts`` divides the raw
logit by a per-position temperature; vLLM 0.32 adaptive verification and the reference engine's
``--confidence-threshold`` use the same product with T = 1). The label at position i is ``accepted > i``.

STS follows SGLang 0.5.23 ``benchmark/dspark_sts_fit.py`` (``fit_sts_temperatures``, lines 48-110): left to right,
T_i minimises the ECE (``expected_calibration_error``, lines 25-45: 15 equal-width bins, probabilities clamped to
[1e-8, 1 - 1e-8], bin index ``floor(p * bins)``) of ``S_i`` given the already fitted ``T_0 .. T_{i-1}``, searched
over SGLang's grid of 41 log-spaced temperatures in [0.1, 10] (``default_temperature_grid``, line 21-22): by
default the temperatures are exactly the ones SGLang's fitter picks on the same data. ``refine=True`` adds a
golden-section search over log T between the best grid point's neighbours, kept only if it lowers the fit ECE (the
ECE is noisy at that resolution, so it mostly fits noise beyond the first positions; opt-in).

Two things SGLang's fitter does not do, both needed on a release's own (small) verification:

- *censoring*: a position the step did not verify (the draft was truncated to width k, so positions >= k were never
  drafted) is not a rejection; it is left out of that position's samples (``valid``). SGLang's collector always
  verifies the full width, so its prefix mask needs no such rule.
- *pooling*: a position with fewer than ``min_samples`` fit samples, or fewer than ``min_class`` accepted or rejected
  ones, does not get a temperature of its own: each run of consecutive such positions shares one temperature fitted
  on their samples together; when even the run is too thin, it carries the previous position's temperature (1.0 at
  position 0). :class:`StsFit` ``pooled`` says which and why.

This module does not run models (``dsparkhub.calibrate`` and the reference engine do) or write files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

EPS_PROB = 1e-8  # SGLang 0.5.23 dspark_sts_fit.py:18
NUM_BINS = 15  # SGLang 0.5.23 dspark_sts_fit.py:147 (`fit(num_bins=15)`)
THRESHOLDS = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0 .. 0.9, DeepSeek's sweep


def sglang_temperature_grid() -> list[float]:
    """SGLang's search grid: 41 temperatures log-spaced over [0.1, 10], computed as SGLang does (torch float32
    ``logspace``, then widened), so a grid-only fit picks the very values SGLang's fitter picks."""
    import torch

    return torch.logspace(math.log10(0.1), math.log10(10.0), steps=41).to(torch.float64).tolist()


# ---- recording ------------------------------------------------------------------------------------------------


@dataclass
class ConfidenceRecords:
    """Verify steps with their raw confidences, one row a step.

    Attributes:
        logits: [S, γ] float64 raw confidence logits (before the sigmoid); NaN at positions >= ``verified``.
        accepted: [S] int64 draft tokens accepted in the step (bonus excluded).
        verified: [S] int64 draft tokens verified in the step (the width k, <= γ).
        dataset: [S] dataset name of the step's prompt (object array of str).
        prompt: [S] int64 index of the prompt within its dataset.
    """

    logits: np.ndarray
    accepted: np.ndarray
    verified: np.ndarray
    dataset: np.ndarray
    prompt: np.ndarray

    @property
    def gamma(self) -> int:
        """γ: the number of drafted positions a step can have."""
        return int(self.logits.shape[1])

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    @property
    def labels(self) -> np.ndarray:
        """[S, γ] float64: 1 where the first i + 1 draft tokens were accepted (``accepted > i``)."""
        return (np.arange(self.gamma)[None, :] < self.accepted[:, None]).astype(np.float64)

    @property
    def valid(self) -> np.ndarray:
        """[S, γ] bool: position i was verified in the step (``i < verified``); the rest is censored."""
        return np.arange(self.gamma)[None, :] < self.verified[:, None]

    @property
    def datasets(self) -> list[str]:
        """Dataset names in first-seen order."""
        return list(dict.fromkeys(self.dataset.tolist()))

    def subset(self, mask: np.ndarray) -> ConfidenceRecords:
        """The rows where ``mask`` ([S] bool) is true."""
        return ConfidenceRecords(self.logits[mask], self.accepted[mask], self.verified[mask], self.dataset[mask],
                                 self.prompt[mask])

    def split(self, fit_fraction: float = 0.5, seed: int = 0) -> tuple[ConfidenceRecords, ConfidenceRecords]:
        """Split by prompt (all steps of a prompt fall on one side), per dataset: ``(fit, held_out)``.

        Each dataset's prompts are shuffled with ``seed`` and the first ``round(fit_fraction * P)`` (at least one,
        at most P - 1) go to the fit split.

        Raises:
            ValueError: ``fit_fraction`` not in (0, 1), or a dataset has fewer than 2 prompts with steps.
        """
        if not 0.0 < fit_fraction < 1.0:
            raise ValueError(f"fit_fraction must be in (0, 1), found {fit_fraction}")
        rng = np.random.default_rng(seed)
        fit = np.zeros(len(self), dtype=bool)
        for name in self.datasets:
            rows = self.dataset == name
            prompts = np.unique(self.prompt[rows])
            if len(prompts) < 2:
                raise ValueError(f"dataset {name!r} has {len(prompts)} prompt(s) with verify steps; a fit and a "
                                 "held-out split need at least 2")
            chosen = rng.permutation(prompts)[:min(max(1, round(fit_fraction * len(prompts))), len(prompts) - 1)]
            fit |= rows & np.isin(self.prompt, chosen)
        return self.subset(fit), self.subset(~fit)


class ConfidenceRecorder:
    """Collects what the reference engine reports per verify step (``ReferenceEngine.run(recorder=...)``).

    Set :attr:`dataset` before each ``run``; the engine calls :meth:`record` once per verify step.

    Args:
        gamma: γ, the most positions a step drafts (``num_speculative_tokens`` of the runs).
    """

    def __init__(self, gamma: int):
        self.gamma = int(gamma)
        self.dataset = ""
        self._rows: list[tuple[str, int, list[float], int, int]] = []

    def record(self, prompt: int, confidence_logits: list[float], accepted: int, verified: int) -> None:
        """One verify step: prompt index, raw logits of the k drafted positions, accepted count, verified width k.

        Raises:
            ValueError: more logits than γ, or counts inconsistent with them.
        """
        k = len(confidence_logits)
        if k > self.gamma or verified != k or not 0 <= accepted <= k:
            raise ValueError(f"step of prompt {prompt}: {k} logits, accepted {accepted}, verified {verified} "
                             f"(γ = {self.gamma})")
        self._rows.append((self.dataset, int(prompt), list(confidence_logits), int(accepted), int(verified)))

    def records(self) -> ConfidenceRecords:
        """Everything recorded so far as arrays."""
        logits = np.full((len(self._rows), self.gamma), np.nan)
        for r, (_, _, row, _, _) in enumerate(self._rows):
            logits[r, :len(row)] = row
        col = list(zip(*self._rows)) if self._rows else [(), (), (), (), ()]
        return ConfidenceRecords(logits, np.asarray(col[3], dtype=np.int64), np.asarray(col[4], dtype=np.int64),
                                 np.asarray(col[0], dtype=object), np.asarray(col[1], dtype=np.int64))


# ---- metrics --------------------------------------------------------------------------------------------------


def expected_calibration_error(probs: np.ndarray, targets: np.ndarray, num_bins: int = NUM_BINS) -> float:
    """ECE with equal-width bins, as SGLang 0.5.23 computes it (``dspark_sts_fit.py`` lines 25-45).

    Args:
        probs: [N] predicted probabilities. targets: [N] 0/1 outcomes. num_bins: bin count.

    Returns:
        ``sum_b |mean p - mean y|_b * n_b / N``; NaN when N = 0.
    """
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), EPS_PROB, 1.0 - EPS_PROB)
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    if p.size == 0:
        return float("nan")
    count, pred, hit = _bins(p, y, num_bins)
    denom = np.maximum(count, 1.0)
    return float((np.abs(pred / denom - hit / denom) * count).sum() / p.size)


def _bins(p: np.ndarray, y: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = np.clip((p * num_bins).astype(np.int64), 0, num_bins - 1)
    return (np.bincount(idx, minlength=num_bins).astype(np.float64), np.bincount(idx, p, minlength=num_bins),
            np.bincount(idx, y, minlength=num_bins))


def reliability_bins(probs: np.ndarray, targets: np.ndarray, num_bins: int = NUM_BINS) -> dict[str, list]:
    """A reliability diagram's data: per equal-width bin the sample count, mean confidence and accepted share.

    Returns:
        ``{"edges": [num_bins + 1], "count": [num_bins] int, "confidence": [num_bins] float | None,
        "accuracy": [num_bins] float | None}`` (None for an empty bin).
    """
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), EPS_PROB, 1.0 - EPS_PROB)
    count, pred, hit = _bins(p, np.asarray(targets, dtype=np.float64).reshape(-1), num_bins)
    return {"edges": [round(b / num_bins, 6) for b in range(num_bins + 1)], "count": [int(c) for c in count],
            "confidence": [float(s / c) if c else None for s, c in zip(pred, count)],
            "accuracy": [float(s / c) if c else None for s, c in zip(hit, count)]}


def brier_score(probs: np.ndarray, targets: np.ndarray) -> float:
    """Mean squared error of the probabilities against the 0/1 outcomes (NaN when empty)."""
    p, y = np.asarray(probs, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else float("nan")


def auroc(scores: np.ndarray, targets: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); None without both classes."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(targets) > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size)
    sorted_s = s[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    ends = np.r_[starts[1:], s.size]
    for a, b in zip(starts, ends):  # tied scores share the mean of their ranks (1-based)
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def survival(logits: np.ndarray, temperatures) -> np.ndarray:
    """Cumulative survival ``S[:, i] = prod_{j <= i} sigmoid(logits[:, j] / T_j)``: [S, γ] float64 (NaN where the
    logit is NaN, and after)."""
    t = np.asarray(temperatures, dtype=np.float64)[None, :]
    return np.cumprod(_sigmoid(np.asarray(logits, dtype=np.float64) / t), axis=1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# ---- fitting --------------------------------------------------------------------------------------------------


@dataclass
class StsFit:
    """Fitted temperatures and what the fit saw.

    Attributes:
        temperatures: [γ] per-position temperatures (> 0).
        samples / positives: [γ] fit samples (verified steps) and accepted ones per position.
        ece_before / ece_after: [γ] fit-split ECE of the survival at T = 1 and at the fitted temperatures.
        pooled: [γ] None for a position fitted alone, else why and with which positions it was pooled (draft
            positions counted from 1 in the text, as in the card).
    """

    temperatures: list[float]
    samples: list[int]
    positives: list[int]
    ece_before: list[float]
    ece_after: list[float]
    pooled: list[str | None] = field(default_factory=list)


def fit_sts(records: ConfidenceRecords, *, num_bins: int = NUM_BINS, refine: bool = False, min_samples: int = 100,
            min_class: int = 10, grid: list[float] | None = None) -> StsFit:
    """Fit per-position temperatures left to right, minimising the ECE of the cumulative survival.

    Args:
        records: the fit split.
        num_bins: ECE bins (SGLang: 15).
        refine: golden-section refinement between grid neighbours (False: exactly SGLang's grid search).
        min_samples / min_class: a position with fewer samples, or fewer accepted or rejected samples, is pooled.
        grid: candidate temperatures (default :func:`sglang_temperature_grid`).

    Returns:
        :class:`StsFit`.

    Raises:
        ValueError: no records.
    """
    if len(records) == 0:
        raise ValueError("no verify steps to fit temperatures on")
    grid = list(grid or sglang_temperature_grid())
    logits, labels, valid = records.logits, records.labels, records.valid
    gamma = records.gamma
    raw = survival(logits, [1.0] * gamma)
    samples = [int(valid[:, i].sum()) for i in range(gamma)]
    positives = [int(labels[valid[:, i], i].sum()) for i in range(gamma)]
    thin = [s < min_samples or p < min_class or s - p < min_class for s, p in zip(samples, positives)]
    temps: list[float] = []
    pooled: list[str | None] = []
    prev = np.ones(len(records))  # survival through the fitted positions so far
    i = 0
    while i < gamma:
        j = i + 1
        while thin[i] and j < gamma and thin[j]:
            j += 1
        group = list(range(i, j))  # one position, or a run of thin positions sharing one temperature

        def objective(t: float, group=group, prev=prev) -> float:
            return _group_ece(logits, labels, valid, prev, group, t, num_bins)

        n_group, p_group = sum(samples[g] for g in group), sum(positives[g] for g in group)
        if thin[i] and (n_group < min_samples or p_group < min_class or n_group - p_group < min_class):
            t = temps[-1] if temps else 1.0
            carried = f"draft position {i}'s temperature" if temps else "the identity temperature 1.0"
            why = (f"too few samples ({n_group}, {p_group} accepted; need {min_samples} with {min_class} of each "
                   f"class): carries {carried}")
        else:
            t = _search(objective, grid, refine)
            why = None
            if thin[i]:
                span = (f"draft positions {group[0] + 1}-{group[-1] + 1}" if len(group) > 1
                        else f"draft position {group[0] + 1}")
                why = (f"too few samples alone (need {min_samples} with {min_class} of each class): one temperature "
                       f"for {span} ({n_group} samples together)")
        for g in group:
            temps.append(float(t))
            pooled.append(why)
            prev = np.where(valid[:, g], prev * _sigmoid(np.nan_to_num(logits[:, g]) / t), prev)
        i = j
    after = survival(logits, temps)
    ece_b = [_ece_at(raw, labels, valid, g, num_bins) for g in range(gamma)]
    ece_a = [_ece_at(after, labels, valid, g, num_bins) for g in range(gamma)]
    return StsFit(temps, samples, positives, ece_b, ece_a, pooled)


def _ece_at(surv: np.ndarray, labels: np.ndarray, valid: np.ndarray, i: int, num_bins: int) -> float:
    v = valid[:, i]
    return expected_calibration_error(surv[v, i], labels[v, i], num_bins)


def _group_ece(logits, labels, valid, prev, group, t, num_bins) -> float:
    s, probs, ys = prev, [], []
    for g in group:
        s = s * _sigmoid(np.nan_to_num(logits[:, g]) / t)
        v = valid[:, g]
        probs.append(s[v])
        ys.append(labels[v, g])
    return expected_calibration_error(np.concatenate(probs), np.concatenate(ys), num_bins)


def _search(objective, grid: list[float], refine: bool) -> float:
    """Grid search (first minimum wins, as in SGLang's strict ``<``), then an optional golden-section refinement
    over log T inside the best grid point's neighbours, kept only when it lowers the objective."""
    values = [objective(t) for t in grid]
    k = int(np.argmin(values))  # argmin returns the first of equal minima
    best_t, best = grid[k], values[k]
    if not refine:
        return best_t
    lo, hi = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, len(grid) - 1)])
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = objective(math.exp(a)), objective(math.exp(b))
    for _ in range(40):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = objective(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = objective(math.exp(b))
    t, f = (math.exp(a), fa) if fa <= fb else (math.exp(b), fb)
    return t if f < best else best_t


# ---- report ---------------------------------------------------------------------------------------------------


def position_metrics(records: ConfidenceRecords, temperatures, *, num_bins: int = NUM_BINS) -> list[dict]:
    """Per position, before (T = 1) and after (``temperatures``): samples, accepted, ECE, Brier, AUROC of the
    cumulative survival, and the mean predicted vs observed acceptance.

    Returns:
        γ dicts with keys ``position, samples, accepted, acceptance, confidence_before, confidence_after,
        ece_before, ece_after, brier_before, brier_after, auroc_before, auroc_after`` (metrics None without samples;
        AUROC None without both classes).
    """
    labels, valid = records.labels, records.valid
    before, after = survival(records.logits, [1.0] * records.gamma), survival(records.logits, temperatures)
    out = []
    for i in range(records.gamma):
        v = valid[:, i]
        y, n = labels[v, i], int(v.sum())
        row: dict = {"position": i, "samples": n, "accepted": int(y.sum()),
                     "acceptance": float(y.mean()) if n else None}
        for tag, s in (("before", before[v, i]), ("after", after[v, i])):
            row[f"confidence_{tag}"] = float(s.mean()) if n else None
            row[f"ece_{tag}"] = expected_calibration_error(s, y, num_bins) if n else None
            row[f"brier_{tag}"] = brier_score(s, y) if n else None
            row[f"auroc_{tag}"] = auroc(s, y)
        out.append(row)
    return out


def pooled_reliability(records: ConfidenceRecords, temperatures, *, num_bins: int = NUM_BINS) -> dict:
    """Reliability bins over every verified (step, position) sample: ``{"before": ..., "after": ...}`` (see
    :func:`reliability_bins`)."""
    labels, valid = records.labels, records.valid
    return {tag: reliability_bins(survival(records.logits, t)[valid], labels[valid], num_bins)
            for tag, t in (("before", [1.0] * records.gamma), ("after", temperatures))}


def threshold_sweep(records: ConfidenceRecords, temperatures, thresholds=THRESHOLDS) -> list[dict]:
    """Simulate confidence-threshold truncation on the recorded steps (DeepSeek's sweep table).

    Per step the kept width is the leading positions whose survival is >= the threshold, at least one (the reference
    engine's rule, ``ReferenceEngine._draft``), capped at the verified width; the accepted tokens kept are
    ``min(accepted, kept)`` (exact for greedy verification: a prefix is accepted whatever follows it). Later steps are
    not re-simulated (truncation would move their anchors), so this is a per-step estimate.

    Returns:
        One dict per threshold: ``threshold, acceptance_rate`` (accepted kept / kept), ``draft_tokens_per_step``
        (mean kept), ``tau`` (1 + mean accepted kept), ``steps``; None values without steps.
    """
    s = survival(records.logits, temperatures)
    valid = records.valid
    rows = []
    for th in thresholds:
        keep = np.where(valid, s >= th, False)
        kept = np.maximum(np.cumprod(keep, axis=1).sum(axis=1), 1)
        kept = np.minimum(kept, records.verified)
        acc = np.minimum(records.accepted, kept)
        n = len(records)
        rows.append({"threshold": float(th), "steps": n,
                     "acceptance_rate": float(acc.sum() / kept.sum()) if n and kept.sum() else None,
                     "draft_tokens_per_step": float(kept.mean()) if n else None,
                     "tau": float(1.0 + acc.mean()) if n else None})
    return rows
