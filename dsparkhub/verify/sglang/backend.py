"""``verify --backend sglang-serve``: measure running SGLang 0.5.23 servers (native ``/generate`` + ``/metrics``).

The same measurements as ``vllm-serve`` (:class:`dsparkhub.verify.vllm.server.VllmServerBackend`): the drafter run
goes to ``--server-url`` (``python -m sglang.launch_server ... --speculative-algorithm DSPARK``), the baseline to
``--baseline-url`` (the same target without a drafter); one request at a time (batch 1), tokens/s from wall clocks
around the requests, lossless from the token ids.

Requests: ``POST /generate`` with ``input_ids`` (token ids) and ``sampling_params`` {``max_new_tokens``,
``temperature``, ``ignore_eos``}, ``stream: false`` (sglang 0.5.23 ``srt/managers/io_struct.py`` GenerateReqInput).
The reply carries ``output_ids`` and, on a speculative server, per-request counters in ``meta_info``
(``srt/managers/tokenizer_manager.py:3149-3172``): ``spec_verify_ct`` (verify steps), ``spec_num_proposed_drafts``
(= verify steps x (``speculative_num_draft_tokens`` - 1) = x γ) and ``spec_num_correct_drafts`` (accepted drafts,
bonus excluded), and ``spec_correct_drafts_histogram`` (entry k = verify steps that accepted exactly k drafts,
``:3193-3201``, ``managers/schedule_batch.py:1566-1572``), which gives vLLM-style per-position counts
(``accepted_per_pos[j]`` = steps accepting >= j + 1 = the histogram's sum over k > j). Those sum exactly into
:class:`~dsparkhub.verify.stats.RunStats`. The Prometheus gauges ``sglang:spec_accept_length`` (accepted + bonus
per verify step) and ``sglang:spec_accept_rate`` (``srt/observability/metrics_collector.py:511-522``) hold the last
logging interval only (``multiprocess_mode="mostrecent"``), so they are read after each run as a cross-check
(:attr:`SglangServerBackend.last_metrics`, and a mismatch with the per-request τ is an error), not summed.

Not used: ``python -m sglang.bench_serving``. It runs from ``.venv-sglang`` against a URL, but it reports text and
aggregate throughput, not the generated token ids the lossless check compares, nor per-request draft counters.
"""

from __future__ import annotations

import json
import re
import time

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.server_http import server_request
from dsparkhub.verify.stats import RunStats

__all__ = ["SglangServerBackend", "sglang_gauges"]

_GAUGE = re.compile(r'^(sglang:spec_accept_(?:length|rate))(?:\{[^}]*\})?\s+([-+0-9.eEinfNa]+)\s*$')


