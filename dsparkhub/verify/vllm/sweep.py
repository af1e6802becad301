"""Verify at serving load with vLLM's own tools: ``vllm serve`` per configuration, ``vllm bench serve`` per concurrency.

:class:`VllmServeSweepBackend` is the verify backend that ``dsparkhub verify --backend vllm-serve --concurrency
C1,C2,...`` and ``--backend vllm --load-driver bench-serve --concurrency ...`` use (the runner picks it through
:func:`sweep_backend` when a concurrency other than the default 1 is asked; ``--backend vllm`` alone drives its
offline engine with :mod:`dsparkhub.verify.vllm.closed_loop` instead). For every ``run(prompts,
num_speculative_tokens=n, concurrency=c)`` it

1. makes sure a server for configuration ``n`` is up: with ``--backend vllm`` it starts ``vllm serve`` itself
   (:class:`dsparkhub.verify.vllm.serve.ServeProcess`: baseline without ``--speculative-config``, then one server
   per n, each stopped before the next starts and always at the end); with ``--backend vllm-serve`` it uses the
   servers the user started (``--server-url`` with the drafter, ``--baseline-url`` without);
2. once per configuration and prompt set, generates greedily with token ids in and out
   (:class:`dsparkhub.verify.vllm.server.VllmServerBackend`, one request at a time, ``ignore_eos``): these outputs
   are what the runner's lossless check compares, token id by token id, with the baseline's;
3. runs ``vllm bench serve --max-concurrency c`` over the same prompts (:mod:`dsparkhub.verify.vllm.bench_serve`)
   and reads throughput, per-request TTFT and latency from its result JSON, and τ / per-position acceptance from
   the server's ``vllm:spec_decode_*`` counters read before and after (integer counts; vLLM's bench prints the
   same deltas as rates).

Files (kept): the server logs ``serve-baseline.log`` / ``serve-n3.log``, the bench logs and result JSONs
``bench-n3-c4-1.json`` and the prompts files, in ``log_dir`` (the CLI puts it next to the results file:
``results.json`` -> ``results.vllm/``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.stats import RunStats
from dsparkhub.verify.vllm.bench_serve import BenchResult, bench_command, run_bench, write_prompts_file
from dsparkhub.verify.vllm.serve import ServeProcess, check_bench_dependencies, find_vllm

__all__ = ["VllmServeSweepBackend", "check_reach", "sweep_backend"]


def check_reach(concurrency: Sequence[int], prompts_per_dataset: Sequence[int],
                dataset_names: Sequence[str] | None = None, sender: str = "`vllm bench serve`") -> None:
    """Refuse a concurrency no dataset can fill (fewer prompts than requests meant to be in flight); ``sender``
    names what sends each prompt once (the bench, or the engine-loop driver).

    Raises:
        EngineUnavailableError: one paragraph naming the concurrency and the dataset.
    """
    top = max(concurrency)
    for i, count in enumerate(prompts_per_dataset):
        if count < top:
            name = dataset_names[i] if dataset_names else f"dataset {i + 1}"
            raise EngineUnavailableError(
                f"--concurrency {top} cannot be reached on {name}: it has {count} prompts, so at most {count} "
                f"requests are ever in flight together. Why: {sender} sends each prompt once, and the "
                f"figures would be labelled {top} while measuring {count}. What to do: give at least {top} prompts "
                f"(--max-prompts, a larger prompts file), or a concurrency of at most {count}.")


class VllmServeSweepBackend:
    """A verify backend measuring each configuration with ``vllm bench serve`` at the asked concurrency.

    Args:
        target: target folder or Hub id (what ``vllm serve`` serves; also ``vllm bench serve``'s tokenizer).
        drafter: drafter folder or Hub id (``--speculative-config`` model); None with user servers.
        method: vLLM speculative method (always passed explicitly).
        server_url / baseline_url: user servers (``--backend vllm-serve``); None: dsparkhub starts its own.
        serve_args: more ``vllm serve`` arguments for owned servers (``--max-model-len``, ``--dtype``, ...).
        speculative_extra: more ``--speculative-config`` keys for owned servers.
        env: extra environment for the servers and the bench.
        log_dir: where server logs, prompts files, bench logs and bench results are written (kept).
        vllm: the ``vllm`` executable (None: :func:`dsparkhub.verify.vllm.serve.find_vllm`).
        start_timeout_s / bench_timeout_s: limits of one server start / one bench run.
        tokenizer: decodes the prompts' token ids to the bench's text prompts (None: the target's, loaded lazily).

    Raises:
        EngineUnavailableError: no ``vllm`` executable, or its Python lacks pandas (which the bench needs).
    """

    interleaves = False  # one server per configuration: configuration-outer

    def __init__(self, target: str | Path, drafter: str | Path | None = None, *, method: str | None = None,
                 server_url: str | None = None, baseline_url: str | None = None,
                 serve_args: Sequence[str] = (), speculative_extra: dict | None = None,
                 env: dict[str, str] | None = None, log_dir: str | Path, vllm: str | Path | None = None,
                 start_timeout_s: float = 900.0, bench_timeout_s: float = 3600.0, tokenizer=None):
        from dsparkhub.verify.vllm.offline import vllm_version

        self.exe = find_vllm(vllm)
        check_bench_dependencies(self.exe)
        self.target, self.drafter, self.method = str(target), (str(drafter) if drafter else None), method
        self.owned = server_url is None
        self.name = "vllm" if self.owned else "vllm-serve"
        self.server_url, self.baseline_url = server_url, baseline_url
        self.serve_args, self.speculative_extra = list(serve_args), dict(speculative_extra or {})
        self.env = dict(env or {})
        self.log_dir = Path(log_dir)
        self.start_timeout_s, self.bench_timeout_s = start_timeout_s, bench_timeout_s
        installed = vllm_version()
        self.version = f"vllm {installed}" if installed else "vllm (server)"
        self.device = ("vllm serve started by dsparkhub" if self.owned else "vllm serve started by the user") + \
            ", load from vllm bench serve"
        self._server: ServeProcess | None = None
        self._server_n: int | None = None
        self._outputs: dict[tuple, list[list[int]]] = {}
        self._tokenizer = tokenizer
        self._count = 0
        self.last_bench: BenchResult | None = None

    # ------------------------------------------------------------------------------------------- servers

    def _what(self, n: int | None) -> str:
        version = self.version.replace("vllm ", "vLLM ")
        if n is None:
            return f"`vllm serve` ({version}, target {self.target}, no drafter)"
        return f"`vllm serve` ({version}, target {self.target}, {self.method} drafter {self.drafter}, n={n})"

    def server_args(self, n: int | None) -> list[str]:
        """The ``vllm serve`` arguments after ``MODEL --host --port`` for configuration ``n`` (None: baseline)."""
        args = list(self.serve_args)
        if n is not None:
            if self.method is None:
                raise VerifyError(f"num_speculative_tokens={n} requested but no speculative method is known.",
                                  hint="pass --method")
            spec = {"method": self.method, "num_speculative_tokens": int(n), **self.speculative_extra}
            if self.drafter is not None:
                spec["model"] = self.drafter
            args += ["--speculative-config", json.dumps(spec)]
        return args

    def _url(self, n: int | None) -> str:
        """The base URL serving configuration ``n``, starting (and replacing) an owned server as needed."""
        if not self.owned:
            url = self.server_url if n is not None else self.baseline_url
            if url is None:
                raise EngineUnavailableError(
                    "The baseline (no drafter) was asked but no --baseline-url was given. Why: a `vllm serve` keeps "
                    "the drafter it was launched with. What to do: start a second server for the same target "
                    "without --speculative-config and pass it as --baseline-url.")
            return url.rstrip("/").removesuffix("/v1")
        if self._server is not None and self._server_n == n and self._server.alive():
            return self._server.url
        self.close()
        label = "baseline" if n is None else f"n{n}"
        server = ServeProcess(self.exe, self.target, self.server_args(n), log=self.log_dir / f"serve-{label}.log",
                              env=self.env, what=self._what(n), start_timeout_s=self.start_timeout_s)
        server.start()
        self._server, self._server_n = server, n
        return server.url

    def _check_alive(self, n: int | None, url: str, when: str) -> None:
        if self.owned and self._server is not None and not self._server.alive():
            server, self._server = self._server, None
            message = server.died_paragraph(when)
            server.stop()
            raise EngineUnavailableError(message)
        if not self.owned and not _healthy(url):
            raise EngineUnavailableError(
                f"The vLLM server at {url} stopped answering {when}. Why: it crashed or was stopped. What to "
                f"do: read its log, restart it, and rerun; what was measured before it is kept.")

    # ------------------------------------------------------------------------------------------------ run

    def _texts(self, prompts: list[list[int]]) -> list[str]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.target)
            except Exception as exc:  # noqa: BLE001 - any loader failure means the same to the user
                raise EngineUnavailableError(
                    f"`vllm bench serve` needs the target's tokenizer, and {self.target} has none that loads "
                    f"({type(exc).__name__}: {exc}). Why: vLLM's load generator sends text prompts. What to do: "
                    "give the target folder or Hub id (with tokenizer files) as TARGET.") from exc
        return [self._tokenizer.decode(p) for p in prompts]

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0, concurrency: int = 1) -> RunStats:
        """One configuration at one concurrency; see ``stats.Backend.run`` and the module docstring.

        Returns:
            RunStats: ``outputs`` from the token-id pass; ``wall_s`` the bench's duration (scaled so that tokens/s
            equals vLLM's "output token throughput" if its token count differs); ``ttft_s`` / ``latency_s`` per
            request from the bench; spec-decode counter deltas around the bench.

        Raises:
            EngineUnavailableError: the server refused to start, died, or stopped answering (one paragraph; the
                runner keeps what was measured before and marks the rest ``incomplete``).
            VerifyError: the bench failed, requests failed, the server drafted another n than asked, or the
                server never ran ``concurrency`` requests at once.
        """
        from dsparkhub.verify.vllm.server import VllmServerBackend

        n = num_speculative_tokens
        if concurrency > len(prompts):
            check_reach([concurrency], [len(prompts)])
        url = self._url(n)
        what = "baseline" if n is None else f"n={n}"
        ids = VllmServerBackend(url, baseline_url=url, ignore_eos=True)
        key = (n, max_new_tokens, float(temperature), seed, tuple(tuple(p) for p in prompts))
        try:
            model = ids._model(url)
            if key not in self._outputs:
                self._outputs[key] = ids.run(prompts, num_speculative_tokens=n, max_new_tokens=max_new_tokens,
                                             temperature=temperature, seed=seed).outputs
        except VerifyError:  # a dead server explains itself better than the refused request
            self._check_alive(n, url, f"during the {what} token-id pass")
            raise
        outputs = self._outputs[key]
        self._count += 1
        label = "baseline" if n is None else f"n{n}"
        stem = f"bench-{label}-c{concurrency}-{self._count}"
        dataset = write_prompts_file(self.log_dir / f"{stem}.prompts.jsonl", self._texts(prompts), max_new_tokens)
        argv = bench_command(self.exe, base_url=url, model=model, tokenizer=self.target, dataset=dataset,
                             num_prompts=len(prompts), concurrency=concurrency, output_len=max_new_tokens,
                             result_dir=self.log_dir, result_filename=f"{stem}.json", temperature=temperature,
                             seed=seed)
        before = ids.counters(url)
        try:
            bench = run_bench(argv, result_path=self.log_dir / f"{stem}.json", log=self.log_dir / f"{stem}.log",
                              base_url=url, model=model, env={**os.environ, **self.env},
                              timeout_s=self.bench_timeout_s)
        except VerifyError:
            self._check_alive(n, url, f"during `vllm bench serve` ({what}, concurrency {concurrency})")
            raise
        self._check_alive(n, url, f"during `vllm bench serve` ({what}, concurrency {concurrency})")
        delta = ids.counters(url) - before
        self.last_bench = bench
        return self._stats(bench, outputs, delta, n=n, concurrency=concurrency, url=url, stem=stem)

    def _stats(self, bench: BenchResult, outputs: list[list[int]], delta, *, n: int | None, concurrency: int,
               url: str, stem: str) -> RunStats:
        where = self.log_dir / f"{stem}.json"
        if bench.failed or bench.completed != len(outputs):
            first = next((e for e in bench.errors if e), "no error text")
            raise VerifyError(f"`vllm bench serve` completed {bench.completed} of {len(outputs)} requests at "
                              f"concurrency {concurrency} ({bench.failed} failed; first error: {first[:300]}). "
                              f"Result: {where}.", hint="read the server log next to it")
        if bench.peak_running is not None and bench.peak_running < concurrency:
            raise VerifyError(
                f"--concurrency {concurrency} was not reached: the server at {url} ran at most "
                f"{bench.peak_running} requests at once while `vllm bench serve` kept {concurrency} in flight. Why: "
                f"the server's --max-num-seqs or its KV cache limits the batch, so the figures would be labelled "
                f"{concurrency} while measuring {bench.peak_running}. What to do: raise --max-num-seqs / the KV "
                f"cache (--gpu-memory-utilization, VLLM_CPU_KVCACHE_SPACE on CPU), or measure at most "
                f"{bench.peak_running}.")
        if n is not None:
            if delta.num_drafts == 0:
                raise VerifyError(f"the drafter server at {url} counted no drafts during `vllm bench serve`.",
                                  hint="check that it was started with --speculative-config")
            if delta.accepted_per_pos and len(delta.accepted_per_pos) != n:
                raise VerifyError(f"the server at {url} drafts {len(delta.accepted_per_pos)} tokens per step but "
                                  f"num_speculative_tokens={n} was asked; a server's n is fixed at launch.",
                                  hint="verify only the n the server was started with")
        ours = sum(len(o) for o in outputs)
        wall = bench.duration_s
        if bench.total_output_tokens != ours and bench.output_throughput > 0:
            wall = ours / bench.output_throughput  # tokens/s stays vLLM's figure
        timed = len(bench.latencies_s) == len(outputs) and len(bench.ttfts_s) == len(outputs)
        return RunStats(outputs=outputs, wall_s=wall, num_drafts=delta.num_drafts,
                        num_draft_tokens=delta.num_draft_tokens, num_accepted_tokens=delta.num_accepted_tokens,
                        accepted_per_pos=list(delta.accepted_per_pos) if n is not None else [],
                        ttft_s=list(bench.ttfts_s) if timed else None,
                        latency_s=list(bench.latencies_s) if timed else None, concurrency=concurrency)

    def close(self) -> None:
        """Stop the owned server (if any); user servers are left alone."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> "VllmServeSweepBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def sweep_backend(name: str, *, target: str, draft: str, method: str | None, concurrency: Sequence[int],
                  prompts_per_dataset: Sequence[int], dataset_names: Sequence[str] | None = None,
                  out: str | Path | None = None, tensor_parallel_size: int = 1, max_model_len: int | None = None,
                  compilation_config: dict | None = None, server_url: str | None = None,
                  baseline_url: str | None = None, tokenizer=None, layout=None) -> VllmServeSweepBackend:
    """The backend ``run_verify`` uses for ``--backend vllm|vllm-serve`` with ``--concurrency`` (checked first).

    Owned servers get ``--tensor-parallel-size``, ``--max-model-len``, ``--compilation-config`` as given, and on a
    machine without CUDA ``--enforce-eager`` (as the offline backend) and, unless ``VLLM_CPU_KVCACHE_SPACE`` is
    set, a 1 GiB KV cache; a ``layout`` (:class:`~dsparkhub.verify.parallel.ParallelLayout`) adds
    ``--pipeline-parallel-size`` / ``--distributed-executor-backend`` and ``RAY_ADDRESS``. Logs go to ``OUT_STEM.vllm/`` next to ``out`` (a new temporary folder without ``out``).

    Raises:
        EngineUnavailableError: a concurrency above a dataset's prompt count, or no ``vllm`` executable.
    """
    check_reach(concurrency, prompts_per_dataset, dataset_names)
    if out is not None:
        log_dir = Path(out).with_name(Path(out).stem + ".vllm")
    else:
        import tempfile

        log_dir = Path(tempfile.mkdtemp(prefix="dsparkhub-vllm-"))
    args: list[str] = []
    env: dict[str, str] = {}
    if name == "vllm":
        args += ["--tensor-parallel-size", str(tensor_parallel_size)]
        if max_model_len is not None:
            args += ["--max-model-len", str(max_model_len)]
        if compilation_config is not None:
            args += ["--compilation-config", json.dumps(compilation_config)]
        for key, value in (layout.engine_args() if layout is not None else {}).items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env.update(layout.env() if layout is not None else {})
        import torch

        if not torch.cuda.is_available():
            args.append("--enforce-eager")
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        server_url = baseline_url = None
    return VllmServeSweepBackend(target, draft if name == "vllm" else None, method=method, server_url=server_url,
                                 baseline_url=baseline_url, serve_args=args, env=env, log_dir=log_dir,
                                 tokenizer=tokenizer)
