"""The results file of one ``dsparkhub verify`` run: a documented, versioned JSON schema.

This module owns the schema ``dsparkhub.verify.results/2`` (and reads ``/1`` files, upgrading them in memory), the
pydantic dataclasses that hold it (strict, ``extra="forbid"``: every missing, unexpected or wrongly typed key is
reported in one error naming its key path), the arithmetic that turns :class:`~dsparkhub.verify.stats.RunStats`
(baseline, drafter at n, each at every concurrency and every repeat) into the published numbers, the reliability
verdict of each timed figure, an atomic ``save`` and a ``load``. It does not run engines (``runner``), read prompts
(``prompts``) or render cards (``card``); a model card is generated from these files only.

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
  over every request of every repeat;
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

Schema (``d`` marks a key new in /2 that a /1 file lacks; reading /1 fills it as described):

=========================================  ===================  ====================================================
key                                        type                 meaning
=========================================  ===================  ====================================================
schema                                     str                  ``"dsparkhub.verify.results/2"`` (``/1`` is read)
dsparkhub_version                          str                  version of dsparkhub that wrote the file
date                                       str                  UTC ISO 8601 time the run finished
method                                     str                  ``dspark`` | ``dflash`` | ``eagle3``
engine.backend                             str                  ``reference`` | ``vllm`` | ``vllm-serve``
engine.version                             str                  engine version (``vllm 0.32.0``)
engine.device                              str                  what ran it, in words (``cpu (2 threads)``)
target.id                                  str                  Hub repo id (a local folder's, when known), else the
                                                                folder's name; never an absolute local path
target.fingerprint                         str | null           :func:`target_fingerprint` of a local target
drafter.id                                 str                  drafter folder name (or Hub repo / served name)
drafter.fingerprint                        str | null           ``dsparkhub.io.hashing.checkpoint_fingerprint``
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
datasets[].baselines[]                d    Baseline             the run without the drafter, one per concurrency
                                                                (/1: its ``baseline`` at concurrency 1)
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
                                                                (server died, concurrency out of reach); ``[]``
warnings                                   list[str]            the validation and prompt warnings printed when
                                                                the run started, e.g. ``[DSH401] ...``
=========================================  ===================  ====================================================

``Baseline`` (``datasets[].baselines[]``): ``concurrency`` (int), ``prompts``, ``output_tokens`` (int),
``wall_s`` (float, median over repeats), ``tokens_per_s`` (float, median), ``tokens_per_s_repeats`` (list[float],
one per repeat, in order; /1: ``[tokens_per_s]``), ``latency`` (Latency | null).

``Latency``: ``per_user_tokens_per_s_mean``, ``per_user_tokens_per_s_p50``, ``tpot_p50_ms``, ``tpot_p99_ms``,
``ttft_p50_ms`` (float | null each; null when the backend does not time requests; /1: the object is null).

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

In ``first_mismatch`` ``expected`` is the token without the drafter and ``found`` the token with it; either is
``null`` where that output had already ended (one output is a strict prefix of the other).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import tempfile
import typing
from dataclasses import asdict, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from dsparkhub import __version__
from dsparkhub.errors import LosslessMismatchError, ResultsError
from dsparkhub.verify.stats import RunStats

SCHEMA = "dsparkhub.verify.results/2"
SCHEMA_V1 = "dsparkhub.verify.results/1"
METHODS = ("dspark", "dflash", "eagle3")
BACKENDS = ("reference", "vllm", "vllm-serve")
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


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, which races with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


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
    schema: str = SCHEMA

    # -- views ---------------------------------------------------------------------------------------------------

    def summary_at(self, concurrency: int | None = None) -> list[SummaryRow]:
        """Summary rows at ``concurrency`` (None: the lowest measured), ascending n."""
        if concurrency is None:
            concurrency = self.settings.concurrency[0] if self.settings.concurrency else 1
        return [r for r in self.summary if r.concurrency == concurrency]

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
            return None
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

    # -- (de)serialisation ----------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict, keys in schema order (``schema`` first)."""
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}

    @classmethod
    def from_dict(cls, data: Any, *, path: str | Path | None = None) -> "VerifyResults":
        """Build from a dict (schema /2, or /1 upgraded in memory), checking every key and every type.

        Raises:
            ResultsError: not a dict, unknown ``schema``, or keys missing, unexpected or wrongly typed (the message
                names every such key path, e.g. ``datasets[1].runs[0].tau``, and the file when ``path`` is given).
        """
        if not isinstance(data, dict):
            raise _error([("<root>", "a JSON object", data)], path)
        schema = data.get("schema")
        if schema not in (SCHEMA, SCHEMA_V1):
            raise ResultsError(f"unknown results schema {schema!r}, expected {SCHEMA!r} (or {SCHEMA_V1!r})",
                               path=path,
                               hint="this file was not written by `dsparkhub verify`, or by an incompatible version")
        v1 = schema == SCHEMA_V1
        if v1:
            data = _upgrade_v1(data)
        try:
            out = _ADAPTER.validate_json(json.dumps(data))
        except ValidationError as exc:
            raise _error([_describe_error(e) for e in exc.errors()], path) from None
        if out.method not in METHODS:
            raise ResultsError(f"key `method` is {out.method!r}, expected one of {', '.join(METHODS)}", path=path)
        if out.engine.backend not in BACKENDS:
            raise ResultsError(f"key `engine.backend` is {out.engine.backend!r}, expected one of "
                               f"{', '.join(BACKENDS)}", path=path)
        if out.settings.order not in ORDERS:
            raise ResultsError(f"key `settings.order` is {out.settings.order!r}, expected one of "
                               f"{', '.join(ORDERS)}", path=path)
        if v1:  # derived views a /1 file lacks: conditional acceptance, the latency-law check, load rows
            for ds in out.datasets:
                for run in ds.runs:
                    run.conditional_acceptance = conditional_acceptance(run.accepted_per_pos, run.num_drafts)
                    run.unreliable = assess_run(run, out.settings)
            out.summary, out.change = summarize(out.datasets, out.settings.num_speculative_tokens,
                                                out.settings.concurrency)
            out.load, out.stops_paying_at = load_rows(out.summary, out.settings.concurrency)
        return out

    def save(self, path: str | Path) -> Path:
        """Write the file atomically (temp file in the same folder, fsync, rename); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a results file is as readable as any output
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> "VerifyResults":
        """Read and check a results file (schema /2 or /1).

        Raises:
            FileNotFoundError: the file does not exist.
            ResultsError: invalid JSON, unknown schema version, a missing key or a wrongly typed value.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ResultsError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                               path=path) from None
        except UnicodeDecodeError:
            raise ResultsError("not a UTF-8 text file", path=path) from None
        return cls.from_dict(data, path=path)


