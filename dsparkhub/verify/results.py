"""The results file of one ``dsparkhub verify`` run: a documented, versioned JSON schema.

This module owns the schema ``dsparkhub.verify.results/1``, the dataclasses that hold it, the arithmetic that turns
pairs of :class:`~dsparkhub.verify.stats.RunStats` (baseline, drafter at n) into the published numbers, an atomic
``save`` and a strict ``load``. It does not run engines (``runner``), read prompts (``prompts``) or render cards
(``card``); a model card is generated from these files only.

Metric definitions (FORMATS.md §8, vLLM 0.32 ``v1/spec_decode/metrics.py``):

- acceptance length τ = 1 + num_accepted_tokens / num_drafts (includes the bonus token);
- per-position acceptance[k] = accepted_per_pos[k] / num_drafts (k = 0 is the first draft position; non-increasing);
- draft tokens per step = num_draft_tokens / num_drafts (< n when a confidence threshold truncates proposals);
- speedup = output tokens/s with the drafter / output tokens/s without it, same prompts, same settings, batch 1;
- lossless = with temperature 0 every prompt's output is token-identical with and without the drafter
  (``null`` when temperature > 0: sampled outputs are not comparable token by token);
- summary means are *unweighted* over datasets (each dataset counts once whatever its prompt count), as the
  published tables quoted in FORMATS.md §9 are.

Schema (every key is required unless marked optional; ``null`` is allowed where the type says ``| null``):

=========================================  ===================  ====================================================
key                                        type                 meaning
=========================================  ===================  ====================================================
schema                                     str                  ``"dsparkhub.verify.results/1"``
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
drafter.fingerprint                        str | null           ``dsparkhub.hashing.checkpoint_fingerprint``
settings.batch_size                        int                  always 1
settings.temperature                       float                sampling temperature (0 = greedy)
settings.max_new_tokens                    int                  generation cap per prompt
settings.seed                              int                  sampling seed
settings.num_speculative_tokens            list[int]            the n values measured, ascending
settings.tensor_parallel_size              int                  target tensor-parallel size
settings.max_model_len                     int | null           engine context length
settings.compilation_config                dict | null          vLLM compilation config (``null`` = engine default)
settings.confidence_threshold              float | null         proposal truncation threshold (reference engine)
datasets[].name                            str                  dataset name (file stem or given name)
datasets[].source                          str                  where the prompts came from (``name.jsonl (sha256
                                                                0123..)``, ``builtin:x``, ``hub:o/n:file``)
datasets[].baseline.{prompts,output_tokens,wall_s,tokens_per_s}  the run without the drafter
datasets[].runs[].num_speculative_tokens   int                  n
datasets[].runs[].prompts                  int                  prompts generated
datasets[].runs[].output_tokens            int                  tokens generated with the drafter
datasets[].runs[].wall_s                   float                generation seconds with the drafter
datasets[].runs[].num_drafts               int                  raw vLLM-style counters (deltas of this run)
datasets[].runs[].num_draft_tokens         int
datasets[].runs[].num_accepted_tokens      int
datasets[].runs[].accepted_per_pos         list[int]            length n
datasets[].runs[].tau                      float | null         acceptance length τ
datasets[].runs[].per_position_acceptance  list[float]          length n
datasets[].runs[].draft_tokens_per_step    float | null
datasets[].runs[].tokens_per_s             float                with the drafter
datasets[].runs[].baseline_tokens_per_s    float                without the drafter (copied from baseline)
datasets[].runs[].speedup                  float | null         null when the baseline timed nothing
datasets[].runs[].lossless                 bool | null          null when temperature > 0
datasets[].runs[].first_mismatch           dict | null          {prompt_index, position, expected, found}
summary[].num_speculative_tokens           int                  n
summary[].mean_tau                         float | null         unweighted mean over datasets
summary[].mean_speedup                     float | null         unweighted mean over datasets
summary[].mean_per_position_acceptance     list[float]          unweighted mean over datasets, length n
summary[].lossless                         bool | null          false if any dataset failed at this n
change                                     dict | null          {from_n, to_n, tau_delta, speedup_delta} of the
                                                                summary means, smallest to largest n (null if one n)
lossless                                   bool | null          false if any run failed; null if none was checked
warnings                                   list[str]            optional (default ``[]``): the validation and
                                                                prompt warnings printed when the run started, e.g.
                                                                ``[DSH401] ...`` (the card lists them)
=========================================  ===================  ====================================================

In ``first_mismatch`` ``expected`` is the token without the drafter and ``found`` the token with it; either is
``null`` where that output had already ended (one output is a strict prefix of the other).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import LosslessMismatchError, ResultsError
from .stats import RunStats

SCHEMA = "dsparkhub.verify.results/1"
METHODS = ("dspark", "dflash", "eagle3")
BACKENDS = ("reference", "vllm", "vllm-serve")


# ---- dataclasses ------------------------------------------------------------------------------------------------


@dataclass
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


@dataclass
class EngineInfo:
    """Which engine produced the numbers: backend name, engine version, device in words."""

    backend: str
    version: str
    device: str


@dataclass
class ModelRef:
    """A model's identity: ``id`` (folder path or Hub repo id) and a content fingerprint (None when not local)."""

    id: str
    fingerprint: str | None


