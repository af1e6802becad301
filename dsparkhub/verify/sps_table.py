"""The SPS cost table SGLang 0.5.23's DSpark scheduler reads (``--speculative-dspark-sps-table-path``), from measured
step costs, labelled with the engine and hardware they came from.

Schema: SGLang 0.5.23 ``srt/speculative/dspark_components/dspark_sps.py`` ``SpsCostTable`` (lines 14-48):
``sample_batch_tokens`` (strictly increasing ints >= 1: requests x verify tokens of a step), ``sample_steps_per_sec``
(same length: decode steps per second at that size) and ``max_batch_tokens`` (>= the largest probe); SGLang looks a
size up at the probe at or below it. ``benchmark/dspark_sps_profiler.py`` fills it with ``batch_tokens =
requests x verify_num_draft_tokens`` and ``steps_per_sec = 1 / median(step time)``, one median per batch-token
count (``_fit_sps_table``); :meth:`dsparkhub.verify.costs.StepCosts.sps_probes` measures the same on the reference
engine. msgspec ignores unknown keys, so the labels ride along: ``format`` (``dsparkhub.sps/1``), ``engine``,
``hardware``, ``source`` (what the costs were measured on) and ``created``.

The file lives beside the release (default ``DRAFT/dspark_sps_table.json``), never inside the weights: the costs
belong to one engine on one machine, not to the drafter. A table from the reference engine on a CPU prices that
engine only; for a GPU server, SGLang's own ``dspark_sps_profiler`` is the source.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from dsparkhub.errors import OutputExistsError, VerifyError
from dsparkhub.io.output import replace_json
from dsparkhub.verify.settings import VerifyArgumentError

__all__ = ["SPS_FILE", "FORMAT", "SOURCES", "build_table", "table_problems", "write_table", "check_source",
           "engine_table"]

SPS_FILE = "dspark_sps_table.json"
FORMAT = "dsparkhub.sps/1"
#: where ``dsparkhub schedule --sps-from`` takes the table from: the reference engine's profile, vLLM's
#: ``vllm bench forward`` on this node's GPU, or SGLang's ``dspark_sps_profiler`` against a running server
SOURCES = ("reference", "vllm-forward", "sglang=URL")


def build_table(tokens: list[int], steps_per_sec: list[float], *, engine: str, hardware: str, source: str,
                max_batch_tokens: int | None = None) -> dict:
    """The table as a JSON-ready dict (SGLang's three keys first, then the labels).

    Args:
        tokens: batch tokens per probe (strictly increasing); steps_per_sec: decode steps per second per probe.
        engine / hardware / source: labels (e.g. ``"dsparkhub reference (torch 2.13)"``, ``"cpu (2 threads)"``,
            ``"profile: 64-token context, 5 replays"``).
        max_batch_tokens: default the largest probe (SGLang's ``profile_sps_table``).

    Raises:
        VerifyError: the probes break SGLang's rules (see :func:`table_problems`).
    """
    top = max_batch_tokens if max_batch_tokens is not None else (tokens[-1] if tokens else 0)
    data = {"sample_batch_tokens": [int(t) for t in tokens],
            "sample_steps_per_sec": [float(s) for s in steps_per_sec], "max_batch_tokens": int(top),
            "format": FORMAT, "engine": engine, "hardware": hardware, "source": source,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    problems = table_problems(data)
    if problems:
        raise VerifyError("the measured costs do not make an SPS table SGLang can read: " + "; ".join(problems))
    return data


def table_problems(data) -> list[str]:
    """What SGLang 0.5.23's ``SpsCostTable`` (typed msgspec decode + ``__post_init__``) would refuse; [] if it loads."""
    if not isinstance(data, dict):
        return [f"expected a JSON object, found {type(data).__name__}"]
    out = []
    tokens, sps, top = data.get("sample_batch_tokens"), data.get("sample_steps_per_sec"), data.get("max_batch_tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in tokens):
        out.append("`sample_batch_tokens` must be a non-empty list of integers")
    elif tokens != sorted(set(tokens)):
        out.append(f"`sample_batch_tokens` must be strictly increasing, found {tokens}")
    if not isinstance(sps, list) or not all(isinstance(s, (int, float)) and not isinstance(s, bool)
                                            and math.isfinite(s) for s in sps):
        out.append("`sample_steps_per_sec` must be a list of finite numbers")
    elif isinstance(tokens, list) and len(sps) != len(tokens):
        out.append(f"`sample_steps_per_sec` has {len(sps)} entries for {len(tokens)} probes")
    if not isinstance(top, int) or isinstance(top, bool):
        out.append("`max_batch_tokens` must be an integer")
    elif isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens) and top < max(tokens):
        out.append(f"`max_batch_tokens` {top} is below the largest probe {max(tokens)}")
    return out


def write_table(data: dict, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the table atomically (temp file beside it, then rename).

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is False.
        VerifyError: ``data`` would not load in SGLang (:func:`table_problems`).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputExistsError("an SPS table already exists", path=path,
                                hint="pass --overwrite to replace it, or --sps-out another path")
    problems = table_problems(data)
    if problems:
        raise VerifyError("refusing to write an SPS table SGLang cannot read: " + "; ".join(problems), path=path)
    return replace_json(path, data)


def check_source(sps_from: str) -> None:
    """Refuse an unknown ``--sps-from`` before anything runs.

    Raises:
        VerifyArgumentError: not ``reference``, ``vllm-forward`` or ``sglang=http(s)://...``.
    """
    if sps_from in ("reference", "vllm-forward"):
        return
    url = sps_from.partition("=")[2] if sps_from.startswith("sglang=") else ""
    if not url.startswith(("http://", "https://")):
        raise VerifyArgumentError(f"--sps-from {sps_from!r}: expected one of reference, vllm-forward, "
                                  "sglang=http://HOST:PORT (a running SGLang DSpark server)")


def engine_table(sps_from: str, *, draft: str | Path, target: str | Path, n: int, requests: list[int],
                 context: int) -> dict:
    """The table from a serving engine's own step costs (``--sps-from vllm-forward`` or ``sglang=URL``).

    Args:
        draft / target: the drafter folder and the target (folder or Hub id) vLLM loads; n: verify widths 0 .. n;
        requests: request counts (batch sizes) to time; context: tokens of context per request (vLLM only).

    Raises:
        VerifyArgumentError: an unknown source (:func:`check_source`).
        VerifyError: SGLang's table would not load in its reader (:func:`table_problems`).
        EngineUnavailableError / VerifyError: what :func:`dsparkhub.verify.vllm.bench_forward.bench_forward` or
            :func:`dsparkhub.verify.sglang.sps_profiler.profile_sps` raise.
    """
    check_source(sps_from)
    if sps_from == "vllm-forward":
        from dsparkhub.verify.engines import detect_method
        from dsparkhub.verify.vllm.bench_forward import bench_forward

        costs, source = bench_forward(target=str(target), draft=str(draft), method=detect_method(draft), n=n,
                                      requests=requests, context=context)
        tokens, sps = costs.sps_probes()
        return build_table(tokens, sps, engine="vllm (bench forward)", hardware=_gpu(), source=source)
    from dsparkhub.verify.sglang.sps_profiler import profile_sps

    data, source = profile_sps(base_url=sps_from.partition("=")[2], batch_sizes=requests)
    problems = table_problems(data)
    if problems:
        raise VerifyError("SGLang's dspark_sps_profiler wrote a table its reader would refuse: " + "; ".join(problems))
    return {**data, "format": FORMAT, "engine": "sglang (dspark_sps_profiler)", "hardware": "the server's GPUs",
            "source": source}


def _gpu() -> str:
    """This node's first CUDA device in words (``vllm bench forward`` runs on it)."""
    import torch

    return f"{torch.cuda.get_device_name(0)} x1" if torch.cuda.is_available() else "cuda device (name unknown)"
