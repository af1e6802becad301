"""vLLM's own load generator: ``vllm bench serve`` at one ``--max-concurrency``, and its result JSON read back.

Owns the prompts file, the ``vllm bench serve`` command line, the run (a child process with a timeout and a kept
log, the server's ``vllm:num_requests_running`` sampled meanwhile) and the parsing of ``--save-result
--save-detailed`` JSON (vLLM 0.32 ``benchmarks/serve.py``: ``duration``, ``completed``, ``failed``,
``total_output_tokens``, ``output_throughput``, per-request ``ttfts`` / ``latencies`` / ``output_lens`` /
``errors`` in request order, and ``spec_decode_*`` from the server's ``/metrics`` deltas).

Prompts file: vLLM's ``custom`` dataset (``benchmarks/datasets/datasets.py`` ``CustomDataset``): JSONL, one
``{"prompt": TEXT, "output_tokens": N}`` a line. dsparkhub's prompts are token ids (chat template applied), so
each is decoded to text and sent with ``--skip-chat-template``; ``--disable-shuffle`` keeps file order, so the
i-th per-request figure belongs to the i-th prompt. Every request generates exactly ``max_new_tokens``
(``--ignore-eos``, ``--custom-output-len``), as vLLM's own benchmarks do: the token counts of the baseline and the
drafter runs are then equal and tokens/s compare like for like. No warm-up and no ready-check request
(``--num-warmups 0 --ready-check-timeout-sec 0``: the caller has health-checked and warmed the server), so the
``/metrics`` deltas read around the bench cover its requests exactly.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dsparkhub.errors import VerifyError
from dsparkhub.verify.vllm.serve import display, vllm_command

__all__ = ["BenchResult", "bench_command", "parse_bench_result", "run_bench", "write_prompts_file"]

MIN_SAMPLES = 20  # ~1 s of 50 ms samples: a shorter bench is not judged for the concurrency it reached
_RUNNING = re.compile(r'^vllm:num_requests_running(?:\{([^}]*)\})?\s+([0-9.eE+-]+)', re.M)


@dataclass
class BenchResult:
    """What one ``vllm bench serve`` run measured (seconds; tokens per second).

    Attributes:
        duration_s: the benchmark's wall time (first request sent to last answer).
        completed / failed: requests that succeeded / failed.
        total_output_tokens: output tokens over all completed requests.
        output_throughput: ``total_output_tokens / duration_s`` (vLLM's "Output token throughput").
        ttfts_s / latencies_s / output_lens: per request, in prompt order (``--save-detailed``).
        errors: per request, ``""`` when it succeeded.
        max_concurrent_requests: most requests in flight at once on the client (vLLM's figure), None if absent.
        peak_running: most requests the server reported running at once (``/metrics`` sampled every 50 ms), None
            when fewer than ``MIN_SAMPLES`` samples were read (a run too short to judge).
        spec_decode: the ``spec_decode_*`` keys of the result (absent without a drafter).
        raw: the whole result JSON.
    """

    duration_s: float
    completed: int
    failed: int
    total_output_tokens: int
    output_throughput: float
    ttfts_s: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    max_concurrent_requests: int | None = None
    peak_running: int | None = None
    spec_decode: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def write_prompts_file(path: Path, texts: Sequence[str], output_tokens: int) -> Path:
    """Write vLLM's ``custom`` JSONL dataset: ``{"prompt": text, "output_tokens": output_tokens}`` per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"prompt": text, "output_tokens": int(output_tokens)}) + "\n")
    return path


def bench_command(exe: Path, *, base_url: str, model: str, tokenizer: str, dataset: Path, num_prompts: int,
                  concurrency: int, output_len: int, result_dir: Path, result_filename: str,
                  temperature: float = 0.0, seed: int = 0) -> list[str]:
    """The argv of ``vllm bench serve`` for one run at ``--max-concurrency concurrency`` (see the module docstring)."""
    return vllm_command(
        exe, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", str(int(output_len)), "--skip-chat-template", "--disable-shuffle",
        "--num-prompts", str(int(num_prompts)), "--max-concurrency", str(int(concurrency)),
        "--request-rate", "inf", "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--ignore-eos", "--temperature", str(float(temperature)),
        "--seed", str(int(seed)), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_filename,
        "--disable-tqdm")


def parse_bench_result(data: dict, *, source: str = "vllm bench serve result") -> BenchResult:
    """Read the fields dsparkhub uses from a ``--save-result --save-detailed`` JSON.

    Raises:
        VerifyError: a required key is missing or not a number (another vLLM version's format).
    """
    try:
        result = BenchResult(
            duration_s=float(data["duration"]), completed=int(data["completed"]), failed=int(data.get("failed", 0)),
            total_output_tokens=int(data["total_output_tokens"]), output_throughput=float(data["output_throughput"]),
            ttfts_s=[float(x) for x in data.get("ttfts") or []],
            latencies_s=[float(x) for x in data.get("latencies") or []],
            output_lens=[int(x) for x in data.get("output_lens") or []],
            errors=[str(x or "") for x in data.get("errors") or []],
            max_concurrent_requests=(int(data["max_concurrent_requests"])
                                     if data.get("max_concurrent_requests") is not None else None),
            spec_decode={k: v for k, v in data.items() if k.startswith("spec_decode_")}, raw=data)
    except (KeyError, TypeError, ValueError) as exc:
        raise VerifyError(f"{source} lacks or garbles {exc} (keys: {', '.join(sorted(data)[:30])}).",
                          hint="dsparkhub reads vLLM 0.32's `vllm bench serve --save-result --save-detailed` "
                               "format; use vLLM 0.32.") from exc
    return result


def _running(text: str, model: str | None) -> int:
    total = 0.0
    for labels, value in _RUNNING.findall(text):
        if model is None or f'model_name="{model}"' in labels or not labels:
            total += float(value)
    return int(total)


class _Sampler(threading.Thread):
    """Polls ``/metrics`` for ``vllm:num_requests_running`` and keeps the peak (None: never read)."""

    def __init__(self, url: str, model: str | None, every_s: float = 0.05):
        super().__init__(daemon=True)
        self.url, self.model, self.every_s = url, model, every_s
        self.peak: int | None = None
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
                    now = _running(resp.read().decode(errors="replace"), self.model)
                self.peak = now if self.peak is None else max(self.peak, now)
                self.samples += 1
            except (OSError, ValueError):
                pass
            self._halt.wait(self.every_s)

    def halt(self) -> int | None:
        """Stop; the peak, or None when fewer than ``MIN_SAMPLES`` samples were read (too short a run to judge)."""
        self._halt.set()
        self.join(timeout=10)
        return self.peak if self.samples >= MIN_SAMPLES else None


def run_bench(argv: list[str], *, result_path: Path, log: Path, base_url: str, model: str | None,
              env: dict[str, str] | None = None, timeout_s: float = 3600.0) -> BenchResult:
    """Run ``vllm bench serve`` (``argv`` from :func:`bench_command`), sampling the server meanwhile.

    Args:
        argv: the command; it must write its result to ``result_path``.
        log: the bench's stdout and stderr (appended, kept).
        base_url: the server, for the ``num_requests_running`` samples.
        model: the served model name in the server's metric labels (None: all).
        env: the full environment of the child (None: this process's).
        timeout_s: the bench is killed after this many seconds.

    Raises:
        VerifyError: the bench exited non-zero, timed out, or wrote no (readable) result; the message quotes the
            end of its log and names the log file.
    """
    import os

    log.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    sampler = _Sampler(base_url, model)
    sampler.start()
    t0 = time.monotonic()
    try:
        with open(log, "ab") as fh:
            fh.write(f"$ {display(argv)}\n".encode())
            fh.flush()
            try:
                code = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env if env is not None else dict(os.environ), timeout=timeout_s,
                                      start_new_session=True).returncode
            except subprocess.TimeoutExpired as exc:
                raise VerifyError(f"`vllm bench serve` did not finish within {timeout_s:.0f} s (log: {log}).",
                                  hint="use fewer or shorter prompts, or a larger timeout") from exc
    finally:
        peak = sampler.halt()
    tail = log.read_text(errors="replace")[-1500:].strip()
    if code != 0 or not result_path.is_file():
        said = tail.splitlines()[-1] if tail else "no output"
        raise VerifyError(f"`vllm bench serve` exited with code {code} after {time.monotonic() - t0:.0f} s without "
                          f"a result ({said}). Log: {log}.",
                          hint="read the log; the server's log sits next to it")
    try:
        data = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        raise VerifyError(f"cannot read `vllm bench serve`'s result {result_path}: {exc}") from exc
    result = parse_bench_result(data, source=str(result_path))
    result.peak_running = peak
    return result
