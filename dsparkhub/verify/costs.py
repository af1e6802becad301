"""Step costs of the reference engine, measured per step shape, and the latency law that turns them into a speedup.

DSpark's latency law: a speculative step of R requests costs ``T_draft(R) + T_verify(R, k)`` (k the verify width,
the step verifying ``R · (k + 1)`` tokens on this padded engine) and yields τ tokens per request, so the time per
token is ``L = (T_draft + T_verify) / τ``; the target alone pays ``T_target(R)`` per token. Predicted speedup
``T_target · τ / (T_draft + T_verify)``; its *ceiling* is the same with every draft accepted (τ = n + 1).

Two sources of costs, one record type (:class:`StepCosts`):

- *recorded*: the engine's own decoding steps (``ReferenceEngine.step_costs``; the batch-1 loop and ``batching``
  time the draft part and the verify part of every step, synchronised on GPU), keyed by (requests in the step,
  widest verify width; width None = a plain target step), and also by context bucket (the step's longest context
  rounded up to a power of two, :func:`context_bucket`) for the per-shape table ``dsparkhub verify`` stores;
- *profiled*: :func:`profile_costs` times synthetic steps of every shape before a run, the way vLLM 0.34 profiles
  its step-cost curves at start-up (``AdaptiveVerificationManager.batches_to_profile``, 5 replays per shape,
  medians) — what the ``budget`` and ``sps`` policies size their budget from.

``dsparkhub verify`` keeps the recorded costs of every configuration and the law per (n, concurrency) in its results
(:func:`step_costs_record`); ``dsparkhub.verify.vllm.bench_forward`` fills the same record from vLLM's own
``vllm bench forward`` on a GPU.

Not here: running policies (``dsparkhub.verify.schedule``) or writing the SPS table (``dsparkhub.verify.sps_table``).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.results.schema import LawRow, StepCostsRecord, StepShape

__all__ = ["StepCosts", "profile_costs", "LawRow", "latency_law", "law_row", "context_bucket", "step_costs_record"]

PROFILE_REPLAYS = 5  # vLLM 0.34 adaptive_verification._PROFILE_REPLAYS
SHORTFALL = 0.85  # measured below this fraction of the predicted speedup: explained
MIN_BUCKET = 16  # the smallest context bucket (tokens)


def context_bucket(tokens: int) -> int:
    """The context bucket of a step whose longest request has ``tokens`` tokens of context: the next power of two,
    at least 16 (16, 32, 64, ...; attention cost grows with the context, the weights' cost does not)."""
    return max(MIN_BUCKET, 1 << max(0, int(tokens) - 1).bit_length())


class StepCosts:
    """Seconds of draft and verify per step shape (requests x verify width [x context bucket]), medians on demand.

    Attributes:
        samples: ``{(requests, width): [(draft_s, verify_s), ...]}``, every step recorded.
        by_context: ``{(requests, width, context bucket): [(draft_s, verify_s), ...]}``, the steps recorded with
            their context.
        padded: verify slots spent on padding (rows shorter than the widest), summed.
    """

    def __init__(self):
        self.samples: dict[tuple[int, int | None], list[tuple[float, float]]] = defaultdict(list)
        self.by_context: dict[tuple[int, int | None, int], list[tuple[float, float]]] = defaultdict(list)
        self.padded = 0

    def record(self, rows: int, width: int | None, draft_s: float, verify_s: float, *, padded: int = 0,
               context: int | None = None) -> None:
        """One step: ``rows`` requests, widest verify width ``width`` (None: a target-alone step), seconds;
        ``context``: the longest request's context in tokens (positions before the step's first token)."""
        self.samples[(rows, width)].append((draft_s, verify_s))
        if context is not None:
            self.by_context[(rows, width, context_bucket(context))].append((draft_s, verify_s))
        self.padded += padded

    def merge(self, other: StepCosts) -> StepCosts:
        """Add every sample of ``other`` (another dataset or repeat of the same configuration); returns self."""
        for key, got in other.samples.items():
            self.samples[key].extend(got)
        for key, got in other.by_context.items():
            self.by_context[key].extend(got)
        self.padded += other.padded
        return self

    def clear(self) -> None:
        """Forget every sample (between runs)."""
        self.samples.clear()
        self.by_context.clear()
        self.padded = 0

    def context_shapes(self) -> list[dict]:
        """Every (requests, width, context bucket) recorded: ``{requests, width, context, steps, draft_s,
        verify_s}`` (medians), sorted; ``context`` is the bucket's upper bound in tokens."""
        out = []
        for (rows, width, bucket), got in sorted(self.by_context.items(),
                                                 key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1],
                                                                 kv[0][2])):
            out.append({"requests": rows, "width": width, "context": bucket, "steps": len(got),
                        "draft_s": statistics.median(d for d, _ in got),
                        "verify_s": statistics.median(v for _, v in got)})
        return out

    def median(self, rows: int, width: int | None) -> tuple[float, float] | None:
        """(median draft s, median verify s) of one shape; None when it never ran."""
        got = self.samples.get((rows, width))
        if not got:
            return None
        return statistics.median(d for d, _ in got), statistics.median(v for _, v in got)

    def shapes(self) -> list[dict]:
        """Every shape that ran: ``{requests, width, steps, draft_s, verify_s}`` (medians), sorted."""
        out = []
        for (rows, width), got in sorted(self.samples.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None
                                                                              else kv[0][1])):
            draft, verify = self.median(rows, width)
            out.append({"requests": rows, "width": width, "steps": len(got), "draft_s": draft, "verify_s": verify})
        return out

    def draft_curve(self) -> list[tuple[int, float]]:
        """(requests, median draft seconds) over the speculative shapes (drafting does not depend on the width)."""
        by: dict[int, list[float]] = defaultdict(list)
        for (rows, width), got in self.samples.items():
            if width is not None:
                by[rows].extend(d for d, _ in got)
        return [(r, statistics.median(v)) for r, v in sorted(by.items())]

    def verify_curve(self) -> list[tuple[int, float]]:
        """(verified tokens ``R · (k + 1)``, median verify seconds); a target-alone step counts R tokens."""
        by: dict[int, list[float]] = defaultdict(list)
        for (rows, width), got in self.samples.items():
            by[rows * ((width or 0) + 1)].extend(v for _, v in got)
        return [(t, statistics.median(v)) for t, v in sorted(by.items())]

    def sps_probes(self) -> tuple[list[int], list[float]]:
        """SGLang's probes: batch tokens ``R · (k + 1)`` -> steps per second ``1 / median(draft + verify)``
        (``dspark_sps_profiler.py``: one median per batch-token count), speculative shapes only.

        Raises:
            VerifyError: no speculative step was measured.
        """
        by: dict[int, list[float]] = defaultdict(list)
        for (rows, width), got in self.samples.items():
            if width is not None:
                by[rows * (width + 1)].extend(d + v for d, v in got)
        if not by:
            raise VerifyError("no speculative step costs measured: nothing to build an SPS table from")
        tokens = sorted(by)
        return tokens, [1.0 / statistics.median(by[t]) for t in tokens]


