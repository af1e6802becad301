"""A closed loop over vLLM's engine API: exactly ``c`` requests in flight until the prompts run out.

``--backend vllm --concurrency C`` (:mod:`dsparkhub.verify.vllm.child`) drives ``LLM.llm_engine`` with it: vLLM's own
scheduler batches whatever is in flight (the engine is started with ``max_num_seqs`` >= the run's highest
concurrency), and every finished request is replaced by the next prompt at once, as a load generator with
``--max-concurrency c`` would. The engine API used (vLLM 0.32 and 0.34 ``vllm/v1/engine/llm_engine.py``):
``add_request(request_id, prompt, params)`` (:229), ``step() -> list[RequestOutput]`` (:319) and
``has_unfinished_requests()`` (:203); ``RequestOutput.request_id`` is the id given to ``add_request`` (vLLM adds a
random suffix internally only, ``v1/engine/input_processor.py`` ``assign_request_id``). The contract lists them
(``contract.yaml`` ``touches.engine``).

No vLLM import here: the engine is any object with those three methods (tests pass a stand-in).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence


class StepEngine(Protocol):
    """What the loop needs of vLLM's ``LLMEngine``."""

    def add_request(self, request_id: str, prompt: Any, params: Any) -> Any: ...

    def step(self) -> list: ...

    def has_unfinished_requests(self) -> bool: ...


@dataclass
class LoopRun:
    """What one closed-loop run measured.

    Attributes:
        outputs: the engine's finished output object per prompt, in prompt order (vLLM: ``RequestOutput``).
        wall_s: seconds from the first ``add_request`` to the step that finished the last request.
        request_s: per prompt, seconds from its ``add_request`` to the step that finished it.
        peak_in_flight: the most requests in flight at once (``min(concurrency, prompts)`` in a full run).
        steps: ``step()`` calls made.
    """

    outputs: list[Any]
    wall_s: float
    request_s: list[float]
    peak_in_flight: int
    steps: int


class LoopStalledError(RuntimeError):
    """The engine has no unfinished requests while the loop still waits for some (a request was lost)."""


def run_closed_loop(engine: StepEngine, prompts: Sequence[Any], params: Callable[[int], Any], concurrency: int, *,
                    tag: str = "r", clock: Callable[[], float] = time.perf_counter,
                    on_finish: Callable[[int], None] | None = None) -> LoopRun:
    """Generate every prompt with at most (and, while prompts remain, exactly) ``concurrency`` in flight.

    Args:
        engine: vLLM's ``LLMEngine`` (``LLM.llm_engine``) or a stand-in with the same three methods.
        prompts: what ``add_request`` takes as its prompt, one per request (vLLM: ``TokensPrompt``).
        params: prompt index -> its sampling parameters (vLLM ``SamplingParams`` with ``output_kind`` FINAL_ONLY,
            so ``step`` returns each request once, finished; the seed per prompt is the caller's).
        concurrency: requests kept in flight, >= 1.
        tag: request id prefix (ids are ``f"{tag}-{index}"``), unique per run so ids never repeat in one engine.
        clock: seconds, monotonic (tests pass a fake).
        on_finish: called with the prompt index of each request as it finishes (progress).

    Returns:
        :class:`LoopRun`, outputs in prompt order.

    Raises:
        ValueError: ``concurrency`` below 1, or ``step`` returned an id this run never added.
        LoopStalledError: the engine reports no unfinished requests while some were never returned finished.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, found {concurrency}")
    ids = {f"{tag}-{i}": i for i in range(len(prompts))}
    outputs: list[Any] = [None] * len(prompts)
    started: list[float] = [0.0] * len(prompts)
    request_s: list[float] = [0.0] * len(prompts)
    in_flight: set[int] = set()
    nxt, peak, steps = 0, 0, 0
    t0 = t_end = clock()

    def fill() -> None:
        nonlocal nxt, peak
        while nxt < len(prompts) and len(in_flight) < concurrency:
            started[nxt] = clock()
            engine.add_request(f"{tag}-{nxt}", prompts[nxt], params(nxt))
            in_flight.add(nxt)
            nxt += 1
        peak = max(peak, len(in_flight))

    fill()
    if prompts:
        t0 = started[0]
    while in_flight:
        finished = [out for out in engine.step() if getattr(out, "finished", False)]
        steps += 1
        now = clock()
        for out in finished:
            i = ids.get(out.request_id)
            if i is None or i not in in_flight:
                raise ValueError(f"engine step returned request {out.request_id!r}, which this run "
                                 f"({len(prompts)} requests tagged {tag!r}) does not have in flight")
            outputs[i], request_s[i], t_end = out, now - started[i], now
            in_flight.discard(i)
            if on_finish is not None:
                on_finish(i)
        fill()
        if in_flight and not finished and not engine.has_unfinished_requests():
            raise LoopStalledError(f"the engine has no unfinished requests, but {len(in_flight)} of this run's were "
                                   f"never returned finished (prompt indices {sorted(in_flight)[:8]})")
    return LoopRun(outputs=outputs, wall_s=max(0.0, t_end - t0), request_s=request_s, peak_in_flight=peak,
                   steps=steps)
