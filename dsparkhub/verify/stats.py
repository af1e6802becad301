"""What one backend run measures: the common currency between verify backends and the results file.

A *run* is one engine configuration (no drafter, or a drafter at one ``num_speculative_tokens``) generating for one
dataset's prompts. Every backend (the reference PyTorch engine, vLLM offline, a running ``vllm serve``) returns a
:class:`RunStats`; ``dsparkhub.verify.results.derive`` turns pairs of them into the published numbers.

Counter semantics follow vLLM 0.32 ``v1/spec_decode/metrics.py``: ``num_drafts`` counts verify steps that carried
drafts, ``num_accepted_tokens`` excludes the bonus token, and ``accepted_per_pos[k]`` counts steps whose first
``k + 1`` draft tokens were all accepted (a survival count, so it is non-increasing in ``k``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class RunStats:
    """Counters and timings of one run.

    Attributes:
        outputs: generated token ids per prompt (prompt tokens excluded), in prompt order.
        wall_s: seconds of generation only (after warm-up, model loading excluded), summed over prompts.
        num_drafts: verify steps that carried at least one draft token (0 without a drafter).
        num_draft_tokens: draft tokens proposed in total.
        num_accepted_tokens: draft tokens accepted in total (bonus tokens excluded).
        accepted_per_pos: length ``num_speculative_tokens``; entry k counts steps that accepted >= k + 1 tokens.
        draft_s: seconds spent drafting (reference engine only; None where the engine does not expose it).
        verify_s: seconds spent in the target's verify forwards (reference engine only).
        steps: target forward passes during decoding (prefill excluded), when known.
        ttft_s: per prompt, seconds from the request's start to its first output token (None: not timed).
        latency_s: per prompt, seconds from the request's start to its last output token (None: not timed).
        concurrency: requests that were in flight together (1 = one at a time).
        request_drafts: per prompt, verify steps that carried drafts (None: the engine does not report requests).
        request_accepted: per prompt, draft tokens accepted (bonus excluded); with ``request_drafts`` this gives the
            per-request τ = 1 + accepted / drafts that request-weighted means average (vLLM 0.32
            ``RequestSpecDecodeMetrics``; never re-derived from outputs where the engine reports it).
    """

    outputs: list[list[int]]
    wall_s: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    draft_s: float | None = None
    verify_s: float | None = None
    steps: int | None = None
    ttft_s: list[float] | None = None
    latency_s: list[float] | None = None
    concurrency: int = 1
    request_drafts: list[int] | None = None
    request_accepted: list[int] | None = None

    @property
    def output_tokens(self) -> int:
        """Number of generated tokens over all prompts."""
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of generation wall time (0.0 when nothing was timed)."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tau(self) -> float | None:
        """Acceptance length τ = 1 + accepted / drafts (includes the bonus token); None without drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def request_taus(self) -> list[float | None] | None:
        """Per prompt τ = 1 + accepted / drafts (None for a request without drafts); None when not reported."""
        if self.request_drafts is None or self.request_accepted is None:
            return None
        return [1.0 + a / d if d else None for d, a in zip(self.request_drafts, self.request_accepted)]

    @property
    def per_position_acceptance(self) -> list[float]:
        """Per-position acceptance rate ``accepted_per_pos[k] / num_drafts`` (empty without drafts)."""
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []

    @property
    def draft_tokens_per_step(self) -> float | None:
        """Mean draft tokens proposed per verify step (< n when a confidence threshold truncates)."""
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else None


class Backend(Protocol):
    """What ``dsparkhub verify`` needs from an engine (reference PyTorch engine, vLLM offline, ``vllm serve``).

    One backend object serves one target and at most one drafter; ``run`` is called once per dataset x
    configuration. Implementations load models lazily and reuse them across calls where the engine allows.

    Attributes:
        name: ``"reference"`` | ``"vllm"`` | ``"vllm-serve"``.
        version: engine version string (``"dsparkhub 0.1.0"``, ``"vllm 0.32.0"``).
        device: what ran it, in words (``"cpu (2 threads)"``, ``"NVIDIA H200 x8"``).
    """

    name: str
    version: str
    device: str

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> RunStats:
        """Generate for every prompt (token ids), batch 1, and return the counters and generation wall time.

        ``num_speculative_tokens=None`` means no drafter (the baseline).

        Raises:
            dsparkhub.errors.VerifyError: the engine refused or crashed (message says where and what to do).
        """
        ...

    def close(self) -> None:
        """Release models / child processes."""
        ...
