"""The schema ``dsparkhub.verify.results/3`` of one ``dsparkhub verify`` run: its pydantic dataclasses.

The dataclasses are strict (``extra="forbid"``): :mod:`dsparkhub.verify.results.reading` reports every missing,
unexpected or wrongly typed key in one error naming its key path and upgrades ``/1`` and ``/2`` files in memory;
:mod:`~dsparkhub.verify.results.derive` turns :class:`~dsparkhub.verify.stats.RunStats` into these objects (metric
definitions there); :mod:`~dsparkhub.verify.results.table` renders them for the terminal. This module holds the
types, their views and an atomic ``save``. It does not run engines (``runner``), read prompts (``prompts``) or
render cards (``card``); a model card is generated from these files only.


=========================================  ===================  ====================================================
key                                        type                 meaning
=========================================  ===================  ====================================================
schema                                     str                  ``"dsparkhub.verify.results/3"`` (``/1``, ``/2`` read)
dsparkhub_version                          str                  version of dsparkhub that wrote the file
date                                       str                  UTC ISO 8601 time the run finished
method                                     str                  ``dspark`` | ``dflash`` | ``eagle3``
engine.backend                             str                  an engine of ``dsparkhub.serving.ENGINES``:
                                                                ``reference`` | ``vllm`` | ``vllm-serve`` |
                                                                ``sglang-serve``
engine.version                             str                  engine version (``vllm 0.32.0``)
engine.device                              str                  what ran it, in words (``cpu (2 threads)``)
engine.contract                       d    dict                 vLLM engines only: ``{vllm_version, contract_line,
                                                                confirmed, unconfirmed}`` of the contract that
                                                                judged the run (``unconfirmed``: the fact kinds not
                                                                read from this version's sources, for a vLLM newer
                                                                than the contract); absent otherwise
target.id                                  str                  Hub repo id (a local folder's, when known), else the
                                                                folder's name; never an absolute local path
target.fingerprint                         str | null           :func:`target_fingerprint` of a local target
drafter.id                                 str                  drafter folder name (or Hub repo / served name)
drafter.fingerprint                        str | null           ``dsparkhub.io.hashing.checkpoint_fingerprint``
baseline                              3    BaselineRef          what every speedup is measured against (/1, /2:
                                                                ``{kind: none, id: "no speculation", n: null,
                                                                fingerprint: null}``)
settings.batch_size                        int                  1 (/1 files); /2: the largest concurrency
settings.temperature                       float                sampling temperature (0 = greedy)
settings.max_new_tokens                    int                  generation cap per prompt
settings.seed                              int                  sampling seed
settings.num_speculative_tokens            list[int]            the n values measured, ascending
settings.tensor_parallel_size              int                  target tensor-parallel size
settings.max_model_len                     int | null           engine context length
settings.compilation_config                dict | null          vLLM compilation config (``null`` = engine default)
settings.confidence_threshold              float | null         proposal truncation threshold (reference engine)
settings.concurrency                  d    list[int]            requests in flight, ascending (/1: ``[1]``)
settings.repeats                      d    int                  timed repeats per configuration (/1: 1)
settings.order                        d    str                  ``interleaved`` | ``configuration-outer`` (/1:
                                                                ``configuration-outer``)
settings.spread_limit                 d    float                (max - min) / median of the per-repeat speedups
                                                                above which a speedup is unreliable (/1: 0.2)
settings.intra_op_threads             d    int | null           torch intra-op threads (reference engine on CPU)
datasets[].name                            str                  dataset name (file stem or given name)
datasets[].source                          str                  where the prompts came from (``name.jsonl (sha256
                                                                0123..)``, ``builtin:x``, ``hub:o/n:file``)
datasets[].baselines[]                d    Baseline             the run of the baseline (``baseline``; without a
                                                                drafter by default), one per concurrency (/1: its
                                                                ``baseline`` at concurrency 1)
datasets[].runs[]                          RunResult            one per (n, concurrency)
summary[]                                  SummaryRow           one per (n, concurrency)
change                                     dict | null          {from_n, to_n, tau_delta, speedup_delta} of the
                                                                summary means at the lowest concurrency, smallest
                                                                to largest n (null if one n)
load[]                                d    LoadRow              one per concurrency: the best n and whether the
                                                                drafter pays there (/1: derived on reading)
stops_paying_at                       d    int | null           lowest concurrency from which no reliable speedup
                                                                is above 1 (null: pays everywhere, or unknown)
lossless                                   bool | null          false if any run failed; null if none was checked
incomplete                            d    list[str]            configurations not measured, one sentence each
                                                                (server died, Ctrl-C, concurrency out of reach;
                                                                fewer repeats than asked); ``[]`` when complete
warnings                                   list[str]            the warnings the run printed: validation and
                                                                prompts (``[DSH401] ...``) when it started; no
                                                                draft token accepted (``derive.no_acceptance``)
categories[]                          d    CategoryRow          SPEED-Bench runs: one per category x n x
                                                                concurrency (``per_request``); ``[]`` otherwise
step_costs                            o    StepCostsRecord |    where the time goes (issue 26): draft / verify
                                           null                 seconds per step shape and the latency law per
                                                                (n, concurrency); null where the engine does not
                                                                time its steps (every backend but ``reference``)
=========================================  ===================  ====================================================

Keys marked ``o`` are optional: absent from the file when empty (older files and runs without step timing), read
as their default.

``Baseline`` (``datasets[].baselines[]``): ``concurrency`` (int), ``prompts``, ``output_tokens`` (int),
``wall_s`` (float, median over repeats), ``tokens_per_s`` (float, median), ``tokens_per_s_repeats`` (list[float],
one per repeat, in order; /1: ``[tokens_per_s]``), ``latency`` (Latency | null); /3 adds ``kind`` (str, the
top-level ``baseline.kind`` this record measured: ``none`` = no speculation; /1, /2: ``none``) and ``lossless``
(bool | null: a speculative baseline's greedy outputs against the target alone, checked in its first repeat; null
for ``none`` or temperature > 0) with ``first_mismatch`` (Mismatch | null); optional (o) ``tau`` (float) and
``per_position_acceptance`` (list[float]) of a speculative baseline (``mtp``, ``drafter``), its first repeat.

``BaselineRef`` (``baseline``, /3): ``kind`` (``none`` | ``mtp`` | ``drafter`` | ``results``), ``id`` (``no
speculation``; ``mtp`` for the target's own MTP layers; the baseline drafter's folder name; a results file's name),
``n`` (int | null: the baseline's num_speculative_tokens; null for ``none``), ``fingerprint`` (str | null: the
baseline drafter's ``checkpoint_fingerprint``, a results file's sha256). Speedups are ``tokens/s / baseline
tokens/s``; ``baseline_label`` names the baseline in tables, ``compare`` and the card (``no speculation``,
``DFlash n=7``).

``Latency``: ``per_user_tokens_per_s_mean``, ``per_user_tokens_per_s_p50``, ``tpot_p50_ms``, ``tpot_p99_ms``,
``ttft_p50_ms``, and (d) ``tpot_p95_ms``, ``e2e_p50_ms``, ``e2e_p95_ms``, ``e2e_p99_ms`` (float | null each;
null when the backend does not time requests; /1: the object is null).

Per request (d, :mod:`~dsparkhub.verify.results.per_request`, definitions there): ``Baseline.per_request`` and
``RunResult.per_request`` (PerRequest | null: ``tau``, ``accepted_per_step``, ``ttft_ms``, ``tpot_ms``,
``e2e_ms``, one entry per prompt of the first repeat); ``RunResult.request_tau`` (mean of per-request τ) beside
the token-weighted ``tau``; ``RunResult.latency_speedup`` (LatencySpeedup | null: baseline / drafter of TPOT and
E2E p50 / p95 / p99); ``SummaryRow.mean_request_tau`` and ``SummaryRow.mean_latency_speedup``.

``RunResult`` (``datasets[].runs[]``): ``num_speculative_tokens`` (int), ``concurrency`` (d, int; /1: 1),
``prompts``, ``output_tokens`` (int), ``wall_s`` (float, median), ``num_drafts``, ``num_draft_tokens``,
``num_accepted_tokens`` (int, raw vLLM-style counters of the first repeat), ``accepted_per_pos`` (list[int], length
n), ``tau`` (float | null), ``per_position_acceptance`` (list[float], unconditional, length n),
``conditional_acceptance`` (d, list[float], length n; /1: derived), ``draft_tokens_per_step`` (float | null),
``tokens_per_s`` (float, median), ``tokens_per_s_repeats`` (d, list[float]), ``baseline_tokens_per_s`` (float, the
same dataset's baseline at the same concurrency), ``speedup`` (float | null; null when the baseline timed
nothing), ``speedup_repeats`` (d, list[float], per interleaved repeat), ``speedup_spread`` (d, float | null: (max -
min) / median of ``speedup_repeats``, null with one repeat), ``unreliable`` (d, list[str]: why the timed figures
are not to be trusted, ``[]`` when they are; /1: the latency-law check is applied on reading), ``latency`` (d,
Latency | null), ``lossless`` (bool | null), ``first_mismatch`` ({prompt_index, position, expected, found} | null).

``SummaryRow`` (``summary[]``): ``num_speculative_tokens``, ``concurrency`` (d), ``mean_tau``, ``mean_speedup``,
``mean_per_position_acceptance`` (list[float]), ``mean_tokens_per_s`` (d, drafter total output tokens/s),
``mean_baseline_tokens_per_s`` (d), ``mean_per_user_tokens_per_s`` (d, float | null), ``lossless`` (bool | null),
``unreliable`` (d, list[str]: ``"dataset: reason"`` of every unreliable run at this (n, concurrency)).

``LoadRow`` (``load[]``): ``concurrency``, ``best_n`` (int | null: the n with the highest reliable mean speedup,
ties to the smaller n; null when no speedup there is reliable), ``best_speedup`` (float | null), ``pays`` (bool |
null: ``best_speedup > 1``).

``StepCostsRecord`` (``step_costs``): ``source`` (str: what timed the steps, e.g. ``reference engine decoding
steps``), ``shapes`` (list[StepShape]), ``law`` (list[LawRow]).

``StepShape``: ``num_speculative_tokens`` (int | null: the configuration, null = the target alone), ``concurrency``
(int, the run's), ``requests`` (int: requests in the step), ``width`` (int | null: the widest verify width, draft
tokens; null for a target-alone step), ``context`` (int: context bucket, the step's longest context rounded up to a
power of two, tokens), ``steps`` (int), ``draft_s`` / ``verify_s`` (float, medians, seconds per step).

``LawRow``: ``num_speculative_tokens``, ``concurrency``, ``t_target_s`` / ``t_draft_s`` / ``t_verify_s`` (float:
median seconds of a steady step, every request in flight), ``tau`` (float), ``predicted`` (float: T_target x τ /
(T_draft + T_verify)), ``spread`` ([low, high]: the prediction from the steps' quartiles), ``ceiling`` (float: the
prediction with every draft accepted, τ = n + 1), ``measured`` (float: the summary's mean speedup),
``measured_spread`` ([lowest, highest] per-repeat speedup, ``[]`` with one repeat), ``flag`` (``""`` |
``"above ceiling"`` | ``"shortfall"``), ``note`` (str: what the flag means, for a shortfall the term that dominates).

In ``first_mismatch`` ``expected`` is the token without the drafter and ``found`` the token with it; either is
``null`` where that output had already ended (one output is a strict prefix of the other).
"""

