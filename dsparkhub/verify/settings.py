"""What a ``dsparkhub verify`` run measures and how: the typed settings the CLI (and the pipeline) build and
:func:`dsparkhub.verify.runner.run_verify` takes, and the usage errors their checks raise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from dsparkhub.errors import DsparkhubError, EngineUnavailableError
from dsparkhub.verify.results.schema import DEFAULT_SPREAD_LIMIT


@dataclass(frozen=True)
class LoadOptions:
    """How a verify run is timed: the concurrency axis and the repeats (the honest-timing settings).

    Attributes:
        concurrency: requests in flight together, each measured (``--concurrency 1,8,32``); every value >= 1.
        repeats: timed repeats of every configuration (``--repeats``); speedups are medians of per-repeat ratios.
        spread_limit: (max - min) / median of the per-repeat speedups above which a speedup is marked unreliable.
        intra_op_threads: torch intra-op threads for the reference engine on CPU; None chooses by model size
            (:func:`dsparkhub.torch_threads.threads_for`).
        driver: how a concurrency above 1 is driven (``--load-driver``): None is the engine's own default
            (:attr:`dsparkhub.serving.Engine.batching`); ``"bench-serve"`` picks ``vllm serve`` + ``vllm bench
            serve`` for ``--backend vllm`` (its ``other_batching``).
    """

    concurrency: tuple[int, ...] = (1,)
    repeats: int = 1
    spread_limit: float = DEFAULT_SPREAD_LIMIT
    intra_op_threads: int | None = None
    driver: str | None = None

    def checked(self) -> "LoadOptions":
        """The options with ``concurrency`` sorted.

        Raises:
            VerifyArgumentError: a concurrency below 1 or repeated, repeats below 1, a negative spread limit or
                thread count below 1.
        """
        cs = sorted(set(int(c) for c in self.concurrency))
        if not cs or cs[0] < 1 or len(cs) != len(list(self.concurrency)):
            raise VerifyArgumentError(f"concurrency must be distinct positive integers, found {list(self.concurrency)}")
        if self.repeats < 1:
            raise VerifyArgumentError(f"repeats must be at least 1, found {self.repeats}")
        if self.spread_limit < 0:
            raise VerifyArgumentError(f"spread_limit must be >= 0, found {self.spread_limit}")
        if self.intra_op_threads is not None and self.intra_op_threads < 1:
            raise VerifyArgumentError(f"intra_op_threads must be at least 1, found {self.intra_op_threads}")
        return LoadOptions(tuple(cs), self.repeats, self.spread_limit, self.intra_op_threads, self.driver)


@dataclass(frozen=True)
class VerifySettings:
    """Everything a verify run measures and the engine settings it records (the ``settings`` of the results file).

    Attributes:
        num_speculative_tokens: the n values to measure (each gets its own run per dataset).
        datasets: ``--datasets`` specs (see ``prompts.parse_dataset_specs``); None = built-in smoke set.
        max_new_tokens: generation cap per prompt.
        temperature: 0 = greedy (lossless check on); > 0 samples and skips the lossless check.
        seed: sampling seed.
        max_prompts: cap per dataset.
        method: ``dspark`` | ``dflash`` | ``eagle3``; detected from the drafter when None (a value that
            contradicts the drafter is refused).
        device: ``cpu`` / ``cuda`` for the reference engine (None = its default).
        tensor_parallel_size / max_model_len / compilation_config: vLLM engine settings.
        pipeline_parallel_size / distributed_executor_backend / ray_address: the rest of the layout (vLLM
            ``--pipeline-parallel-size``, ``ray`` | ``mp``, the Ray cluster); checked before anything loads
            (:func:`dsparkhub.verify.parallel.layout_of`, ``check_layout``).
        confidence_threshold: proposal truncation threshold (reference engine).
        server_url / baseline_url: running servers with and without the drafter (``*-serve`` backends).
        load: concurrency axis, repeats and threads (:class:`LoadOptions`; default one request at a time, once).
        allow_beyond_context: measure even when a prompt plus ``max_new_tokens`` exceeds the target's context
            (``--max-model-len``, else its ``max_position_embeddings``); refused by default
            (:mod:`dsparkhub.verify.context`).
        baseline: what speedups are measured against, ``--baseline``: ``none`` | ``mtp:N`` | ``PATH[@n]``
            (:mod:`dsparkhub.verify.baseline`).

    The values are checked by ``run_verify`` before anything loads (``VerifyArgumentError``).
    """

    num_speculative_tokens: Sequence[int] = (3, 5, 7)
    datasets: Sequence[str] | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    max_prompts: int | None = None
    method: str | None = None
    device: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    ray_address: str | None = None
    max_model_len: int | None = None
    compilation_config: dict | None = None
    confidence_threshold: float | None = None
    server_url: str | None = None
    baseline_url: str | None = None
    load: LoadOptions = field(default_factory=LoadOptions)
    allow_beyond_context: bool = False
    baseline: str = "none"


class VerifyArgumentError(DsparkhubError, ValueError):
    """A verify argument is out of range (n values, temperature, max_new_tokens, method, results path); the CLI
    reports it as a usage error (exit 2)."""


class EngineOptionError(VerifyArgumentError, EngineUnavailableError):
    """A backend name or a setting the chosen backend does not take (``--tp`` for the reference engine,
    ``--device`` for vLLM, ``--backend vllm-serve`` without ``--server-url`` ...): a usage error (exit 2)."""
