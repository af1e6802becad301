"""vLLM's offline ``LLM`` as a verify backend (:class:`VllmBackend`): one engine per configuration (no
drafter; the drafter at one ``num_speculative_tokens``), each in a child process
(:mod:`dsparkhub.verify.vllm.process`).

It does not import vLLM (only the child does), decide which configurations to run (``dsparkhub.verify.runner``), or
turn RunStats into published numbers (``dsparkhub.verify.results.derive``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.stats import RunStats
from dsparkhub.verify.vllm.counters import SpecCounters
from dsparkhub.verify.vllm.method import method_for_drafter
from dsparkhub.verify.vllm.process import DEFAULT_TIMEOUT_S, ChildProcess
from dsparkhub.verify.vllm.contract import vllm_version
from dsparkhub.verify.vllm.refusals import raise_child_error


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def _local_without_tokenizer(target: str) -> bool:
    """True for a local target folder that holds no tokenizer file (vLLM cannot load one from it)."""
    folder = Path(target)
    return folder.is_dir() and not any((folder / name).exists() for name in _TOKENIZER_FILES)


def _local_or_id(path: str | Path) -> str:
    """An existing local path made absolute (the child runs in its own folder); anything else (a Hub id) as is."""
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else str(path)


class VllmBackend:
    """Verify with vLLM's offline ``LLM``: one engine per configuration, each in a child process.

    The engine for the current configuration is kept alive across :meth:`run` calls with the same
    ``num_speculative_tokens`` and replaced when it changes, so callers should loop configuration-outer,
    dataset-inner (engine start is ~15 s for a tiny model on CPU, minutes for a large one on GPU).
    Each engine does one short warm-up generate; then each prompt is generated alone (batch 1) and only those
    ``generate`` calls are timed with a wall clock, or, in a concurrency sweep (``max_concurrency`` > 1), a closed
    loop over vLLM's engine API keeps ``concurrency`` requests in flight and is timed from first add to last finish.
    Acceptance comes from vLLM's own counters (``get_metrics()`` before and after the run; deltas).

    Args:
        target: target model folder or Hub id (vLLM's ``model``).
        drafter: drafter folder or Hub id (``speculative_config["model"]``); None for a target that carries its
            drafter (DeepSeek-V4 DSpark: give ``method="dspark"``), or for baseline-only use.
        method: vLLM speculative method; the variant of the drafter's DraftSpec when None
            (:func:`method_for_drafter`). Always passed explicitly to vLLM.
        tensor_parallel_size: vLLM ``tensor_parallel_size`` (the seeds serve at 8).
        max_model_len: vLLM ``max_model_len`` (the seeds use 20000; on CPU keep it small, e.g. 512).
        compilation_config: vLLM ``compilation_config`` dict (the seeds pass
            ``{"pass_config": {"fuse_allreduce_rms": False}}``).
        dtype: vLLM ``dtype``.
        enforce_eager: vLLM ``enforce_eager``; None means True on CPU, vLLM's default (CUDA graphs) on GPU.
        extra_engine_args: more ``LLM(...)`` keyword arguments; they override the ones above.
        timeout_s: limit for one engine start or one run, in seconds; the child is killed after it.
        ignore_eos: generate exactly ``max_new_tokens`` tokens per prompt (vLLM ``SamplingParams.ignore_eos``).
        env: extra environment for the child (``VLLM_CPU_KVCACHE_SPACE``, ``CUDA_VISIBLE_DEVICES``, ...).
        python: interpreter for the child (default: this one).
        speculative_extra: more ``speculative_config`` keys (``enable_adaptive_verification``,
            ``rejection_sample_method``: :mod:`dsparkhub.verify.spec_options`), merged last.
        max_concurrency: the highest concurrency :meth:`run` will be asked for. Above 1, every engine starts with
            vLLM ``max_num_seqs`` >= it and every run, at any concurrency, goes through the closed loop over vLLM's
            engine API (:mod:`dsparkhub.verify.vllm.closed_loop`); 1 keeps one ``LLM.generate`` per prompt.

    Raises:
        LayoutError: ``method`` is None and cannot be derived from the drafter's config.
    """

    name = "vllm"

    def __init__(self, target: str | Path, drafter: str | Path | None = None, *, method: str | None = None,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 compilation_config: dict | None = None, dtype: str = "auto", enforce_eager: bool | None = None,
                 extra_engine_args: dict | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 ignore_eos: bool = False, env: dict[str, str] | None = None, python: str | None = None,
                 speculative_extra: dict | None = None, max_concurrency: int = 1):
        self.max_concurrency = int(max_concurrency)
        self.speculative_extra = dict(speculative_extra or {})  # dsparkhub.verify.spec_options
        self.target = _local_or_id(target)
        self.drafter = _local_or_id(drafter) if drafter is not None else None
        if method is None and self.drafter is not None:
            method = method_for_drafter(self.drafter)
        self.method = method
        self.engine_args: dict[str, Any] = {
            "tensor_parallel_size": tensor_parallel_size, "dtype": dtype,
        }
        if max_model_len is not None:
            self.engine_args["max_model_len"] = max_model_len
        if compilation_config is not None:
            self.engine_args["compilation_config"] = compilation_config
        if enforce_eager is not None:
            self.engine_args["enforce_eager"] = enforce_eager
        self.engine_args.update(extra_engine_args or {})
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.env = dict(env or {})
        self.python = python
        installed = vllm_version()
        self.version = f"vllm {installed}" if installed else "vllm (not installed)"
        self.device = "not started"
        self._child: ChildProcess | None = None
        self._child_key: tuple = ()  # (method, n) the running child serves (n None: no speculation); with _child
        self.last_start: dict = {}

    @classmethod
    def from_options(cls, target: str | Path, drafter: str | Path | None = None, **options) -> "VllmBackend":
        """The constructor ``dsparkhub.verify.runner`` calls by backend name; same arguments as ``__init__``."""
        return cls(target, drafter, **options)

    def _what(self, n: int | None, method: str | None = None) -> str:
        version = self.version.replace("vllm ", "vLLM ")
        if n is None:
            return f"{version} (target {self.target}, no drafter)"
        if method is not None:
            return f"{version} (target {self.target} drafting with its own {method} layers, num_speculative_tokens={n})"
        src = self.drafter if self.drafter is not None else "attached to the target"
        return f"{version} (target {self.target}, {self.method} drafter {src}, num_speculative_tokens={n})"

    def engine_request(self, n: int | None, method: str | None = None) -> dict:
        """The JSON the child turns into ``LLM(**engine_args)``; ``speculative_config`` only when ``n`` is set.
        With ``method`` (``mtp``: the target's own MTP layers) it is ``{"method": method, "num_speculative_tokens":
        n}`` alone: no drafter model, no ``speculative_extra``.

        Raises:
            VerifyError: ``n`` is set but no method is known (no drafter and no ``method``).
        """
        args = dict(self.engine_args)
        # Token ids in, token ids out: a target without tokenizer files runs with skip_tokenizer_init (vLLM then
        # stops on generation_config.json's eos ids only). With a tokenizer, vLLM also stops on its eos, as served.
        args.setdefault("skip_tokenizer_init", _local_without_tokenizer(self.target))
        args["disable_log_stats"] = False  # LLM defaults it to True, which hides get_metrics()' counters
        if n is not None and method is not None:
            args["speculative_config"] = {"method": method, "num_speculative_tokens": int(n)}
        elif n is not None:
            if self.method is None:
                raise VerifyError(
                    f"num_speculative_tokens={n} requested but no drafter and no method were given.",
                    hint="Pass the drafter folder, or method='dspark' for a target that carries its drafter.")
            spec: dict[str, Any] = {"method": self.method, "num_speculative_tokens": int(n)}
            if self.drafter is not None:
                spec["model"] = self.drafter
            spec.update(self.speculative_extra)
            args["speculative_config"] = spec
        if self.max_concurrency > 1:  # vLLM's scheduler must take every request the closed loop keeps in flight
            args["max_num_seqs"] = max(int(args.get("max_num_seqs") or 0), self.max_concurrency)
        return {"action": "start", "model": self.target, "engine_args": args,
                "closed_loop": self.max_concurrency > 1}

    def _ensure(self, n: int | None, method: str | None = None) -> ChildProcess:
        key = (method, n)
        if self._child is not None and self._child_key == key and self._child.proc.poll() is None:
            return self._child
        self.close()
        what = self._what(n, method)
        child = ChildProcess("engine", env=self.env, python=self.python)
        try:
            reply = child.request(self.engine_request(n, method), timeout_s=self.timeout_s, what=f"starting {what}")
            if "error" in reply:
                raise_child_error(reply["error"], what=what, method=(method or self.method) if n is not None else None,
                                  child=child)
        except BaseException:
            child.close(grace_s=5)
            raise
        self._child, self._child_key = child, key
        if reply.get("device"):  # the results' setup line says how the load was made (as the serve sweep does)
            self.device = reply["device"] + (", load from a closed loop over LLM.llm_engine"
                                             if self.max_concurrency > 1 else "")
        if reply.get("vllm_version"):
            self.version = f"vllm {reply['vllm_version']}"
        self.last_start = reply
        return child

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0, concurrency: int = 1,
            method: str | None = None) -> RunStats:
        """Generate for every prompt with this configuration's engine; see ``stats.Backend.run``.

        ``concurrency`` 1 with ``max_concurrency`` 1: one ``LLM.generate`` per prompt (batch 1). Otherwise a closed
        loop keeps exactly ``concurrency`` requests in flight (prompt i sampled with seed + i either way).
        ``method`` (``mtp``) drafts with the target's own layers of that method instead of the drafter.

        Returns:
            RunStats with ``outputs``, ``wall_s`` (generate calls only at batch 1; first add to last finish in the
            closed loop), vLLM's counter deltas and its own per-request figures; ``draft_s`` / ``verify_s`` /
            ``steps`` are None (vLLM does not expose them).

        Raises:
            EngineUnavailableError: vLLM refused this configuration (one paragraph: what, why, what to do).
            VerifyError: the child crashed, was killed, timed out, or vLLM raised during generation; ``concurrency``
                above ``max_concurrency`` or above the number of prompts (it could never be reached).
        """
        if not prompts:
            raise VerifyError("VllmBackend.run got no prompts.")
        if not 1 <= concurrency <= max(self.max_concurrency, 1) or concurrency > len(prompts):
            raise VerifyError(f"concurrency {concurrency} asked of a vLLM backend built for at most "
                              f"{self.max_concurrency} with {len(prompts)} prompts; it could not be reached.",
                              hint="construct VllmBackend(max_concurrency=...) with the sweep's highest concurrency "
                                   "and give at least that many prompts")
        child = self._ensure(num_speculative_tokens, method)
        what = self._what(num_speculative_tokens, method)
        reply = child.request(
            {"action": "run", "prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": int(max_new_tokens),
             "temperature": float(temperature), "seed": int(seed), "ignore_eos": self.ignore_eos,
             "concurrency": int(concurrency)},
            timeout_s=self.timeout_s, what=f"generating with {what}")
        if "error" in reply:
            try:
                raise_child_error(reply["error"], what=what, method=method or self.method, child=child)
            finally:
                self.close()
        delta = SpecCounters.from_dict(reply["counters_after"]) - SpecCounters.from_dict(reply["counters_before"])
        if num_speculative_tokens is not None and delta.num_drafts == 0:
            raise VerifyError(
                f"{what} generated {sum(len(o) for o in reply['outputs'])} tokens but vLLM counted no drafts; "
                "speculative decoding did not run, so τ and per-position acceptance cannot be measured.",
                hint="Check that max_new_tokens > 1 and that vLLM's log shows the drafter being loaded.")
        if num_speculative_tokens is not None and len(delta.accepted_per_pos) not in (0, num_speculative_tokens):
            raise VerifyError(
                f"{what}: vLLM reported {len(delta.accepted_per_pos)} per-position counters, expected "
                f"num_speculative_tokens={num_speculative_tokens}.")
        return RunStats(
            outputs=[list(map(int, o)) for o in reply["outputs"]],
            wall_s=float(reply["wall_s"]),
            num_drafts=delta.num_drafts,
            num_draft_tokens=delta.num_draft_tokens,
            num_accepted_tokens=delta.num_accepted_tokens,
            accepted_per_pos=delta.accepted_per_pos,
            concurrency=int(concurrency),
            **request_fields(reply.get("requests")),
        )

    def check_mtp(self, n: int) -> None:
        """Refuse ``--baseline mtp:n`` on this target before any engine starts: a child reads what the installed
        vLLM makes of the target's MTP layers (:func:`dsparkhub.verify.vllm.mtp.mtp_facts`; no model loads).

        Raises:
            EngineUnavailableError: vLLM cannot draft with the target's MTP layers at ``n`` (one paragraph,
                :func:`~dsparkhub.verify.vllm.mtp.mtp_refusal`).
            VerifyError: the child failed to answer.
        """
        from dsparkhub.verify.vllm.contract import contract_for
        from dsparkhub.verify.vllm.mtp import mtp_refusal

        child = ChildProcess("engine", env=self.env, python=self.python)
        try:
            reply = child.request({"action": "mtp_facts", "model": self.target}, timeout_s=self.timeout_s,
                                  what=f"reading the MTP layers of {self.target} with {self.version}")
            if "error" in reply:
                raise_child_error(reply["error"], what=f"{self.version} reading the MTP layers of {self.target}",
                                  method="mtp", child=child)
        finally:
            child.close(grace_s=5)
        paragraph = mtp_refusal(reply, n, target=self.target, contract=contract_for(reply["vllm_version"]))
        if paragraph is not None:
            raise EngineUnavailableError(paragraph)

    def prometheus_text(self) -> str:
        """The Prometheus exposition text of the running engine (what ``vllm serve`` shows on ``/metrics``).

        Raises:
            VerifyError: no engine is running (call :meth:`run` first), or the child failed to answer.
        """
        if self._child is None:
            raise VerifyError("no vLLM engine is running; call run() first.")
        reply = self._child.request({"action": "metrics_text"}, timeout_s=60, what="reading vLLM's metrics")
        if "error" in reply:
            raise VerifyError(f"reading vLLM's metrics failed: {reply['error'].get('message')}")
        return reply["text"]

    def close(self) -> None:
        """Stop the current engine's child process (and its vLLM workers)."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def __enter__(self) -> "VllmBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def request_fields(requests: list[dict] | None) -> dict:
    """``RunStats`` keyword arguments from vLLM's own per-request figures (the child's ``requests``): per-request
    ``request_drafts`` / ``request_accepted`` when vLLM reported spec-decode metrics for every request, ``ttft_s`` /
    ``latency_s`` when it timed every request; ``{}`` for what it did not (never re-derived from outputs)."""
    out: dict = {}
    if not requests:
        return out
    if all(r.get("drafts") is not None for r in requests):
        out["request_drafts"] = [int(r["drafts"]) for r in requests]
        out["request_accepted"] = [int(r["accepted"]) for r in requests]
    if all(r.get("ttft_s") is not None for r in requests):
        out["ttft_s"] = [float(r["ttft_s"]) for r in requests]
        out["latency_s"] = [float(r["e2e_s"]) for r in requests]
    return out