_ADAPTER = TypeAdapter(VerifyResults)


def _tok(t: int | None) -> str:
    return "<end of output>" if t is None else str(t)


# ---- reading: /1 upgrade and error messages -----------------------------------------------------------------------


def _upgrade_v1(data: dict) -> dict:
    """A /1 dict in /2 shape: ``datasets[].baseline`` becomes ``baselines`` at concurrency 1; everything else new
    takes its default (derived views are recomputed after validation). Malformed parts are left for the validator,
    which names them."""
    d = copy.deepcopy(data)
    d["schema"] = SCHEMA
    for ds in d.get("datasets") if isinstance(d.get("datasets"), list) else []:
        if isinstance(ds, dict) and "baseline" in ds:
            b = ds.pop("baseline")
            if isinstance(b, dict) and isinstance(b.get("tokens_per_s"), (int, float)):
                b = {**b, "tokens_per_s_repeats": [b["tokens_per_s"]]}
            ds["baselines"] = [b]
    return d


def _error(problems: list[tuple[str, str, Any]], path) -> ResultsError:
    lines = [f"key `{k}`: " + (f"expected {exp}, found " + _shown(found) if exp else str(found))
             for k, exp, found in problems]
    extra = "" if len(lines) == 1 else f" (and {len(lines) - 1} more problem(s):\n  " + "\n  ".join(lines[1:]) + ")"
    return ResultsError(lines[0] + extra, path=path,
                        hint="results files are written by `dsparkhub verify`; do not edit them by hand")


_MISSING = object()