def profile_costs(engine, *, n: int, requests: list[int], context: int = 64, replays: int = PROFILE_REPLAYS,
                  seed: int = 0) -> StepCosts:
    """Time synthetic steps of every shape: draft n for R requests, verify R x (k + 1) for k = 0 .. n.

    Each shape runs ``replays`` times over a prefilled context of ``context`` random tokens per request (the KV cache
    is cropped back after each verify, so every replay sees the same context); one extra untimed run warms it up.

    Args:
        engine: a :class:`~dsparkhub.verify.reference.engine.ReferenceEngine` with a drafter.
        n: drafted positions; requests: request counts R to profile; context: tokens of context per request.

    Returns:
        :class:`StepCosts` with ``(R, k)`` shapes (draft seconds on every one, the same draft timing per R).

    Raises:
        VerifyError: the engine has no drafter, or ``n`` / ``requests`` / ``context`` are not positive.
    """
    from transformers import DynamicCache

    import torch

    from dsparkhub.torch_threads import torch_threads
    from dsparkhub.verify.reference.modeling import target_features

    if engine.drafter is None:
        raise VerifyError("profiling step costs needs a drafter")
    if n < 1 or context < 1 or not requests or min(requests) < 1:
        raise VerifyError(f"profile needs n >= 1, context >= 1 and request counts >= 1, found n={n}, "
                          f"context={context}, requests={requests}")
    d, dev = engine.drafter, engine._device
    gen = torch.Generator().manual_seed(seed)
    costs = StepCosts()
    with torch_threads(engine.threads), torch.inference_mode():
        for rows in sorted(set(requests)):
            ids = torch.randint(3, engine._vocab, (rows, context + 1), generator=gen).to(dev)
            cache = DynamicCache(config=engine.target.config)
            out = engine.target(input_ids=ids[:, :context], past_key_values=cache, use_cache=True,
                                output_hidden_states=True)
            feats = target_features(out.hidden_states, d.config.target_layer_ids).to(d.fc.weight.dtype)
            ctx = d.context_kv(feats, torch.arange(context, device=dev).unsqueeze(0).expand(rows, -1))
            anchors = ids[:, context]
            draft_s = _timed(engine, replays, lambda: _draft_block(d, anchors, n, context, ctx))
            for k in range(n + 1):
                tokens = ids[:, context:context + 1].expand(rows, k + 1).contiguous()

                def verify():
                    engine.target(input_ids=tokens, past_key_values=cache, use_cache=True, output_hidden_states=True)
                    cache.crop(-(k + 1))

                for v in _timed(engine, replays, verify):
                    costs.record(rows, k, statistics.median(draft_s), v)
    return costs