from __future__ import annotations

import json
from dataclasses import asdict, field
from pathlib import Path
from typing import Any

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from dsparkhub.errors import LosslessMismatchError
from dsparkhub.io.output import replace_text
from dsparkhub.verify.results.per_request import CategoryRow, LatencySpeedup, PerRequest
from dsparkhub.serving import METHODS as METHODS_TABLE
from dsparkhub.serving import method_names

SCHEMA = "dsparkhub.verify.results/3"
SCHEMA_V2 = "dsparkhub.verify.results/2"
SCHEMA_V1 = "dsparkhub.verify.results/1"
#: what a speedup can be measured against (``verify --baseline``; ``BaselineRef.kind``)
BASELINE_KINDS = ("none", "mtp", "drafter", "results")
#: the methods a results file records (``dsparkhub.serving.METHODS``; an engine's names are read from
#: ``dsparkhub.serving.ENGINES`` when a file is read, so an engine added there is accepted)
METHODS = method_names()
ORDERS = ("interleaved", "configuration-outer")
DEFAULT_SPREAD_LIMIT = 0.2

_STRICT = ConfigDict(extra="forbid", strict=True)


# ---- dataclasses ------------------------------------------------------------------------------------------------


@dataclass(config=_STRICT)
class Mismatch:
    """First differing output token between the baseline and a drafter run (greedy decoding).

    Attributes:
        prompt_index: index of the prompt in its dataset (0-based).
        position: index of the first differing generated token (0-based, prompt tokens excluded).
        expected: token id generated without the drafter, None where that output had already ended.
        found: token id generated with the drafter, None where that output had already ended.
    """

    prompt_index: int
    position: int
    expected: int | None
    found: int | None