def _shown(found: Any) -> str:
    return "missing" if found is _MISSING else f"{type(found).__name__} {found!r}"[:120]


def _describe_error(err: dict) -> tuple[str, str, Any]:
    """(key path, expected in words, found) of one pydantic error, the key path in the schema's own spelling."""
    key, typ = _walk(err["loc"])
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return key, "", "unexpected key (the schema has no such key)"
    found = _MISSING if err["type"] == "missing" else err.get("input")
    return key or "<root>", _type_name(typ), found


def _walk(loc: tuple) -> tuple[str, Any]:
    """Follow ``loc`` through the dataclass annotations: (``datasets[1].runs[0].tau``, annotation at that key)."""
    typ: Any = VerifyResults
    parts: list[str] = []
    for item in loc:
        typ = _unwrap(typ)
        if isinstance(item, int) and typing.get_origin(typ) is list:
            parts[-1] += f"[{item}]"
            typ = typing.get_args(typ)[0]
        elif isinstance(item, str) and hasattr(typ, "__dataclass_fields__") and item in _hints(typ):
            parts.append(item)
            typ = _hints(typ)[item]
        elif isinstance(item, str) and hasattr(typ, "__dataclass_fields__"):
            parts.append(item)  # an unexpected key
            typ = None
        else:
            break  # a union member tag pydantic adds ("float", "none"): the key is complete
    return ".".join(parts), typ


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(typ):
    args = typing.get_args(typ)
    if args and type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return typ


def _type_name(typ) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "an object",
             list: "a list", None: "a value"}
    args = typing.get_args(typ)
    if args and type(None) in args:
        return f"{_type_name(_unwrap(typ))} or null"
    if typing.get_origin(typ) is list:
        inner = {int: "integers", float: "numbers", str: "strings"}.get(args[0], "JSON objects")
        return f"a list of {inner}"
    if hasattr(typ, "__dataclass_fields__"):
        return "a JSON object"
    return names.get(typ, str(typ))


# ---- building from RunStats ---------------------------------------------------------------------------------------


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
    per_user, tpot, ttft = [], [], []
    for st in repeats:
        if st.latency_s is None:
            continue
        for i, (out, lat) in enumerate(zip(st.outputs, st.latency_s)):
            first = st.ttft_s[i] if st.ttft_s is not None else None
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
                   tpot_p99_ms=_percentile(tpot, 99), ttft_p50_ms=_percentile(ttft, 50))


def _repeats(stats: RunStats | list[RunStats]) -> list[RunStats]:
    reps = [stats] if isinstance(stats, RunStats) else list(stats)
    if not reps:
        raise ResultsError("a configuration has no timed repeat")
    return reps


def build_baseline(stats: RunStats | list[RunStats], concurrency: int = 1) -> Baseline:
    """:class:`Baseline` from the run(s) without the drafter: one RunStats per repeat (medians of the timings)."""
    reps = _repeats(stats)
    tps = [s.tokens_per_s for s in reps]
    return Baseline(prompts=len(reps[0].outputs), output_tokens=reps[0].output_tokens,
                    wall_s=float(statistics.median(s.wall_s for s in reps)), tokens_per_s=statistics.median(tps),
                    concurrency=concurrency, tokens_per_s_repeats=tps, latency=latency_of(reps))


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
    )
    run.unreliable = assess_run(run, settings or Settings(0.0, 1, 0, [n]))
    return run


