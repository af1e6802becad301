"""Run a verify: validate, then per dataset the baseline and each ``num_speculative_tokens``, then the results file.

This module owns the order of a verify run and the one place where backends are constructed by name
(:func:`make_backend`, lazy imports, so ``dsparkhub verify --backend reference`` never imports vLLM and the CLI
knows no engine details). It does not generate tokens itself (the backends do: ``reference.ReferenceEngine``,
``vllm_backend``), compute metrics (``results``) or read prompt files (``prompts``).

Order of a run (each step fails with a clear error before the next, more expensive, one starts):

1. check the arguments (n values, temperature, method detected from the drafter config);
2. ``dsparkhub.validate.validate(draft, target, num_speculative_tokens=max(n))``: fc width, mask token, vocab...
   from safetensors headers, before any model is loaded (``ValidationFailedError`` lists every error);
3. read and tokenize every dataset (``PromptFileError`` names the file and line);
4. construct the backend; run every configuration (the baseline without the drafter, then every n) on every
   dataset at every concurrency, ``repeats`` times. A backend that switches configurations for free (the reference
   engine: ``interleaves = True``) runs them *interleaved* — per concurrency and repeat: baseline, n1, n2, ... — so
   a slow spell of a shared machine hits the baseline and the drafter alike; the vLLM backends start one engine per
   configuration and run configuration-outer, the repeats back to back;
5. build and save the results (atomically); with temperature 0 a run whose outputs differ from the baseline makes
   the run *not lossless*: the file is still written (``lossless: false``) and ``LosslessMismatchError`` is raised
   with the dataset, prompt, position and both tokens. An engine that refuses or dies mid-sweep leaves the
   configurations measured so far in the file, the rest listed in ``incomplete``, and its error is raised after.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dsparkhub.errors import (CheckpointFormatError, DsparkhubError, EngineUnavailableError, OutputExistsError,
                      OutputNotWritableError, ValidationFailedError, VerifyError)
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.target import public_name
from dsparkhub.verify.results import (DEFAULT_SPREAD_LIMIT, METHODS, EngineInfo, ModelRef, Settings, VerifyResults, build_results,
                      target_fingerprint)
from dsparkhub.verify.stats import Backend, RunStats

BACKEND_NAMES = ("reference", "vllm", "vllm-serve", "sglang-serve")
SERVER_BACKENDS = ("vllm-serve", "sglang-serve")


@dataclass(frozen=True)
class LoadOptions:
    """How a verify run is timed: the concurrency axis and the repeats (the honest-timing settings).

    Attributes:
        concurrency: requests in flight together, each measured (``--concurrency 1,8,32``); every value >= 1.
        repeats: timed repeats of every configuration (``--repeats``); speedups are medians of per-repeat ratios.
        spread_limit: (max - min) / median of the per-repeat speedups above which a speedup is marked unreliable.
        intra_op_threads: torch intra-op threads for the reference engine on CPU; None chooses by model size
            (:func:`dsparkhub.torch_threads.threads_for`).
    """

    concurrency: tuple[int, ...] = (1,)
    repeats: int = 1
    spread_limit: float = DEFAULT_SPREAD_LIMIT
    intra_op_threads: int | None = None

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
        return LoadOptions(tuple(cs), self.repeats, self.spread_limit, self.intra_op_threads)


def detect_method(draft: str | Path) -> str:
    """The speculative method of a drafter folder from its ``config.json``: ``dspark``, ``dflash`` or ``eagle3``.

    Uses the same rules as the vLLM backend (``vllm_backend.method_for_drafter``: ``speculators_model_type``,
    then DSpark / DFlash / Eagle3 architectures and config keys), so the results file and the engine agree. Never
    guesses from the folder name (vLLM does, and loads a DSpark drafter stored under a path containing "dflash" as
    DFlash; FORMATS.md §1).

    Raises:
        LayoutError: no readable ``config.json``, or nothing in it names a method.
        CheckpointFormatError: the method found is not one a results file records (e.g. EAGLE-1).
    """
    from dsparkhub.io.checkpoint import resolve_step_dir
    from dsparkhub.verify.vllm.backend import method_for_drafter  # stdlib-only module: vLLM itself is imported by its child

    # a DeepSpec run folder: its step_latest (as every reader follows it)
    method = method_for_drafter(resolve_step_dir(draft) if Path(draft).is_dir() else draft)
    if method not in METHODS:
        raise CheckpointFormatError(f"the drafter's method is {method!r}; dsparkhub verify records "
                                    f"{', '.join(METHODS)}", path=draft, hint="pass --method to override")
    return method


def make_backend(name: str, *, target: str, draft: str, method: str, device: str | None = None,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 compilation_config: dict | None = None, confidence_threshold: float | None = None,
                 server_url: str | None = None, baseline_url: str | None = None,
                 speculative_config: dict | None = None) -> Backend:
    """Construct a verify backend by name, importing its module only now.

    Args:
        name: ``reference`` (dsparkhub's PyTorch engine, CPU or CUDA), ``vllm`` (vLLM offline ``LLM`` in a child
            process), ``vllm-serve`` (a running ``vllm serve`` at ``server_url``) or ``sglang-serve`` (a running SGLang
            server, :mod:`dsparkhub.verify.sglang.backend`).
        target / draft: target and drafter (folders, or what the engine accepts).
        method: ``dspark`` | ``dflash`` | ``eagle3`` (always passed explicitly to vLLM).
        device: ``cpu`` / ``cuda`` for the reference engine (None = its default).
        tensor_parallel_size / max_model_len / compilation_config: vLLM engine settings.
        confidence_threshold: proposal truncation threshold (reference engine).
        server_url: base URL of ``vllm serve`` with the drafter (``vllm-serve`` only).
        baseline_url: base URL of a ``vllm serve`` of the same target without a drafter (``vllm-serve`` only).
        speculative_config: extra keys for vLLM's ``speculative_config`` (``vllm`` only; ``spec_options``).

    Raises:
        EngineUnavailableError: unknown name, the engine's module is missing (vLLM not installed), or a setting the
            chosen backend does not take.
    """
    _check_engine_options(name, device=device, tensor_parallel_size=tensor_parallel_size,
                          confidence_threshold=confidence_threshold, server_url=server_url, baseline_url=baseline_url)
    if name == "reference":
        try:
            from dsparkhub.verify.reference.engine import ReferenceEngine
        except ImportError as exc:
            raise EngineUnavailableError(f"the reference engine cannot be imported: {exc}") from exc
        # The method is read by dsparkhub.verify.reference.modeling from the drafter config; the seed goes to each run.
        return ReferenceEngine(target, draft, device=device or "cpu", confidence_threshold=confidence_threshold)
    if name == "sglang-serve":
        from dsparkhub.verify.sglang.backend import SglangServerBackend

        return SglangServerBackend.from_options(server_url, baseline_url=baseline_url)
    from dsparkhub.verify.vllm.backend import VllmBackend, VllmServerBackend

    if name == "vllm":
        return VllmBackend.from_options(target, draft, method=method, tensor_parallel_size=tensor_parallel_size,
                                        max_model_len=max_model_len, compilation_config=compilation_config,
                                        **({"speculative_extra": speculative_config} if speculative_config else {}))
    # A running server's settings were fixed at launch; TP / max_model_len / compilation config are recorded
    # in the results as given, so give the values the servers were started with.
    return VllmServerBackend.from_options(server_url, baseline_url=baseline_url)


def _check_engine_options(name: str, *, device: str | None, tensor_parallel_size: int,
                          confidence_threshold: float | None, server_url: str | None,
                          baseline_url: str | None) -> None:
    """Refuse a backend name or a setting the chosen backend does not take; ``run_verify`` calls this before any
    model or prompt is loaded.

    Raises:
        EngineOptionError: naming the setting and the backend that takes it.
    """
    if name not in BACKEND_NAMES:
        raise EngineOptionError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    if name not in SERVER_BACKENDS and (server_url or baseline_url):
        raise EngineOptionError("--server-url / --baseline-url are only for --backend vllm-serve / sglang-serve")
    if name == "reference":
        if tensor_parallel_size != 1:
            raise EngineOptionError(f"the reference engine runs on one device; --tp {tensor_parallel_size} needs "
                                    "--backend vllm")
        _check_torch_device(device)
        return
    if confidence_threshold is not None:
        raise EngineOptionError("vLLM 0.32 has no confidence threshold (it offers adaptive verification, a cost "
                                "model); drop --confidence-threshold or use --backend reference")
    if device is not None:
        raise EngineOptionError("--device is for the reference engine; vLLM picks its own device")
    if name == "sglang-serve" and not server_url:
        raise EngineOptionError("--backend sglang-serve needs --server-url (an SGLang server started with "
                                "--speculative-algorithm DSPARK / DFLASH) and --baseline-url (the same target without)")
    if name == "vllm-serve" and not server_url:
        raise EngineOptionError("--backend vllm-serve needs --server-url (a `vllm serve` started with the drafter) "
                                "and --baseline-url (the same target without a drafter)")


def _warn_context_overflow(data, target: str, max_model_len: int | None, max_new_tokens: int,
                           warn: Callable[[str], None] | None) -> None:
    """Warn when prompt + ``max_new_tokens`` passes the context (``--max-model-len``, else the local target's
    ``max_position_embeddings``): vLLM refuses such prompts, and past its trained positions a target's outputs (and
    so τ) mean little."""
    import json

    limit = max_model_len
    cfg = Path(target) / "config.json"
    if limit is None and cfg.is_file():
        try:
            c = json.loads(cfg.read_text())
        except (OSError, ValueError):
            c = {}
        limit = c.get("max_position_embeddings") or (c.get("text_config") or {}).get("max_position_embeddings")
    if warn is None or not isinstance(limit, int):
        return
    for ds in data:
        over = [len(p) for p in ds.prompts if len(p) + max_new_tokens > limit]
        if over:
            warn(f"warning: {len(over)} prompt(s) of dataset {ds.name!r} plus {max_new_tokens} new tokens exceed the "
                 f"context of {limit} tokens (longest prompt {max(over)} tokens); vLLM refuses them and the "
                 "numbers past the context mean little")


def _check_torch_device(device: str | None) -> None:
    """A device the reference engine can use, checked before anything loads.

    Raises:
        EngineOptionError: not a torch device, or not cpu / cuda (usage errors).
        EngineUnavailableError: cuda asked for, but this torch has no usable CUDA device.
    """
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise EngineOptionError(f"--device {device!r} is not a torch device ({str(exc).splitlines()[0]})",
                                hint="use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError(f"--device {device}: this torch ({torch.__version__}) has no usable CUDA device",
                                     hint="drop --device to run on the CPU, or install a CUDA build of torch")
    if dev.type not in ("cpu", "cuda"):
        raise EngineOptionError(f"--device {device}: the reference engine runs on cpu or cuda",
                                hint="use cpu, cuda or cuda:N")


def _validate(draft: str | Path, target: str | Path | None, n: int, warn: Callable[[str], None] | None = None,
              engine: str = "vllm"):
    """Static checks before any model is loaded (``dsparkhub.validate``); raise with every error listed, pass
    each warning (e.g. DSH401: n larger than a trained block) to ``warn``. ``engine`` (``"reference"`` for the
    reference backend, which reads HF ``output_hidden_states``) decides DSH304 vs DSH313."""
    from dsparkhub.validate import validate

    report = validate(draft, target, num_speculative_tokens=n, engine=engine)
    for f in report.warnings if warn is not None else []:
        warn(f"warning [{f.code}] {f.message}")
    if not report.ok:
        lines = "\n".join(f"  - [{f.code}] {f.location}: {f.message}" if getattr(f, "location", None)
                          else f"  - [{f.code}] {f.message}" for f in report.errors)
        raise ValidationFailedError(f"the drafter does not pass validation against the target "
                                    f"({len(report.errors)} error(s)):\n{lines}", report=report, path=draft,
                                    hint="run `dsparkhub validate` for the full report; no model was loaded")


def _accepts(backend: Backend, name: str) -> bool:
    return name in inspect.signature(backend.run).parameters


def _check_concurrency(backend: Backend, concurrency: tuple[int, ...]) -> None:
    """Refuse a concurrency the backend cannot run, before anything is timed.

    Raises:
        EngineOptionError: concurrency above 1 for a backend whose ``run`` takes no ``concurrency``.
    """
    if max(concurrency) > 1 and not _accepts(backend, "concurrency"):
        raise EngineOptionError(
            f"backend {backend.name} runs one request at a time, so --concurrency {max(concurrency)} is out of its "
            f"reach; measure serving load with --backend reference (batched decoding)",
            hint="drop --concurrency, or pick a backend that batches requests")


def _run_one(backend: Backend, prompts: list[list[int]], *, n: int | None, max_new_tokens: int,
             temperature: float, seed: int, desc: str, progress: bool, concurrency: int = 1) -> RunStats:
    """One configuration with a tqdm bar on stderr (per prompt where the backend reports progress)."""
    from tqdm import tqdm

    kwargs = dict(num_speculative_tokens=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    if concurrency != 1:
        kwargs["concurrency"] = concurrency
    with tqdm(total=len(prompts), desc=desc, unit="prompt", file=sys.stderr, disable=not progress,
              leave=True) as bar:
        # The Backend protocol has no progress hook; a backend that offers ``progress=callable(k)`` gets one.
        if _accepts(backend, "progress"):
            kwargs["progress"] = bar.update
        stats = backend.run(prompts, **kwargs)
        bar.update(bar.total - bar.n)
    if len(stats.outputs) != len(prompts):
        raise VerifyError(f"backend {backend.name} returned outputs for {len(stats.outputs)} prompts, "
                                     f"expected {len(prompts)} ({desc})")
    return stats


def run_verify(draft: str | Path, target: str | Path, *, backend: str | Backend = "reference",
               num_speculative_tokens: Sequence[int] = (3, 5, 7), datasets=None, max_new_tokens: int = 128,
               temperature: float = 0.0, seed: int = 0, max_prompts: int | None = None, method: str | None = None,
               device: str | None = None, tensor_parallel_size: int = 1, max_model_len: int | None = None,
               compilation_config: dict | None = None, confidence_threshold: float | None = None,
               server_url: str | None = None, baseline_url: str | None = None, out: str | Path | None = None,
               overwrite: bool = False, progress: bool = True,
               check: bool = True, raise_on_mismatch: bool = True, tokenizer=None,
               validate_fn: Callable | None = None, warn: Callable[[str], None] | None = None,
               load: LoadOptions = LoadOptions(), spec_options=None) -> VerifyResults:
    """Verify a drafter against its target and return (and optionally save) the results.

    Args:
        draft: drafter folder (converted, e.g. the output of ``dsparkhub convert``).
        target: target folder (or Hub repo id / served model name for the vLLM backends).
        backend: a backend name for :func:`make_backend`, or a ready :class:`Backend` (not closed here).
        num_speculative_tokens: the n values to measure (each gets its own run per dataset).
        datasets: ``--datasets`` specs (see ``prompts.parse_dataset_specs``); None = built-in smoke set.
        max_new_tokens: generation cap per prompt.
        temperature: 0 = greedy (lossless check on); > 0 samples and skips the lossless check.
        seed: sampling seed.
        max_prompts: cap per dataset.
        method: ``dspark`` | ``dflash`` | ``eagle3``; detected from the drafter's config.json when None (a value
            that contradicts the config is refused).
        device, tensor_parallel_size, max_model_len, compilation_config, confidence_threshold, server_url,
        baseline_url:
            engine settings (see :func:`make_backend`), recorded in the results.
        out: write the results file here (atomically), also when the run is not lossless; checked before
            anything runs (:func:`check_results_path`).
        overwrite: replace an existing results file ``out``.
        progress: show tqdm bars on stderr.
        check: run ``dsparkhub.validate`` first (skip only for engines that do their own checks).
        raise_on_mismatch: raise :class:`LosslessMismatchError` after saving when a run is not lossless.
        tokenizer: tokenizer to use instead of the target folder's.
        validate_fn: replacement for the validation step ``(draft, target, n) -> None`` (tests).
        warn: called with one line per warning (validation, prompts longer than the context); the CLI prints
            them on stderr. They are also stored in the results' ``warnings``.
        load: concurrency axis, repeats and threads (:class:`LoadOptions`; default one request at a time, once).
        spec_options: speculative-config extras, n = block size, notes (``spec_options.SpecOptions``; None: none).

    Returns:
        The :class:`VerifyResults` (also written to ``out``).

    Raises:
        VerifyArgumentError (a ValueError): bad n values / temperature / max_new_tokens / method / results path,
            or (EngineOptionError) a backend setting the backend does not take; raised before anything loads.
        ValidationFailedError: the drafter does not fit the target (no model was loaded).
        PromptFileError: a dataset cannot be read or tokenized.
        EngineUnavailableError / VerifyError: the engine is missing, refused or crashed.
        LosslessMismatchError: greedy outputs differ (after ``out`` was written).
        OutputExistsError / OutputNotWritableError: ``out`` exists (without ``overwrite``) or cannot be written.
        EngineUnavailableError / VerifyError raised mid-sweep: after ``out`` was written with the configurations
            measured so far and ``incomplete`` naming where it stopped.
    """
    load = load.checked()
    ns = sorted(set(int(n) for n in num_speculative_tokens))
    if not ns or ns[0] < 1 or len(ns) != len(list(num_speculative_tokens)):
        raise VerifyArgumentError(f"num_speculative_tokens must be distinct positive integers, found "
                        f"{list(num_speculative_tokens)}")
    if temperature < 0:
        raise VerifyArgumentError(f"temperature must be >= 0, found {temperature}")
    if max_new_tokens < 1:
        raise VerifyArgumentError(f"max_new_tokens must be at least 1, found {max_new_tokens}")
    if Path(draft).is_dir():  # a DeepSpec run folder: measure (and fingerprint, and name) its step_latest
        from dsparkhub.io.checkpoint import resolve_step_dir

        draft = resolve_step_dir(draft)
    draft, target = str(draft), str(target)
    spec_notes: list[str] = []
    if spec_options is not None:  # dsparkhub.verify.spec_options: lossy-rejection refusal, n = block size
        from dsparkhub.verify.spec_options import prepare

        ns, spec_notes = prepare(spec_options, ns, draft=draft, temperature=temperature, backend=backend)
    if isinstance(backend, str):
        _check_engine_options(backend, device=device, tensor_parallel_size=tensor_parallel_size,
                              confidence_threshold=confidence_threshold, server_url=server_url,
                              baseline_url=baseline_url)
        if backend != "reference" and max(load.concurrency) > 1:  # refused before any model loads
            raise EngineOptionError(f"backend {backend} runs one request at a time, so --concurrency "
                                    f"{max(load.concurrency)} is out of its reach; measure serving load with "
                                    "--backend reference (batched decoding)", hint="drop --concurrency")
    if method is not None and method not in METHODS:
        raise VerifyArgumentError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    try:
        detected = detect_method(draft)
    except DsparkhubError:
        if method is None or Path(draft).is_dir():  # a folder must name its method; a served name need not
            raise
        detected = None
    if method is not None and detected is not None and method != detected:
        raise VerifyArgumentError(f"--method {method} but the drafter's config.json describes a {detected} "
                                  f"drafter; the results would be labelled {method} while the engine drafts as "
                                  f"{detected}", hint="drop --method (it is read from the drafter), or fix the "
                                                      "drafter's config")
    method = method or detected
    if out is not None and (str(out) == "" or Path(out).is_dir()):
        raise VerifyArgumentError(f"--out {str(out)!r} is a folder (or empty); the results file needs a file path",
                                  hint=f"e.g. --out {Path(out or '.') / 'results.json'}")
    if out is not None and Path(out).parent.exists() and not Path(out).parent.is_dir():
        raise VerifyArgumentError(f"--out {out}: {Path(out).parent} is a file, not a folder",
                                  hint="give a path in an existing (or new) folder")
    if out is not None:
        check_results_path(out, overwrite=overwrite)
    if backend == "vllm":
        refuse_dspark_without_gpu(method)
    noted: list[str] = []  # stored in the results file as `warnings`, and passed on to `warn`

    def note(line: str) -> None:
        noted.append(line.removeprefix("warning: ").removeprefix("warning "))
        if warn is not None:
            warn(line)

    for line in spec_notes:
        note(line)
    if check:
        # A running server's model name need not be a folder or a Hub id: check the drafter alone then.
        served_name = backend in SERVER_BACKENDS and not Path(target).is_dir()
        if validate_fn is not None:
            validate_fn(draft, None if served_name else target, max(ns))
        else:
            name = backend if isinstance(backend, str) else getattr(backend, "name", "")
            _validate(draft, None if served_name else target, max(ns), note,
                      engine="reference" if name == "reference" else "vllm")

    from dsparkhub.verify.prompts import load_datasets

    data = load_datasets(datasets, target, max_prompts=max_prompts, tokenizer=tokenizer)
    _warn_context_overflow(data, target, max_model_len, max_new_tokens, note)

    owned = isinstance(backend, str)
    engine = make_backend(backend, target=target, draft=draft, method=method, device=device,
                          tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                          compilation_config=compilation_config, confidence_threshold=confidence_threshold,
                          server_url=server_url, baseline_url=baseline_url,
                          speculative_config=spec_options.speculative_config if spec_options else None) \
        if owned else backend
    base: dict[str, dict[int, list[RunStats]]] = {ds.name: {} for ds in data}
    spec: dict[str, dict[tuple[int, int], list[RunStats]]] = {ds.name: {} for ds in data}
    threads = None
    stopped: DsparkhubError | None = None
    incomplete: list[str] = []
    try:
        _check_concurrency(engine, load.concurrency)
        threads = _set_threads(engine, load.intra_op_threads)
        interleaved = bool(getattr(engine, "interleaves", False))
        reps = range(load.repeats)
        if interleaved:  # per concurrency and repeat: baseline, n1, n2, ... on every dataset
            order = [(c, r, n) for c in load.concurrency for r in reps for n in [None] + ns]
        else:  # one engine per configuration (vLLM): configuration-outer, repeats back to back
            order = [(c, r, n) for n in [None] + ns for c in load.concurrency for r in reps]
        for c, rep, n in order:
            for ds in data:
                label = "baseline" if n is None else f"n={n}"
                desc = f"{ds.name} {label}" + (f" @{c}" if len(load.concurrency) > 1 else "") + \
                    (f" #{rep + 1}" if load.repeats > 1 else "")
                try:
                    st = _run_one(engine, ds.prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                  seed=seed, progress=progress, desc=desc, concurrency=c)
                except (EngineUnavailableError, VerifyError) as exc:
                    stopped = exc
                    incomplete.append(f"stopped at {ds.name} {label}, concurrency {c}, repeat {rep + 1}: "
                                      f"{str(exc).splitlines()[0]}")
                    break
                if n is None:
                    base[ds.name].setdefault(c, []).append(st)
                else:
                    spec[ds.name].setdefault((n, c), []).append(st)
            if stopped is not None:
                break
        info = EngineInfo(backend=engine.name, version=engine.version, device=engine.device)
    finally:
        if owned:
            engine.close()
    if stopped is not None and not any(spec.values()):
        raise stopped  # nothing with the drafter was measured: no file, the engine's error as it was
    full = load.repeats
    runs = []
    for ds in data:
        done = {c: b for c, b in base[ds.name].items() if len(b) == full}
        by = {k: v for k, v in spec[ds.name].items() if len(v) == full and k[1] in done}
        missing = [f"n={n} @ concurrency {c}" for c in load.concurrency for n in ns if (n, c) not in by]
        if missing and stopped is not None:
            incomplete.append(f"dataset {ds.name}: not measured: {', '.join(missing)}")
        runs.append((ds.name, ds.source, done, by))

    results = build_results(
        engine=info, method=method,
        # local folders are named by Hub id (target) or folder name plus fingerprint, never by local path
        target=ModelRef(id=public_name(target), fingerprint=target_fingerprint(target)),
        drafter=ModelRef(id=Path(draft).resolve().name if Path(draft).is_dir() else draft,
                         fingerprint=checkpoint_fingerprint(draft) if Path(draft).is_dir() else None),
        settings=Settings(temperature=float(temperature), max_new_tokens=max_new_tokens, seed=seed,
                          num_speculative_tokens=ns, tensor_parallel_size=tensor_parallel_size,
                          max_model_len=max_model_len, compilation_config=compilation_config,
                          confidence_threshold=confidence_threshold, batch_size=max(load.concurrency),
                          concurrency=list(load.concurrency), repeats=load.repeats,
                          order="interleaved" if interleaved else "configuration-outer",
                          spread_limit=load.spread_limit, intra_op_threads=threads),
        runs=runs, warnings=noted, incomplete=incomplete,
    )
    if out is not None:
        results.save(out)
    if stopped is not None:
        stopped.hint = ((getattr(stopped, "hint", None) or "") + (" " if getattr(stopped, "hint", None) else "") +
                        (f"partial results (marked `incomplete`) were written to {out}" if out is not None else
                         "the configurations measured before it are returned as partial results")).strip()
        raise stopped
    if raise_on_mismatch and results.lossless is False:
        raise results.lossless_error()
    return results


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def refuse_dspark_without_gpu(method: str | None) -> None:
    """Refuse ``--backend vllm`` for a DSpark drafter on a machine without a CUDA GPU before anything runs.

    vLLM 0.32 implements DSpark only in its V2 GPU model runner (``config/vllm.py`` refuses it under the V1 runner,
    which is the only one the CPU build has), so the engine would refuse at the first drafter run, after the whole
    baseline had been generated. DFlash / EAGLE-3 are left to vLLM.

    Raises:
        EngineUnavailableError: ``method`` is ``dspark`` and torch sees no CUDA device; the message is the same
            paragraph (what, why, what to do) vLLM's own refusal gets.
    """
    if method != "dspark" or _cuda_available():
        return
    from dsparkhub.verify.vllm.backend import refusal_paragraph

    raise EngineUnavailableError(refusal_paragraph(
        "Model Runner V1 does not support DSpark (no CUDA device here; refused before the baseline ran)",
        method=method, what="vLLM on this machine"))


def check_results_path(out: str | Path, *, overwrite: bool = False) -> None:
    """Make sure the results file can be written before a run of minutes (or hours) starts.

    ``out`` must not exist unless ``overwrite``; its folder (or the nearest existing folder above it, where
    ``save`` will create the rest) must take a new file: a temporary file is created there and removed.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
        OutputNotWritableError: the folder does not take new files (read-only, no permission).
    """
    import tempfile

    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"results file {out} already exists", path=out,
                                hint="pass --overwrite to replace it, or choose another --out")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.NamedTemporaryFile(prefix=f".{out.name}.", suffix=".probe", dir=folder or "."):
            pass
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write the results file {out}: {folder} does not take new files "
                                     f"({exc.strerror or exc})", path=out,
                                     hint="choose an --out in a folder you can write to") from None


def _set_threads(engine: Backend, threads: int | None) -> int | None:
    """Set torch's intra-op threads for an engine that runs in this process on the CPU (the reference engine);
    returns the count used, or None where the engine runs elsewhere (vLLM children pick their own)."""
    if getattr(engine, "name", None) != "reference" or not hasattr(engine, "num_parameters"):
        return None
    if "cpu" not in str(engine.device).lower():
        return None
    from dsparkhub.torch_threads import threads_for

    threads = threads or threads_for(engine.num_parameters())
    engine.threads = threads  # ReferenceEngine.run scopes torch's intra-op threads to this count
    return threads


class VerifyArgumentError(DsparkhubError, ValueError):
    """A verify argument is out of range (n values, temperature, max_new_tokens, method, results path); the CLI
    reports it as a usage error (exit 2)."""


class EngineOptionError(VerifyArgumentError, EngineUnavailableError):
    """A backend name or a setting the chosen backend does not take (``--tp`` for the reference engine,
    ``--device`` for vLLM, ``--backend vllm-serve`` without ``--server-url`` ...): a usage error (exit 2)."""