@dataclass(config=_STRICT)
class EngineInfo:
    """Which engine produced the numbers: backend name, engine version, device in words."""

    backend: str
    version: str
    device: str
    #: vLLM engines: :meth:`dsparkhub.verify.vllm.contract.VllmContract.to_dict` of ``version`` (absent from the file
    #: when None: reference / SGLang engines, or files written before contracts).
    contract: dict[str, Any] | None = None


@dataclass(config=_STRICT)
class ModelRef:
    """A model's identity: ``id`` (folder path or Hub repo id) and a content fingerprint (None when not local)."""

    id: str
    fingerprint: str | None


@dataclass(config=_STRICT)
class Settings:
    """Engine, sampling and timing settings every run of the file shares (see the module table)."""

    temperature: float
    max_new_tokens: int
    seed: int
    num_speculative_tokens: list[int]
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    compilation_config: dict | None = None
    confidence_threshold: float | None = None
    batch_size: int = 1
    concurrency: list[int] = field(default_factory=lambda: [1])
    repeats: int = 1
    order: str = "configuration-outer"
    spread_limit: float = DEFAULT_SPREAD_LIMIT
    intra_op_threads: int | None = None


@dataclass(config=_STRICT)
class Latency:
    """Per-request timing percentiles of one run (milliseconds, tokens per second); None where not timed."""

    per_user_tokens_per_s_mean: float | None = None
    per_user_tokens_per_s_p50: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    # per-request figures (issue 25), additive: absent in older /2 files
    tpot_p95_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None