@dataclass
class Settings:
    """Engine and sampling settings every run of the file shares (see the module table)."""

    temperature: float
    max_new_tokens: int
    seed: int
    num_speculative_tokens: list[int]
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    compilation_config: dict | None = None
    confidence_threshold: float | None = None
    batch_size: int = 1


@dataclass
class Baseline:
    """The run without the drafter for one dataset."""

    prompts: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float


@dataclass
class RunResult:
    """One dataset x one ``num_speculative_tokens``: counters, derived metrics and the lossless verdict."""

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


@dataclass
class DatasetResult:
    """Every configuration measured on one dataset."""

    name: str
    source: str
    baseline: Baseline
    runs: list[RunResult]

    def run(self, n: int) -> RunResult | None:
        """The run at ``num_speculative_tokens == n``, or None."""
        return next((r for r in self.runs if r.num_speculative_tokens == n), None)


@dataclass
class SummaryRow:
    """Unweighted means over datasets at one ``num_speculative_tokens``."""

    num_speculative_tokens: int
    mean_tau: float | None
    mean_speedup: float | None
    mean_per_position_acceptance: list[float]
    lossless: bool | None


@dataclass
class Change:
    """Change of the summary means from the smallest to the largest n (``to - from``)."""

    from_n: int
    to_n: int
    tau_delta: float | None
    speedup_delta: float | None


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, which races with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@dataclass
class VerifyResults:
    """A whole results file (schema ``dsparkhub.verify.results/1``; see the module docstring for every key)."""

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
    schema: str = SCHEMA

    # -- views ---------------------------------------------------------------------------------------------------

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
        return LosslessMismatchError(
            f"greedy output with the drafter (num_speculative_tokens={run.num_speculative_tokens}) differs from "
            f"the target alone on dataset {name!r}, prompt {m.prompt_index}, output position {m.position}: "
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
        """Build from a dict, checking the schema version, every required key and every type.

        Raises:
            ResultsError: not a dict, unknown ``schema``, a missing key or a value of the wrong type (the message
                names the key path, e.g. ``datasets[1].runs[0].tau``, and the file when ``path`` is given).
        """
        r = _Reader(path)
        r.obj(data, "")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ResultsError(f"unknown results schema {schema!r}, expected {SCHEMA!r}", path=path,
                               hint="this file was not written by `dsparkhub verify`, or by an incompatible version")
        settings = r.get(data, "settings", dict)
        s_path = "settings"
        out = cls(
            schema=schema,
            dsparkhub_version=r.get(data, "dsparkhub_version", str),
            date=r.get(data, "date", str),
            method=r.get(data, "method", str),
            engine=EngineInfo(**{k: r.get(r.get(data, "engine", dict), k, str, "engine")
                                 for k in ("backend", "version", "device")}),
            target=_model_ref(r, data, "target"),
            drafter=_model_ref(r, data, "drafter"),
            settings=Settings(
                temperature=r.get(settings, "temperature", float, s_path),
                max_new_tokens=r.get(settings, "max_new_tokens", int, s_path),
                seed=r.get(settings, "seed", int, s_path),
                num_speculative_tokens=r.get(settings, "num_speculative_tokens", list[int], s_path),
                tensor_parallel_size=r.get(settings, "tensor_parallel_size", int, s_path),
                max_model_len=r.get(settings, "max_model_len", int | None, s_path),
                compilation_config=r.get(settings, "compilation_config", dict | None, s_path),
                confidence_threshold=r.get(settings, "confidence_threshold", float | None, s_path),
                batch_size=r.get(settings, "batch_size", int, s_path),
            ),
            datasets=[_dataset(r, d, f"datasets[{i}]")
                      for i, d in enumerate(r.get(data, "datasets", list))],
            summary=[_summary_row(r, d, f"summary[{i}]")
                     for i, d in enumerate(r.get(data, "summary", list))],
            change=_change(r, r.get(data, "change", dict | None)),
            lossless=r.get(data, "lossless", bool | None),
            warnings=r.get(data, "warnings", list[str]) if "warnings" in data else [],
        )
        if out.method not in METHODS:
            raise ResultsError(f"key `method` is {out.method!r}, expected one of {', '.join(METHODS)}", path=path)
        if out.engine.backend not in BACKENDS:
            raise ResultsError(f"key `engine.backend` is {out.engine.backend!r}, expected one of "
                               f"{', '.join(BACKENDS)}", path=path)
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
        """Read and check a results file.

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


def _tok(t: int | None) -> str:
    return "<end of output>" if t is None else str(t)


# ---- strict reading ---------------------------------------------------------------------------------------------


class _Reader:
    """Typed key access that names the file and the key path in every error."""

    def __init__(self, path):
        self.path = path

    def fail(self, key: str, expected: str, found: Any) -> ResultsError:
        shown = "missing" if found is _MISSING else f"{type(found).__name__} {found!r}"[:120]
        return ResultsError(f"key `{key}`: expected {expected}, found {shown}", path=self.path,
                            hint="results files are written by `dsparkhub verify`; do not edit them by hand")

    def obj(self, value, where: str) -> None:
        if not isinstance(value, dict):
            raise self.fail(where or "<root>", "a JSON object", value)

    def get(self, data: dict, key: str, typ, where: str = ""):
        full = f"{where}.{key}" if where else key
        self.obj(data, where)
        value = data.get(key, _MISSING)
        if value is _MISSING:
            raise self.fail(full, _type_name(typ), _MISSING)
        if not _check(value, typ):
            raise self.fail(full, _type_name(typ), value)
        if typ is float or typ == (float | None):
            return float(value) if value is not None else None
        if typ == list[float]:
            return [float(v) for v in value]
        return value


_MISSING = object()


def _check(value, typ) -> bool:
    if typ == (int | None):
        return value is None or _check(value, int)
    if typ == (float | None):
        return value is None or _check(value, float)
    if typ == (bool | None):
        return value is None or isinstance(value, bool)
    if typ == (dict | None):
        return value is None or isinstance(value, dict)
    if typ == (str | None):
        return value is None or isinstance(value, str)
    if typ == list[int]:
        return isinstance(value, list) and all(_check(v, int) for v in value)
    if typ == list[float]:
        return isinstance(value, list) and all(_check(v, float) for v in value)
    if typ == list[str]:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, typ)


def _type_name(typ) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "an object",
             list: "a list"}
    if typ in names:
        return names[typ]
    if typ == list[int]:
        return "a list of integers"
    if typ == list[float]:
        return "a list of numbers"
    if typ == list[str]:
        return "a list of strings"
    base = next(t for t in typ.__args__ if t is not type(None))  # X | None
    return f"{names[base]} or null"


def _model_ref(r: _Reader, data: dict, key: str) -> ModelRef:
    d = r.get(data, key, dict)
    return ModelRef(id=r.get(d, "id", str, key), fingerprint=r.get(d, "fingerprint", str | None, key))


def _dataset(r: _Reader, d, where: str) -> DatasetResult:
    r.obj(d, where)
    b = r.get(d, "baseline", dict, where)
    bw = f"{where}.baseline"
    return DatasetResult(
        name=r.get(d, "name", str, where),
        source=r.get(d, "source", str, where),
        baseline=Baseline(prompts=r.get(b, "prompts", int, bw), output_tokens=r.get(b, "output_tokens", int, bw),
                          wall_s=r.get(b, "wall_s", float, bw), tokens_per_s=r.get(b, "tokens_per_s", float, bw)),
        runs=[_run(r, x, f"{where}.runs[{i}]") for i, x in enumerate(r.get(d, "runs", list, where))],
    )


def _run(r: _Reader, d, w: str) -> RunResult:
    r.obj(d, w)
    m = r.get(d, "first_mismatch", dict | None, w)
    mw = f"{w}.first_mismatch"
    return RunResult(
        num_speculative_tokens=r.get(d, "num_speculative_tokens", int, w),
        prompts=r.get(d, "prompts", int, w),
        output_tokens=r.get(d, "output_tokens", int, w),
        wall_s=r.get(d, "wall_s", float, w),
        num_drafts=r.get(d, "num_drafts", int, w),
        num_draft_tokens=r.get(d, "num_draft_tokens", int, w),
        num_accepted_tokens=r.get(d, "num_accepted_tokens", int, w),
        accepted_per_pos=r.get(d, "accepted_per_pos", list[int], w),
        tau=r.get(d, "tau", float | None, w),
        per_position_acceptance=r.get(d, "per_position_acceptance", list[float], w),
        draft_tokens_per_step=r.get(d, "draft_tokens_per_step", float | None, w),
        tokens_per_s=r.get(d, "tokens_per_s", float, w),
        baseline_tokens_per_s=r.get(d, "baseline_tokens_per_s", float, w),
        speedup=r.get(d, "speedup", float | None, w),
        lossless=r.get(d, "lossless", bool | None, w),
        first_mismatch=None if m is None else Mismatch(
            prompt_index=r.get(m, "prompt_index", int, mw), position=r.get(m, "position", int, mw),
            expected=r.get(m, "expected", int | None, mw), found=r.get(m, "found", int | None, mw)),
    )


def _summary_row(r: _Reader, d, w: str) -> SummaryRow:
    r.obj(d, w)
    return SummaryRow(
        num_speculative_tokens=r.get(d, "num_speculative_tokens", int, w),
        mean_tau=r.get(d, "mean_tau", float | None, w),
        mean_speedup=r.get(d, "mean_speedup", float | None, w),
        mean_per_position_acceptance=r.get(d, "mean_per_position_acceptance", list[float], w),
        lossless=r.get(d, "lossless", bool | None, w),
    )


def _change(r: _Reader, d) -> Change | None:
    if d is None:
        return None
    return Change(from_n=r.get(d, "from_n", int, "change"), to_n=r.get(d, "to_n", int, "change"),
                  tau_delta=r.get(d, "tau_delta", float | None, "change"),
                  speedup_delta=r.get(d, "speedup_delta", float | None, "change"))


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


def build_baseline(stats: RunStats) -> Baseline:
    """:class:`Baseline` from the run without the drafter."""
    return Baseline(prompts=len(stats.outputs), output_tokens=stats.output_tokens, wall_s=float(stats.wall_s),
                    tokens_per_s=stats.tokens_per_s)


def build_run_result(n: int, spec: RunStats, baseline: RunStats, *, check_lossless: bool) -> RunResult:
    """Derive the published numbers of one configuration from its counters and the same dataset's baseline.

    Args:
        n: ``num_speculative_tokens`` of ``spec``.
        spec: the run with the drafter.
        baseline: the run without the drafter on the same prompts.
        check_lossless: compare outputs token by token (only meaningful for greedy decoding).

    Raises:
        ResultsError: ``accepted_per_pos`` is not of length n, or the runs covered different prompt counts.
    """
    if len(spec.accepted_per_pos) != n:
        raise ResultsError(f"the backend returned accepted_per_pos of length {len(spec.accepted_per_pos)} for "
                           f"num_speculative_tokens={n}; expected {n} entries (one per draft position)")
    mismatch = first_mismatch(baseline.outputs, spec.outputs) if check_lossless else None
    base_tps = baseline.tokens_per_s
    return RunResult(
        num_speculative_tokens=n,
        prompts=len(spec.outputs),
        output_tokens=spec.output_tokens,
        wall_s=float(spec.wall_s),
        num_drafts=spec.num_drafts,
        num_draft_tokens=spec.num_draft_tokens,
        num_accepted_tokens=spec.num_accepted_tokens,
        accepted_per_pos=list(spec.accepted_per_pos),
        tau=spec.tau,
        per_position_acceptance=spec.per_position_acceptance,
        draft_tokens_per_step=spec.draft_tokens_per_step,
        tokens_per_s=spec.tokens_per_s,
        baseline_tokens_per_s=base_tps,
        speedup=spec.tokens_per_s / base_tps if base_tps > 0 else None,
        lossless=(mismatch is None) if check_lossless else None,
        first_mismatch=mismatch,
    )


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(datasets: list[DatasetResult], ns: list[int]) -> tuple[list[SummaryRow], Change | None]:
    """Unweighted means over datasets per n, and the change of those means from the smallest to the largest n."""
    rows = []
    for n in ns:
        runs = [r for r in (ds.run(n) for ds in datasets) if r is not None]
        per_pos = [sum(r.per_position_acceptance[k] for r in runs if r.per_position_acceptance) /
                   max(1, sum(1 for r in runs if r.per_position_acceptance))
                   for k in range(n)] if any(r.per_position_acceptance for r in runs) else []
        verdicts = [r.lossless for r in runs]
        lossless = False if False in verdicts else (True if runs and all(v is True for v in verdicts) else None)
        rows.append(SummaryRow(num_speculative_tokens=n, mean_tau=_mean([r.tau for r in runs]),
                               mean_speedup=_mean([r.speedup for r in runs]),
                               mean_per_position_acceptance=per_pos, lossless=lossless))
    change = None
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        change = Change(from_n=a.num_speculative_tokens, to_n=b.num_speculative_tokens,
                        tau_delta=b.mean_tau - a.mean_tau if None not in (a.mean_tau, b.mean_tau) else None,
                        speedup_delta=(b.mean_speedup - a.mean_speedup
                                       if None not in (a.mean_speedup, b.mean_speedup) else None))
    return rows, change


def build_results(*, engine: EngineInfo, method: str, target: ModelRef, drafter: ModelRef, settings: Settings,
                  runs: list[tuple[str, str, RunStats, dict[int, RunStats]]],
                  date: str | None = None, warnings: list[str] | None = None) -> VerifyResults:
    """Assemble a :class:`VerifyResults` from RunStats.

    Args:
        engine / method / target / drafter / settings: as in the schema.
        runs: per dataset ``(name, source, baseline RunStats, {n: RunStats with the drafter})``.
        date: UTC ISO time; now when None.
        warnings: the warnings printed when the run started (stored as ``warnings``).

    Lossless verdicts are computed only when ``settings.temperature == 0``.

    Raises:
        ResultsError: a run's counters do not fit its n (see :func:`build_run_result`), or ``method`` is unknown.
    """
    if method not in METHODS:
        raise ResultsError(f"unknown method {method!r}, expected one of {', '.join(METHODS)}")
    greedy = settings.temperature == 0
    ns = sorted(settings.num_speculative_tokens)
    datasets = [DatasetResult(name=name, source=source, baseline=build_baseline(base),
                              runs=[build_run_result(n, by_n[n], base, check_lossless=greedy)
                                    for n in ns if n in by_n])
                for name, source, base, by_n in runs]
    summary, change = summarize(datasets, ns)
    verdicts = [r.lossless for ds in datasets for r in ds.runs]
    lossless = False if False in verdicts else (True if verdicts and all(verdicts) else None)
    return VerifyResults(
        dsparkhub_version=__version__,
        date=date or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        method=method, engine=engine, target=target, drafter=drafter,
        settings=Settings(**{**asdict(settings), "num_speculative_tokens": ns}),
        datasets=datasets, summary=summary, change=change, lossless=lossless, warnings=list(warnings or []),
    )


# ---- text rendering ------------------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def format_summary_table(results: VerifyResults) -> str:
    """A plain-text table, dataset rows x n: ``τ / speedup / lossless``, plus the unweighted mean row.

    The CLI prints it after ``dsparkhub verify``; library code never prints.
    """
    ns = results.settings.num_speculative_tokens
    verdict = {True: "ok", False: "FAIL", None: "n/a"}
    head = ["dataset"] + [f"n={n}: tau / speedup / lossless" for n in ns]
    rows = []
    for ds in results.datasets:
        cells = [ds.name]
        for n in ns:
            r = ds.run(n)
            cells.append("-" if r is None else
                         f"{_fmt(r.tau)} / {_fmt(r.speedup, '.2f', 'x')} / {verdict[r.lossless]}")
        rows.append(cells)
    mean = ["mean (unweighted)"]
    for row in results.summary:
        mean.append(f"{_fmt(row.mean_tau)} / {_fmt(row.mean_speedup, '.2f', 'x')} / {verdict[row.lossless]}")
    rows.append(mean)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