def sglang_gauges(text: str) -> dict[str, float]:
    """``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` from a Prometheus text page (the last sample of
    each; SGLang exports one per scheduler, and batch-1 runs have one)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _GAUGE.match(line.strip())
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


class SglangServerBackend:
    """Verify against running SGLang servers (see the module docstring).

    Args:
        base_url: the server with the drafter, e.g. ``http://127.0.0.1:30000``.
        baseline_url: the same target without a drafter (baseline and lossless check).
        timeout_s: per-HTTP-request timeout.
        ignore_eos: generate exactly ``max_new_tokens`` tokens per prompt.
        tau_tolerance: the largest difference allowed between the per-request τ and the ``/metrics`` gauge when
            both exist (the gauge covers SGLang's last logging interval, which at batch 1 is the last requests).
    """

    name = "sglang-serve"

    def __init__(self, base_url: str, *, baseline_url: str | None = None, timeout_s: float = 600.0,
                 ignore_eos: bool = False, tau_tolerance: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.baseline_url = baseline_url.rstrip("/") if baseline_url else None
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.tau_tolerance = tau_tolerance
        self.version = "sglang (server)"
        self.device = f"sglang server at {self.base_url}"
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_options(cls, base_url: str, **options) -> "SglangServerBackend":
        """The constructor ``dsparkhub.verify.runner`` calls by backend name; same arguments as ``__init__``."""
        return cls(base_url, **options)

    def _http(self, url: str, payload: dict | None = None) -> bytes:
        return server_request(
            url, payload, timeout_s=self.timeout_s, server="SGLang",
            http_hint="Check the server's log; the request follows SGLang 0.5.23's /generate.",
            start_hint="start it (`python -m sglang.launch_server --model-path TARGET --speculative-algorithm DSPARK "
                       "--speculative-draft-model-path DRAFT --enable-metrics`), wait for /health to answer, and pass "
                       "its address; or use `--backend reference`.")

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> RunStats:
        """Send each prompt alone; sum SGLang's per-request draft counters; see ``stats.Backend.run``.

        Raises:
            EngineUnavailableError: the server cannot be reached, or a baseline is asked without ``baseline_url``.
            VerifyError: HTTP error, a reply without ``output_ids``, a drafter server that counted no verify
                steps, one whose γ differs from ``num_speculative_tokens``, a baseline server that drafts, or a
                ``/metrics`` τ that disagrees with the per-request one by more than ``tau_tolerance``.
        """
        if num_speculative_tokens is None:
            if self.baseline_url is None:
                raise EngineUnavailableError(
                    "The SGLang server backend was asked for a baseline (no drafter) but has no baseline server. "
                    "Why: an SGLang server keeps the drafter it was launched with. What to do: start a second "
                    "server for the same target without --speculative-algorithm and pass it as --baseline-url.")
            root = self.baseline_url
        else:
            root = self.base_url
        outputs: list[list[int]] = []
        wall = 0.0
        verify = proposed = correct = 0
        histogram: list[int] = []
        for i, prompt in enumerate(prompts):
            payload = {"input_ids": [int(t) for t in prompt], "stream": False,
                       "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                                           "ignore_eos": self.ignore_eos, "sampling_seed": int(seed)}}
            t0 = time.perf_counter()
            body = self._http(f"{root}/generate", payload)
            wall += time.perf_counter() - t0
            reply = json.loads(body)
            if isinstance(reply, list):
                reply = reply[0] if reply else {}
            if reply.get("output_ids") is None:
                raise VerifyError(f"SGLang server {root} returned no output_ids for prompt {i} "
                                  f"(response: {body[:300]!r}).",
                                  hint="dsparkhub sends token ids (input_ids) to SGLang's native /generate; an "
                                       "OpenAI-only endpoint does not answer with output_ids.")
            outputs.append([int(t) for t in reply["output_ids"]])
            meta = reply.get("meta_info") or {}
            verify += int(meta.get("spec_verify_ct") or 0)
            proposed += int(meta.get("spec_num_proposed_drafts") or 0)
            correct += int(meta.get("spec_num_correct_drafts") or 0)
            for k, count in enumerate(meta.get("spec_correct_drafts_histogram") or []):
                histogram.extend([0] * (k + 1 - len(histogram)))
                histogram[k] += int(count)
        self.last_metrics = sglang_gauges(self._http(f"{root}/metrics").decode(errors="replace"))
        if num_speculative_tokens is not None:
            if verify == 0:
                raise VerifyError(
                    f"SGLang server {root} generated {sum(map(len, outputs))} tokens but reported no verify steps "
                    "(meta_info.spec_verify_ct): it runs without a drafter.",
                    hint="Start the drafter server with --speculative-algorithm DSPARK and pass the baseline "
                         "separately.")
            if proposed % verify or proposed // verify != num_speculative_tokens:
                raise VerifyError(
                    f"SGLang server {root} proposes {proposed / verify:g} draft tokens per verify step but "
                    f"num_speculative_tokens={num_speculative_tokens} was asked; the server's γ is fixed at launch "
                    "(--speculative-dspark-block-size γ; SGLang verifies γ + 1).",
                    hint="Verify only the n the server was started with, or restart it with that γ.")
            if sum(histogram) != verify or len(histogram) > num_speculative_tokens + 1:
                raise VerifyError(
                    f"SGLang server {root}: meta_info.spec_correct_drafts_histogram counts {sum(histogram)} verify "
                    f"steps over {len(histogram)} bins, spec_verify_ct {verify}, n {num_speculative_tokens}",
                    hint="dsparkhub reads SGLang 0.5.23's per-request counters; another version may differ.")
            per_pos = [sum(histogram[j + 1:]) for j in range(num_speculative_tokens)]
            gauge = self.last_metrics.get("sglang:spec_accept_length")
            tau = sum(map(len, outputs)) / verify
            if self.tau_tolerance is not None and gauge and abs(gauge - tau) > self.tau_tolerance:
                raise VerifyError(f"SGLang server {root}: sglang:spec_accept_length is {gauge:.3f} but the "
                                  f"per-request counters give {tau:.3f}", hint="another client is using the server?")
        else:
            per_pos = []
        if num_speculative_tokens is None and verify:
            raise VerifyError(f"baseline server {root} reported {verify} verify steps: it runs a drafter.",
                              hint="Point --baseline-url at a server without --speculative-algorithm.")
        return RunStats(outputs=outputs, wall_s=wall, num_drafts=verify, num_draft_tokens=proposed,
                        num_accepted_tokens=correct, accepted_per_pos=per_pos)

    def close(self) -> None:
        """Nothing to release: the servers belong to the user."""