@dataclass(config=_STRICT)
class Baseline:
    """The run without the drafter for one dataset at one concurrency (timings are medians over repeats)."""

    prompts: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    concurrency: int = 1
    tokens_per_s_repeats: list[float] = field(default_factory=list)
    latency: Latency | None = None
    # /3 (baseline branch): which baseline this record measured, and a speculative baseline's own lossless check
    kind: str = "none"
    lossless: bool | None = None
    first_mismatch: Mismatch | None = None
    per_request: PerRequest | None = None  # issue 25 (perrequest branch), additive
    # optional (absent when null): a speculative baseline's own τ and per-position acceptance, first repeat
    tau: float | None = None
    per_position_acceptance: list[float] | None = None


@dataclass(config=_STRICT)
class BaselineRef:
    """What every speedup of a file is measured against (schema /3, ``verify --baseline``).

    Attributes:
        kind: ``none`` (no speculation) | ``mtp`` (the target's own MTP layers) | ``drafter`` (another drafter) |
            ``results`` (a second results file of the same target, engine and prompts).
        id: ``no speculation`` | ``mtp`` | the baseline drafter's folder name (or its method and name) | the file.
        n: the baseline's num_speculative_tokens (None for ``none``).
        fingerprint: the baseline drafter's checkpoint fingerprint or a results file's sha256 (None otherwise).
        method: the baseline drafter's method (``dflash``...), None for the others.
    """

    kind: str = "none"
    id: str = "no speculation"
    n: int | None = None
    fingerprint: str | None = None
    method: str | None = None

    @property
    def label(self) -> str:
        """The baseline in words, as tables and cards name it: ``no speculation``, ``DFlash n=7``, ``MTP n=2``."""
        if self.kind == "none":
            return "no speculation"
        if self.kind == "mtp":
            return f"MTP n={self.n}"
        if self.kind == "drafter":
            name = METHODS_TABLE[self.method].label if self.method in METHODS_TABLE else self.id
            return f"{name} n={self.n}"
        return f"{self.id}" + (f" n={self.n}" if self.n is not None else "")


