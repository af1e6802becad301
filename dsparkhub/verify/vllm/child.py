"""The child process that runs vLLM for ``dsparkhub.verify.vllm.offline`` and ``dsparkhub.verify.vllm.checks``.

Run as ``python -m dsparkhub.verify.vllm.child engine|check``. Protocol (see ``dsparkhub.verify.vllm.process.ChildProcess``): each
line on stdin is the path of a JSON request; the answer is written to ``<request without .json>.out.json``
(temp file, then rename, so the parent never reads half a file). EOF on stdin ends the process. Exceptions are
answered as ``{"error": {"type", "message", "stage", "traceback_tail"}}``; the parent turns known vLLM refusals into
``EngineUnavailableError``. Anything that kills the process (segfault, OOM) is seen by the parent as a missing
answer plus an exit status.

Why a child: vLLM keeps global state (distributed groups, the current config, Prometheus registry), spawns its own
engine-core processes, and may abort the interpreter; none of that may reach the user's process. vLLM spawns
processes, so this module starts it only under ``if __name__ == "__main__":``.

Engine mode requests:
- ``{"action": "start", "model": TARGET, "engine_args": {...}}`` -> builds ``vllm.LLM(model=TARGET, **engine_args)``
  (on CPU ``enforce_eager`` defaults to True and the KV cache to 1 GiB), warms it up with one short generate, answers
  ``{"vllm_version", "device", "start_s", "warmup_s", "model_runner", "contract"}``; before anything loads, the
  engine self-check (:func:`~dsparkhub.verify.vllm.contract.self_check`) refuses a vLLM that lacks what it touches.
  With ``"closed_loop": true`` (a concurrency sweep; the engine args then carry ``max_num_seqs`` >= its highest
  concurrency) the self-check also covers the engine API of the closed loop (``touches.engine_loop``).
- ``{"action": "run", "prompts", "max_new_tokens", "temperature", "seed", "ignore_eos", "concurrency"}`` -> without
  ``closed_loop``: generates each prompt alone (batch 1, ``concurrency`` must be 1), timing only the ``generate``
  calls; with it: keeps exactly ``concurrency`` requests in flight through ``LLM.llm_engine``
  (:func:`~dsparkhub.verify.vllm.closed_loop.run_closed_loop`), wall time from the first add to the last finish.
  Answers ``{"outputs", "wall_s", "per_prompt_s", "requests", "peak_in_flight", "counters_before",
  "counters_after"}`` (vLLM's cumulative spec-decode counters around the run; ``requests``: per prompt vLLM's own
  ``{"drafts", "accepted", "ttft_s", "e2e_s"}``, see :func:`_request_figures`).
- ``{"action": "mtp_facts", "model": TARGET}`` -> what the installed vLLM makes of the target's MTP layers (no
  engine starts; :func:`dsparkhub.verify.vllm.mtp.mtp_facts`) plus ``vllm_version``.
- ``{"action": "metrics_text"}`` -> the Prometheus exposition text of this process's registry (what ``vllm serve``
  would show on ``/metrics``), for tests of the text parser.

Check mode requests: ``{"draft", "target", "num_speculative_tokens", "dtype", "max_model_len"}`` ->
``vllm_checks.run_checks(...)`` as a dict.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

# Warm-up prompt: small token ids exist in every vocabulary.
_WARMUP_PROMPT = list(range(1, 17))
_WARMUP_NEW_TOKENS = 8


def _device(tensor_parallel_size: int) -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x{tensor_parallel_size}"
    return f"cpu ({os.cpu_count()} cores)"


class EngineSession:
    """One ``vllm.LLM`` and the requests against it."""

    def __init__(self) -> None:
        self.llm = None
        self.stage = "importing vllm"
        self.closed_loop = False  # set by 'start': runs go through the closed loop (a concurrency sweep)
        self._runs = 0

    def handle(self, request: dict) -> dict:
        action = request.get("action")
        if action == "start":
            return self.start(request)
        if action == "mtp_facts":
            return self.mtp_facts(request)
        if self.llm is None:
            raise RuntimeError(f"request {action!r} before a successful 'start'")
        if action == "run":
            return self.run(request)
        if action == "metrics_text":
            from prometheus_client import REGISTRY, generate_latest

            return {"text": generate_latest(REGISTRY).decode()}
        raise ValueError(f"unknown action {action!r}")

    def start(self, request: dict) -> dict:
        self.stage = "importing vllm"
        import torch
        import vllm

        from dsparkhub.errors import EngineUnavailableError
        from dsparkhub.verify.vllm.contract import contract_for, self_check, self_check_paragraph

        self.stage = "checking vLLM against its contract"
        contract = contract_for(vllm.__version__)
        self.closed_loop = bool(request.get("closed_loop"))
        missing = self_check(contract, "engine") + (self_check(contract, "engine_loop") if self.closed_loop else [])
        paragraph = self_check_paragraph(contract, missing)
        if paragraph:
            raise EngineUnavailableError(paragraph)
        from vllm import LLM

        args = dict(request.get("engine_args") or {})
        if "speculative_config" in args and _has_engine_arg("per_request_spec_decode_metrics"):
            # vLLM's own per-request acceptance (0.32 and 0.34: ``--per-request-spec-decode-metrics``), read back
            # from ``CompletionOutput.spec_decode_metrics``; ``summary`` keeps the histogram, not per-step arrays
            args.setdefault("per_request_spec_decode_metrics", "summary")
        if not torch.cuda.is_available():
            args.setdefault("enforce_eager", True)
            # vLLM's CPU worker otherwise reserves gpu_memory_utilization (0.9) of the machine's RAM and refuses to
            # start when other processes use it (v1/worker/cpu_worker.py); 1 GiB of KV cache is ample for batch-1
            # verify runs. An explicit VLLM_CPU_KVCACHE_SPACE or kv_cache_memory_bytes wins.
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                args.setdefault("kv_cache_memory_bytes", 1 << 30)
        self.stage = "starting the engine"
        t0 = time.perf_counter()
        self.llm = LLM(model=request["model"], **args)
        start_s = time.perf_counter() - t0
        self.stage = "warming up"
        t0 = time.perf_counter()
        self._generate([_WARMUP_PROMPT], max_new_tokens=_WARMUP_NEW_TOKENS, temperature=0.0, seed=0,
                       ignore_eos=True)
        warmup_s = time.perf_counter() - t0
        attribute = contract.value("runner_attribute")  # None from vLLM 0.34 on: V2 is the only runner
        runner = "V2"
        if attribute:
            try:
                runner = "V2" if getattr(self.llm.llm_engine.vllm_config, attribute) else "V1"
            except AttributeError:  # informational only (a stand-in engine has no llm_engine)
                runner = None
        return {"vllm_version": vllm.__version__, "device": _device(int(args.get("tensor_parallel_size", 1))),
                "start_s": start_s, "warmup_s": warmup_s, "model_runner": runner,
                "contract": contract.to_dict()}

    def mtp_facts(self, request: dict) -> dict:
        """What the installed vLLM makes of the target's MTP layers, before any engine starts
        (:func:`dsparkhub.verify.vllm.mtp.mtp_facts`); answers those facts plus ``vllm_version``."""
        self.stage = "importing vllm"
        import vllm

        from dsparkhub.verify.vllm.contract import contract_for
        from dsparkhub.verify.vllm.mtp import mtp_facts

        self.stage = "reading the target's MTP layers"
        return {"vllm_version": vllm.__version__, **mtp_facts(request["model"], contract_for(vllm.__version__))}

    def _generate(self, prompts, *, max_new_tokens, temperature, seed, ignore_eos):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        outputs, times, requests = [], [], []
        for i, prompt in enumerate(prompts):
            # prompt i samples with seed + i, as the reference engine does
            params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=seed + i,
                                    ignore_eos=ignore_eos)
            t0 = time.perf_counter()
            result = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False)
            times.append(time.perf_counter() - t0)
            outputs.append([int(t) for t in result[0].outputs[0].token_ids])
            requests.append(_request_figures(result[0]))
        return outputs, times, requests

    def _loop(self, prompts, *, max_new_tokens, temperature, seed, ignore_eos, concurrency):
        """``concurrency`` requests in flight through ``LLM.llm_engine`` (:mod:`~dsparkhub.verify.vllm.closed_loop`);
        returns ``(outputs, wall_s, per-request seconds, per-request figures, peak in flight)``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from dsparkhub.verify.vllm.closed_loop import run_closed_loop

        def params(i: int):  # prompt i samples with seed + i, as the batch-1 path and the reference engine do
            return SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=seed + i,
                                  ignore_eos=ignore_eos, output_kind=RequestOutputKind.FINAL_ONLY)

        self._runs += 1
        run = run_closed_loop(self.llm.llm_engine, [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                              params, concurrency, tag=f"dsh{self._runs}")
        outputs = [[int(t) for t in out.outputs[0].token_ids] for out in run.outputs]
        return outputs, run.wall_s, run.request_s, [_request_figures(out) for out in run.outputs], run.peak_in_flight

    def run(self, request: dict) -> dict:
        from dsparkhub.verify.vllm.counters import spec_counters_from_metrics

        self.stage = "generating"
        sampling = dict(max_new_tokens=int(request["max_new_tokens"]),
                        temperature=float(request.get("temperature", 0.0)), seed=int(request.get("seed", 0)),
                        ignore_eos=bool(request.get("ignore_eos", False)))
        concurrency = int(request.get("concurrency", 1))
        before = spec_counters_from_metrics(self.llm.get_metrics())
        if self.closed_loop:  # a concurrency sweep: every concurrency (1 too) through the same closed loop
            outputs, wall, times, requests, peak = self._loop(request["prompts"], concurrency=concurrency, **sampling)
        else:  # batch 1, one LLM.generate per prompt
            if concurrency != 1:
                raise ValueError(f"concurrency {concurrency} asked of an engine started without closed_loop")
            outputs, times, requests = self._generate(request["prompts"], **sampling)
            wall, peak = sum(times), 1
        after = spec_counters_from_metrics(self.llm.get_metrics())
        return {"outputs": outputs, "wall_s": wall, "per_prompt_s": times, "requests": requests,
                "peak_in_flight": peak, "counters_before": asdict(before), "counters_after": asdict(after)}


def _has_engine_arg(name: str) -> bool:
    import dataclasses

    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:  # a stand-in vllm (tests) without engine args
        return False
    return dataclasses.is_dataclass(EngineArgs) and any(f.name == name for f in dataclasses.fields(EngineArgs))


def _request_figures(out) -> dict:
    """vLLM's own figures of one finished request: ``drafts`` / ``accepted`` from
    ``CompletionOutput.spec_decode_metrics`` (0.32 ``RequestSpecDecodeMetrics``: verify steps = sum of the acceptance
    histogram, accepted = sum of j x count), ``ttft_s`` / ``e2e_s`` from ``RequestOutput.metrics`` (first token
    latency from arrival; E2E = that + last - first engine-core token timestamps); None where vLLM has none."""
    spec = getattr(out.outputs[0], "spec_decode_metrics", None)
    stats = getattr(out, "metrics", None)
    fig: dict = {"drafts": None, "accepted": None, "ttft_s": None, "e2e_s": None}
    if spec is not None:
        fig["drafts"] = int(sum(spec.histogram))
        fig["accepted"] = int(sum(j * c for j, c in enumerate(spec.histogram)))
    if stats is not None and getattr(stats, "first_token_latency", 0.0) > 0:
        fig["ttft_s"] = float(stats.first_token_latency)
        fig["e2e_s"] = float(stats.first_token_latency + max(0.0, stats.last_token_ts - stats.first_token_ts))
    return fig


class CheckSession:
    """``vllm_checks.run_checks`` for each request (normally one per process: vLLM's distributed state is global)."""

    stage = "checking"

    def handle(self, request: dict) -> dict:
        from dsparkhub.verify.vllm.check_stages import run_checks

        return run_checks(**request).to_dict()


def _answer(request_path: Path, reply: dict) -> None:
    out = request_path.with_name(request_path.name[: -len(".json")] + ".out.json")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(reply))
    os.replace(tmp, out)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("engine", "check"):
        sys.stderr.write("usage: python -m dsparkhub.verify.vllm.child engine|check  (requests on stdin)\n")
        return 2
    session = EngineSession() if argv[1] == "engine" else CheckSession()
    for line in sys.stdin:
        path = Path(line.strip())
        if not line.strip():
            continue
        try:
            request = json.loads(path.read_text())
            reply = session.handle(request)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as an answer
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = traceback.format_exc()
            reply = {"error": {"type": type(exc).__name__, "message": str(exc), "stage": session.stage,
                               "traceback_tail": tb[-3000:]}}
            from dsparkhub.verify.vllm.process import CHILD_EXCEPTION_MARKER

            sys.stderr.write(f"{CHILD_EXCEPTION_MARKER}\n{tb}")
        _answer(path, reply)
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, where vLLM's atexit hooks can hang once the parent stopped listening.
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