def _draft_block(d, anchors, n: int, start: int, ctx) -> None:
    """What a step drafts (``anchors`` [R] int64): the block forward, base logits, and per position the Markov bias
    and confidence."""
    import torch

    block, pos, first = d.block_query(anchors, n, torch.full_like(anchors, start))
    hidden = d.backbone(block, pos, ctx)[:, first:first + n]
    base = d.base_logits(hidden).float()
    prev = anchors
    for i in range(n):
        logits = base[:, i] + d.markov_bias(prev).float() if d.markov_head is not None else base[:, i]
        tok = d.to_target_ids(logits.argmax(-1))
        if d.confidence_head is not None:
            d.confidence_logit(hidden[:, i], prev)
        prev = tok


def _timed(engine, replays: int, fn) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(replays):
        engine._sync()
        t0 = time.perf_counter()
        fn()
        engine._sync()
        out.append(time.perf_counter() - t0)
    return out


def latency_law(*, n: int, concurrency: int, base_costs: StepCosts, spec_costs: StepCosts, base_stats,
                spec_stats) -> LawRow:
    """Predicted vs measured speedup of one (n, concurrency) from two recorded runs (:func:`law_row` with τ from the
    run's per-position acceptance, the measured speedup as the ratio of the runs' tokens/s).

    Args:
        base_costs / spec_costs: the :class:`StepCosts` recorded during the target-alone and the static-n run.
        base_stats / spec_stats: their :class:`~dsparkhub.verify.stats.RunStats`.

    Raises:
        VerifyError: a run did not record a step of the steady shape.
    """
    measured = spec_stats.tokens_per_s / base_stats.tokens_per_s if base_stats.tokens_per_s else 0.0
    return law_row(n=n, concurrency=concurrency, base_costs=base_costs, spec_costs=spec_costs,
                   tau=1.0 + sum(spec_stats.per_position_acceptance), measured=measured,
                   base_wall_s=base_stats.wall_s, spec_wall_s=spec_stats.wall_s)