@dataclass(config=_STRICT)
class RunResult:
    """One dataset x one ``num_speculative_tokens`` x one concurrency: counters, derived metrics, verdicts."""

    num_speculative_tokens: int
    prompts: int
    output_tokens: int
    wall_s: float
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]
    tau: float | None
    per_position_acceptance: list[float]
    draft_tokens_per_step: float | None
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float | None
    lossless: bool | None
    first_mismatch: Mismatch | None = None
    concurrency: int = 1
    conditional_acceptance: list[float] = field(default_factory=list)
    tokens_per_s_repeats: list[float] = field(default_factory=list)
    speedup_repeats: list[float] = field(default_factory=list)
    speedup_spread: float | None = None
    unreliable: list[str] = field(default_factory=list)
    latency: Latency | None = None
    # per-request figures (issue 25), additive: absent in older /2 files
    request_tau: float | None = None
    per_request: PerRequest | None = None
    latency_speedup: LatencySpeedup | None = None

    @property
    def reliable(self) -> bool:
        """True when no reason makes the timed figures unreliable."""
        return not self.unreliable


@dataclass(config=_STRICT)
class DatasetResult:
    """Every configuration measured on one dataset."""

    name: str
    source: str
    baselines: list[Baseline]
    runs: list[RunResult]

    @property
    def concurrencies(self) -> list[int]:
        """Concurrencies measured on this dataset, ascending."""
        return sorted({b.concurrency for b in self.baselines} | {r.concurrency for r in self.runs})

    @property
    def baseline(self) -> Baseline:
        """The baseline at the lowest concurrency (the batch-1 view /1 files have)."""
        return min(self.baselines, key=lambda b: b.concurrency)

    def baseline_at(self, concurrency: int) -> Baseline | None:
        """The baseline at ``concurrency``, or None."""
        return next((b for b in self.baselines if b.concurrency == concurrency), None)

    def run(self, n: int, concurrency: int | None = None) -> RunResult | None:
        """The run at ``num_speculative_tokens == n`` and ``concurrency`` (None: the lowest measured), or None."""
        if concurrency is None:
            concurrency = self.concurrencies[0] if self.concurrencies else 1
        return next((r for r in self.runs if r.num_speculative_tokens == n and r.concurrency == concurrency), None)


@dataclass(config=_STRICT)
class SummaryRow:
    """Unweighted means over datasets at one ``num_speculative_tokens`` and one concurrency."""

    num_speculative_tokens: int
    mean_tau: float | None
    mean_speedup: float | None
    mean_per_position_acceptance: list[float]
    lossless: bool | None
    concurrency: int = 1
    mean_tokens_per_s: float | None = None
    mean_baseline_tokens_per_s: float | None = None
    mean_per_user_tokens_per_s: float | None = None
    unreliable: list[str] = field(default_factory=list)
    # per-request figures (issue 25), additive: absent in older /2 files
    mean_request_tau: float | None = None
    mean_latency_speedup: LatencySpeedup | None = None

    @property
    def reliable(self) -> bool:
        """True when every run behind this row's speedup was reliable."""
        return not self.unreliable


