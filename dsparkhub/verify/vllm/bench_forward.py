"""Target and drafter forward costs per batch shape from vLLM's own ``vllm bench forward`` (vLLM 0.33+, GPU).

``vllm bench forward`` (vLLM 0.34 ``vllm/benchmarks/forward/main.py``) builds exact batches without the scheduler
and times the forward as a one-shot CUDA graph: a case ``NAME=[N*]Q[@K][:D]`` is N requests of query length Q, KV
length K (query included) and D draft tokens (verify: Q = 1 + D); ``--output-json`` writes a list of ``{case,
requests, median_us, ranks: [{timing_scope, latency_us: {median, ...}, ...}]}``. By default a configured DSpark /
DFlash / EAGLE drafter is timed with the target (``timing_scope: target_and_drafter``, every draft accepted);
``--exclude-drafter`` times the target alone.

dsparkhub runs it twice over the same cases — once with the drafter, once with ``--exclude-drafter`` — and reads per
shape (requests R, verify width k, context C): T_verify = the target-alone median of ``R*(1+k)@(C+1+k):k``,
T_draft = the with-drafter median minus it, and a target-alone step (width None) from ``R*1@(C+1)``. The result is a
:class:`~dsparkhub.verify.costs.StepCosts`, the same record the reference engine fills, so the SPS table and the
budget come from it unchanged (``dsparkhub schedule --vllm-forward``). Jitter is off (``--kv-len-jitter 0``) so each
shape is exact.

Not here: starting a server (``serve``) or measuring acceptance (that is ``verify``); the costs assume every draft
accepted, as vLLM's own bench does. Needs a CUDA GPU: vLLM captures CUDA graphs.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from dsparkhub.errors import VerifyError
from dsparkhub.verify.costs import StepCosts, run_profiler

__all__ = ["forward_cases", "forward_command", "read_forward", "costs_from_forward", "bench_forward"]

TIMEOUT_S = 3600


def _name(rows: int, width: int | None) -> str:
    return f"r{rows}_k{'t' if width is None else width}"


def forward_cases(requests: list[int], widths: list[int], context: int) -> list[str]:
    """``--case`` arguments: per request count R a target-alone decode step and a verify step per width k >= 1.

    Args:
        requests: request counts R; widths: verify widths k (draft tokens; 0 is the target-alone step, always
            included); context: tokens already in each request's KV cache before the step.

    Returns:
        ``["r4_kt=4*1@65", "r4_k3=4*4@68:3", ...]`` (vLLM's ``NAME=[N*]Q@K:D``, K counting the query).

    Raises:
        VerifyError: a request count, width or context below what a verify step needs.
    """
    if not requests or min(requests) < 1 or context < 1 or min(widths, default=0) < 0:
        raise VerifyError(f"vllm bench forward cases need request counts >= 1, widths >= 0 and context >= 1, found "
                          f"requests={requests}, widths={widths}, context={context}")
    out = []
    for rows in sorted(set(requests)):
        out.append(f"{_name(rows, None)}={rows}*1@{context + 1}")
        out += [f"{_name(rows, k)}={rows}*{k + 1}@{context + k + 1}:{k}" for k in sorted(set(widths)) if k > 0]
    return out


def forward_command(vllm: str | Path, *, target: str, draft: str, method: str, n: int, cases: list[str],
                    output_json: str | Path, exclude_drafter: bool, max_model_len: int | None = None,
                    iters: int = 20, samples: int = 5) -> list[str]:
    """The ``vllm bench forward`` command line (vLLM 0.34 ``benchmarks/forward/main.py`` flags).

    The drafter is configured as for ``vllm serve`` (``--speculative-config`` with ``num_speculative_tokens = n``)
    in both runs, so the target's KV layout is the same; weights are real (``--load-format auto``), not vLLM's
    dummy default, so the timed drafter is this drafter. One GPU: vLLM runs more only under ``torchrun``.
    """
    spec = {"method": method, "model": str(draft), "num_speculative_tokens": n}
    cmd = [str(vllm), "bench", "forward", "--model", str(target), "--speculative-config", json.dumps(spec),
           "--load-format", "auto", "--kv-len-jitter", "0", "--iters", str(iters), "--samples", str(samples),
           "--output-json", str(output_json)]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    for case in cases:
        cmd += ["--case", case]
    return cmd + (["--exclude-drafter"] if exclude_drafter else [])


def read_forward(path: str | Path, *, scope: str) -> dict[str, float]:
    """``{case name: median seconds}`` from a ``--output-json`` file, checking the timing scope of every case.

    Args:
        scope: ``"target_only"`` or ``"target_and_drafter"`` (what the run was asked to time).

    Raises:
        VerifyError: the file is missing or not vLLM's list of cases, a median is missing or not positive, or a case
            was timed in another scope (a drafter vLLM did not attach, or one it attached unasked).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerifyError(f"cannot read the `vllm bench forward` output: {exc}", path=path) from None
    if not isinstance(data, list):
        raise VerifyError(f"`vllm bench forward` output is not a list of cases (found {type(data).__name__})",
                          path=path)
    out, problems = {}, []
    for i, case in enumerate(data):
        name = case.get("case") if isinstance(case, dict) else None
        median = case.get("median_us") if isinstance(case, dict) else None
        ranks = case.get("ranks") if isinstance(case, dict) else None
        got = ranks[0].get("timing_scope") if isinstance(ranks, list) and ranks and isinstance(ranks[0], dict) \
            else None
        if not isinstance(name, str) or not isinstance(median, (int, float)) or isinstance(median, bool) or \
                median <= 0:
            problems.append(f"case [{i}] has no name or no positive `median_us`")
        elif got != scope:
            problems.append(f"case {name} was timed as {got!r}, expected {scope!r}")
        else:
            out[name] = float(median) / 1e6
    if problems:
        raise VerifyError("`vllm bench forward` output does not fit: " + "; ".join(problems), path=path)
    return out


def costs_from_forward(with_drafter: dict[str, float], target_only: dict[str, float], *, requests: list[int],
                       widths: list[int], context: int) -> StepCosts:
    """:class:`StepCosts` from the two runs' medians (seconds) of :func:`forward_cases`' cases.

    Per (R, k >= 1): T_verify = target-alone median, T_draft = with-drafter median - T_verify (0 when timing noise
    makes it negative); per R a target-alone step (width None). ``context`` is recorded as the step's context.

    Raises:
        VerifyError: a case is missing from either run.
    """
    costs = StepCosts()
    missing = []
    for rows in sorted(set(requests)):
        plain = target_only.get(_name(rows, None))
        if plain is None:
            missing.append(_name(rows, None))
        else:
            costs.record(rows, None, 0.0, plain, context=context)
        for k in sorted({w for w in widths if w > 0}):
            name = _name(rows, k)
            if name not in target_only or name not in with_drafter:
                missing.append(name)
                continue
            verify = target_only[name]
            costs.record(rows, k, max(0.0, with_drafter[name] - verify), verify, context=context)
    if missing:
        raise VerifyError(f"`vllm bench forward` did not time case(s) {', '.join(missing)}")
    return costs


def bench_forward(*, target: str, draft: str, method: str, n: int, requests: list[int], context: int,
                  vllm: str | Path | None = None, max_model_len: int | None = None,
                  timeout_s: float = TIMEOUT_S, run=subprocess.run) -> tuple[StepCosts, str]:
    """Run ``vllm bench forward`` with and without the drafter over every (R, k = 0 .. n) and return the costs.

    Args:
        target / draft / method / n: the model, the drafter folder, its method and num_speculative_tokens.
        requests: request counts R; context: tokens of context per request (the KV length before the step).
        vllm: the ``vllm`` executable (default :func:`dsparkhub.verify.vllm.serve.find_vllm`).
        run: ``subprocess.run`` (tests pass a stand-in).

    Returns:
        ``(costs, source)``: the :class:`StepCosts` and a label for the SPS table's ``source``.

    Raises:
        EngineUnavailableError: no ``vllm`` executable, or a run exits non-zero (its last output lines quoted: a
            vLLM older than 0.33 has no ``bench forward``; vLLM needs a CUDA GPU to capture graphs).
        VerifyError: the output does not fit (:func:`read_forward`, :func:`costs_from_forward`).
    """
    from dsparkhub.verify.vllm.serve import find_vllm

    exe = find_vllm(vllm)
    cases = forward_cases(requests, list(range(n + 1)), context)
    medians = {}
    with tempfile.TemporaryDirectory(prefix="dsparkhub-forward-") as tmp:
        for scope, exclude in (("target_and_drafter", False), ("target_only", True)):
            out = Path(tmp) / f"{scope}.json"
            cmd = forward_command(exe, target=target, draft=draft, method=method, n=n, cases=cases, output_json=out,
                                  exclude_drafter=exclude, max_model_len=max_model_len)
            run_profiler(run, cmd, what=f"`vllm bench forward` ({scope})", timeout_s=timeout_s,
                         timeout_hint="time fewer request counts (--concurrency)",
                         failure_hint="it needs vLLM 0.33+ (`vllm bench forward --help`) and a CUDA GPU (one-shot "
                                      "CUDA graphs)")
            medians[scope] = read_forward(out, scope=scope)
    costs = costs_from_forward(medians["target_and_drafter"], medians["target_only"], requests=requests,
                               widths=list(range(n + 1)), context=context)
    source = (f"vllm bench forward: one-shot CUDA graphs of {sorted(set(requests))} requests x verify widths 0..{n}, "
              f"{context}-token context, median; T_draft = with drafter - --exclude-drafter")
    return costs, source