def law_row(*, n: int, concurrency: int, base_costs: StepCosts, spec_costs: StepCosts, tau: float, measured: float,
            base_wall_s: float, spec_wall_s: float, measured_spread: list[float] | None = None) -> LawRow:
    """The latency law L = (T_draft + T_verify) / τ for one (n, concurrency), beside the measured speedup.

    Args:
        n / concurrency: the configuration; base_costs / spec_costs: step costs recorded during the target-alone
            runs and the runs at n (several datasets or repeats may be merged, :meth:`StepCosts.merge`).
        tau: acceptance length (1 + the sum of the per-position acceptance); measured: the measured speedup.
        base_wall_s / spec_wall_s: wall seconds of the runs the costs were recorded in (summed like the costs),
            for the shares a shortfall is explained by.
        measured_spread: [lowest, highest] per-repeat measured speedup, stored for the reader.

    Step times are the medians at ``concurrency`` requests (the steady state: steps with fewer requests, while
    requests are admitted or the run drains, are left out). A measured speedup below 0.85 x the predicted one is a
    shortfall when no repeat reached the prediction (with ``measured_spread``; else when it is below the predicted
    spread), explained by the largest of: time outside the steps (prefill,
    admission, bookkeeping), steps at fewer requests, or the step itself (drafting or verifying, whichever is
    larger) — each as its share of the speculative run's wall time against the same share of the target-alone run.

    Raises:
        VerifyError: a run did not record a step of the steady shape.
    """
    base = base_costs.samples.get((concurrency, None))
    spec = spec_costs.samples.get((concurrency, n))
    if not base or not spec:
        raise VerifyError(f"no steady steps recorded at concurrency {concurrency} (n={n}): run more prompts than "
                          "the concurrency")
    t_target = statistics.median(v for _, v in base)
    t_draft, t_verify = spec_costs.median(concurrency, n)
    step = t_draft + t_verify
    predicted = t_target * tau / step
    ceiling = t_target * (n + 1) / step
    bq, sq = _quartiles([v for _, v in base]), _quartiles([d + v for d, v in spec])
    spread = [bq[0] * tau / sq[1], bq[1] * tau / sq[0]]
    row = LawRow(num_speculative_tokens=n, concurrency=concurrency, t_target_s=t_target, t_draft_s=t_draft,
                 t_verify_s=t_verify, tau=tau, predicted=predicted, ceiling=ceiling, spread=spread,
                 measured=measured, measured_spread=list(measured_spread or []))
    if measured > ceiling:
        row.flag = "above ceiling"
        row.note = "faster than all drafts accepted would allow: the step timings do not describe this run"
    elif measured < SHORTFALL * predicted and (measured_spread[1] < predicted if measured_spread else
                                                measured < spread[0]):
        row.flag = "shortfall"
        row.note = _shortfall_note(base_costs, spec_costs, base_wall_s, spec_wall_s, concurrency, n)
    return row