@dataclass(config=_STRICT)
class Change:
    """Change of the summary means from the smallest to the largest n (``to - from``), lowest concurrency."""

    from_n: int
    to_n: int
    tau_delta: float | None
    speedup_delta: float | None


@dataclass(config=_STRICT)
class LoadRow:
    """The best n at one concurrency (reliable speedups only) and whether the drafter pays there."""

    concurrency: int
    best_n: int | None
    best_speedup: float | None
    pays: bool | None


@dataclass(config=_STRICT)
class StepShape:
    """Median draft and verify seconds of the steps of one shape, in one configuration's runs."""

    num_speculative_tokens: int | None
    concurrency: int
    requests: int
    width: int | None
    context: int
    steps: int
    draft_s: float
    verify_s: float


@dataclass(config=_STRICT)
class LawRow:
    """The latency law L = (T_draft + T_verify) / τ for one (n, concurrency), beside the measured speedup
    (:func:`dsparkhub.verify.costs.law_row` computes it; field meanings in the module docstring)."""

    num_speculative_tokens: int
    concurrency: int
    t_target_s: float
    t_draft_s: float
    t_verify_s: float
    tau: float
    predicted: float
    ceiling: float
    spread: list[float]
    measured: float
    flag: str = ""
    note: str = ""
    measured_spread: list[float] = field(default_factory=list)


@dataclass(config=_STRICT)
class StepCostsRecord:
    """Where the time goes: step costs per shape and the latency law, as the engine measured them."""

    source: str
    shapes: list[StepShape] = field(default_factory=list)
    law: list[LawRow] = field(default_factory=list)