def _mean(values: list[float | None]) -> float | None:
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
                num_speculative_tokens=n, concurrency=c, mean_tau=_mean([r.tau for _, r in runs]),
                mean_speedup=_mean([r.speedup for _, r in runs]), mean_per_position_acceptance=per_pos,
                lossless=_verdict([r.lossless for _, r in runs]),
                mean_tokens_per_s=_mean([r.tokens_per_s for _, r in runs]),
                mean_baseline_tokens_per_s=_mean([b.tokens_per_s for b in bases if b is not None]),
                mean_per_user_tokens_per_s=_mean([r.latency.per_user_tokens_per_s_mean for _, r in runs
                                                  if r.latency is not None]),
                unreliable=[f"{ds.name}: {why}" for ds, r in runs for why in r.unreliable]))
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
                  incomplete: list[str] | None = None) -> VerifyResults:
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
    for name, source, base, by_config in runs:
        if isinstance(base, RunStats):  # batch-1 shorthand
            base, by_config = {1: [base]}, {(n, 1): [s] for n, s in by_config.items()}
        datasets.append(DatasetResult(
            name=name, source=source,
            baselines=[build_baseline(base[c], c) for c in cs if c in base],
            runs=[build_run_result(n, by_config[n, c], base[c], check_lossless=greedy, concurrency=c,
                                   settings=settings)
                  for c in cs for n in ns if (n, c) in by_config and c in base]))
    summary, change = summarize(datasets, ns, cs)
    load, stops = load_rows(summary, cs)
    lossless = _verdict([r.lossless for ds in datasets for r in ds.runs])
    return VerifyResults(
        dsparkhub_version=__version__,
        date=date or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        method=method, engine=engine, target=target, drafter=drafter, settings=settings,
        datasets=datasets, summary=summary, change=change, lossless=lossless, warnings=list(warnings or []),
        load=load, stops_paying_at=stops, incomplete=list(incomplete or []),
    )


# ---- text rendering ------------------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_summary_table(results: VerifyResults) -> str:
    """A plain-text table per concurrency, dataset rows x n: ``τ / speedup / lossless``, plus the unweighted mean
    row; an unreliable speedup carries ``?`` and its reason is listed below; with several concurrencies, a load
    table (tokens/s, per-user tokens/s, TPOT, TTFT, best n) follows.

    The CLI prints it after ``dsparkhub verify``; library code never prints.
    """
    ns = results.settings.num_speculative_tokens
    cs = results.settings.concurrency
    verdict = {True: "ok", False: "FAIL", None: "n/a"}
    out: list[str] = []
    reasons: list[str] = []
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
    out += reasons
    for row in results.load:
        out.append(f"concurrency {row.concurrency}: best n = {row.best_n if row.best_n is not None else '-'}"
                   + ("" if row.best_n is not None else " (no reliable speedup)"))
    if results.stops_paying_at is not None:
        out.append(f"the drafter does not pay from concurrency {results.stops_paying_at} on")
    out += [f"incomplete: {line}" for line in results.incomplete]
    return "\n".join(out).rstrip()


def load_table(results: VerifyResults) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the serving-load view: per concurrency and configuration (baseline, each n) the unweighted
    means over datasets of total tokens/s, per-user tokens/s (mean), TPOT p50 / p99, TTFT p50 (ms), τ and speedup."""
    head = ["concurrency", "config", "tok/s", "user tok/s", "TPOT p50/p99 ms", "TTFT p50 ms", "tau", "speedup"]
    rows = []

    def lat(items, key):
        return _mean([getattr(x.latency, key) for x in items if x is not None and x.latency is not None])

    for c in results.settings.concurrency:
        bases = [ds.baseline_at(c) for ds in results.datasets]
        rows.append([str(c), "baseline", _fmt(_mean([b.tokens_per_s for b in bases if b]), ".1f"),
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


# ---- identities ----------------------------------------------------------------------------------------------------


def target_fingerprint(folder: str | Path) -> str | None:
    """A cheap identity of a local target: sha256 over ``config.json`` and every safetensors *header*.

    Hashing a 1T-parameter target's weights would take hours, so this hashes what defines its layout and names
    (config bytes; each ``*.safetensors`` file name, size and JSON header, which holds every tensor's dtype, shape
    and offsets). Returns None when ``folder`` is not a local directory (a Hub repo id, a served model name).

    Raises:
        ResultsError: a safetensors file is shorter than the header length it declares.
    """
    import hashlib
    import struct

    folder = Path(folder)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        h.update(b"config.json\n" + config.read_bytes() + b"\n")
    for p in sorted(folder.glob("*.safetensors")):
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ResultsError(f"safetensors file is {size} bytes, too short for a header", path=p)
            (n,) = struct.unpack("<Q", head)
            header = f.read(n)
            if len(header) != n:
                raise ResultsError(f"safetensors header declares {n} bytes but the file holds {size}", path=p)
        h.update(f"{p.name} {size}\n".encode() + header + b"\n")
    return h.hexdigest()