def step_costs_record(results, costs: dict[tuple[int | None, int], list[tuple[StepCosts, float]]], *,
                      source: str) -> StepCostsRecord:
    """What ``dsparkhub verify`` stores as ``step_costs``: the shapes of every configuration and the latency law
    per (n, concurrency), from the costs its runs recorded.

    Args:
        results: the run's :class:`~dsparkhub.verify.results.schema.VerifyResults` (its summary gives τ and the
            measured speedup, the mean over datasets; the per-repeat means over datasets their spread).
        costs: per ``(n or None for the target alone, concurrency)`` the ``(StepCosts, wall seconds)`` of every
            dataset and repeat, merged here.
        source: what timed the steps, in words.

    A (n, concurrency) without a steady step (fewer prompts than the concurrency) gets no law row.
    """
    merged = {key: (StepCosts(), sum(w for _, w in got)) for key, got in costs.items()}
    for key, got in costs.items():
        for c, _ in got:
            merged[key][0].merge(c)
    shapes = [StepShape(num_speculative_tokens=n, concurrency=c, **shape)
              for (n, c), (sc, _) in sorted(merged.items(), key=lambda kv: (kv[0][1], kv[0][0] or 0))
              for shape in sc.context_shapes()]
    law = []
    for row in results.summary:
        n, c = row.num_speculative_tokens, row.concurrency
        if row.mean_tau is None or row.mean_speedup is None or (None, c) not in merged or (n, c) not in merged:
            continue
        # the measured figure per repeat: the mean over datasets of that repeat's speedup (as the summary's mean)
        per_ds = [r.speedup_repeats for ds in results.datasets if (r := ds.run(n, c)) is not None]
        reps = [sum(x) / len(x) for x in zip(*per_ds)] if per_ds else []
        (base, base_wall), (spec, spec_wall) = merged[None, c], merged[n, c]
        try:
            law.append(law_row(n=n, concurrency=c, base_costs=base, spec_costs=spec, tau=row.mean_tau,
                               measured=row.mean_speedup, base_wall_s=base_wall, spec_wall_s=spec_wall,
                               measured_spread=[min(reps), max(reps)] if len(reps) > 1 else None))
        except VerifyError:
            continue  # no step ran with every request in flight
    return StepCostsRecord(source=source, shapes=shapes, law=law)


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def _shares(costs: StepCosts, wall_s: float, steady: tuple[int, int | None]) -> dict[str, float]:
    """Shares of the run's wall time: steady steps, other steps, outside the steps."""
    wall = wall_s or 1.0
    inside = {key: sum(d + v for d, v in got) for key, got in costs.samples.items()}
    steady_s = inside.get(steady, 0.0)
    other_s = sum(inside.values()) - steady_s
    return {"steady": steady_s / wall, "other": other_s / wall, "outside": max(0.0, 1.0 - (steady_s + other_s) / wall)}


def _shortfall_note(base_costs, spec_costs, base_wall_s: float, spec_wall_s: float, concurrency: int,
                    n: int) -> str:
    b = _shares(base_costs, base_wall_s, (concurrency, None))
    s = _shares(spec_costs, spec_wall_s, (concurrency, n))
    excess = {"outside": s["outside"] - b["outside"], "other": s["other"] - b["other"]}
    term = max(excess, key=excess.get)
    if excess[term] > 0.05:
        what = ("time outside the steps (prefill, admission, bookkeeping)" if term == "outside" else
                f"steps with fewer than {concurrency} requests (admission, the run's tail)")
        return f"{what}: {s[term]:.0%} of the speculative run vs {b[term]:.0%} of the target alone"
    t_draft, t_verify = spec_costs.median(concurrency, n)
    part, share = ("drafting", t_draft) if t_draft > t_verify else ("verifying", t_verify)
    return f"the step itself: {part} is {share / (t_draft + t_verify):.0%} of it"


def run_profiler(run, cmd: list[str], *, what: str, timeout_s: float, timeout_hint: str, failure_hint: str):
    """Run an engine's own profiling tool (``vllm bench forward``, SGLang's ``dspark_sps_profiler``) and return its
    ``CompletedProcess``; ``run`` is ``subprocess.run`` or a test's stand-in.

    Args:
        what: the tool in words for the error (``vllm bench forward (target_only)``).
        timeout_s: seconds before the tool is abandoned.

    Raises:
        EngineUnavailableError: the tool did not finish in ``timeout_s`` (with ``timeout_hint``), or exited non-zero
            (the last 8 lines of its output, with ``failure_hint``).
    """
    import subprocess

    try:
        done = run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EngineUnavailableError(f"{what} did not finish in {timeout_s:.0f} s", hint=timeout_hint) from None
    if done.returncode != 0:
        tail = "\n".join(((done.stderr or "") + (done.stdout or "")).strip().splitlines()[-8:])
        raise EngineUnavailableError(f"{what} exited with {done.returncode}:\n{tail}", hint=failure_hint)
    return done