@dataclass(config=_STRICT)
class VerifyResults:
    """A whole results file (schema ``dsparkhub.verify.results/2``; see the module docstring for every key)."""

    dsparkhub_version: str
    date: str
    method: str
    engine: EngineInfo
    target: ModelRef
    drafter: ModelRef
    settings: Settings
    datasets: list[DatasetResult]
    summary: list[SummaryRow]
    change: Change | None
    lossless: bool | None
    warnings: list[str] = field(default_factory=list)
    load: list[LoadRow] = field(default_factory=list)
    stops_paying_at: int | None = None
    incomplete: list[str] = field(default_factory=list)
    # /3 (baseline branch): what the speedups are measured against; /1, /2 files read as no speculation
    baseline: BaselineRef = field(default_factory=BaselineRef)
    categories: list[CategoryRow] = field(default_factory=list)  # issue 25, additive: SPEED-Bench matrix
    # optional (issue 26, branch costs): step costs and the latency law; None where the engine does not time steps
    step_costs: StepCostsRecord | None = None
    schema: str = SCHEMA

    # -- views ---------------------------------------------------------------------------------------------------

    @property
    def speedup_label(self) -> str:
        """``speedup vs <baseline>``: how every table, ``compare`` and the card head a speedup column."""
        return f"speedup vs {self.baseline.label}"

    def summary_at(self, concurrency: int | None = None) -> list[SummaryRow]:
        """Summary rows at ``concurrency`` (None: the lowest measured), ascending n."""
        if concurrency is None:
            concurrency = self.settings.concurrency[0] if self.settings.concurrency else 1
        return [r for r in self.summary if r.concurrency == concurrency]

    def best_n(self, concurrency: int | None = None) -> tuple[int, bool] | None:
        """The n to serve with at ``concurrency`` (None: the lowest measured), and whether a reliable speedup chose it.

        The ``load`` row's ``best_n`` there (the highest *reliable* mean speedup, ties to the smaller n) with True;
        where no speedup there is reliable, the n with the highest mean τ (ties: the smaller n) with False, since τ
        is counted, not timed, and an unreliable timing never chooses n. ``card`` (its serve commands) and
        ``compare`` (its load cells) both read this.

        Returns:
            ``(n, reliable)``, or None when nothing was measured at ``concurrency``.
        """
        if concurrency is None:
            concurrency = self.settings.concurrency[0] if self.settings.concurrency else 1
        best = next((r.best_n for r in self.load if r.concurrency == concurrency and r.best_n is not None), None)
        if best is not None:
            return best, True
        rows = self.summary_at(concurrency)
        if not rows:
            return None
        rows = [r for r in rows if r.mean_tau is not None] or rows
        return max(rows, key=lambda r: (r.mean_tau or 0.0, -r.num_speculative_tokens)).num_speculative_tokens, False

    def first_mismatch(self) -> tuple[str, RunResult] | None:
        """(dataset name, run) of the first run whose greedy outputs differ from the baseline, or None."""
        for ds in self.datasets:
            for run in ds.runs:
                if run.lossless is False:
                    return ds.name, run
        return None

    def lossless_error(self) -> LosslessMismatchError | None:
        """A :class:`LosslessMismatchError` describing the first mismatch, or None when every run was lossless."""
        hit = self.first_mismatch()
        if hit is None:
            return self._baseline_lossless_error()
        name, run = hit
        m = run.first_mismatch
        assert m is not None  # set together with lossless=False by build_run_result
        at = f", concurrency {run.concurrency}" if run.concurrency != 1 else ""
        return LosslessMismatchError(
            f"greedy output with the drafter (num_speculative_tokens={run.num_speculative_tokens}{at}) differs "
            f"from the target alone on dataset {name!r}, prompt {m.prompt_index}, output position {m.position}: "
            f"expected token {_tok(m.expected)}, found {_tok(m.found)}",
            dataset=name, prompt_index=m.prompt_index, position=m.position, expected=m.expected, found=m.found,
            hint="the speculative path is not lossless: check the drafter's block layout (anchor-first vs 1+N) and "
                 "the engine's verify step; the results file records lossless=false",
        )

    def _baseline_lossless_error(self) -> LosslessMismatchError | None:
        """The error for a speculative baseline whose greedy outputs differ from the target alone, or None."""
        for ds in self.datasets:
            for b in ds.baselines:
                if b.lossless is False and b.first_mismatch is not None:
                    m = b.first_mismatch
                    return LosslessMismatchError(
                        f"greedy output of the baseline {self.baseline.label} (concurrency {b.concurrency}) differs "
                        f"from the target alone on dataset {ds.name!r}, prompt {m.prompt_index}, output position "
                        f"{m.position}: expected token {_tok(m.expected)}, found {_tok(m.found)}",
                        dataset=ds.name, prompt_index=m.prompt_index, position=m.position, expected=m.expected,
                        found=m.found, hint="the baseline drafter is not lossless on this engine; the results file "
                                            "records it under datasets[].baselines[].lossless")
        return None

    # -- (de)serialisation ----------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict, keys in schema order (``schema`` first)."""
        d = asdict(self)
        if d["step_costs"] is None:  # optional: a file without step costs reads as it did before the key existed
            del d["step_costs"]
        if d["engine"]["contract"] is None:
            del d["engine"]["contract"]  # only vLLM runs carry one; other files keep their bytes
        for b in (b for ds in d["datasets"] for b in ds["baselines"]):
            for key in ("tau", "per_position_acceptance"):  # only a speculative baseline has them
                if b[key] is None:
                    del b[key]
        return {"schema": d.pop("schema"), **d}

    def save(self, path: str | Path) -> Path:
        """Write the file atomically (temp file in the same folder, fsync, rename; 0666 less the umask:
        :func:`dsparkhub.io.output.replace_text`); returns the path."""
        return replace_text(path, json.dumps(self.to_dict(), indent=2) + "\n", fsync=True)


def _tok(t: int | None) -> str:
    return "<end of output>" if t is None else str(t)
