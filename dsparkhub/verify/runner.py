"""Run a verify: validate, then per dataset the baseline and each ``num_speculative_tokens``, then the results file.

This module owns the order of a verify run; backends are constructed by name in
:func:`dsparkhub.verify.engines.make_backend` (lazy imports, so ``dsparkhub verify --backend reference`` never imports
vLLM and the CLI knows no engine details), from the :class:`~dsparkhub.verify.settings.VerifySettings` the CLI builds. It does not generate tokens itself (the backends do: ``reference.ReferenceEngine``,
``vllm.offline`` / ``vllm.server``), compute metrics (``results``) or read prompt files (``prompts``).

Order of a run (each step fails with a clear error before the next, more expensive, one starts):

1. check the arguments (n values, temperature, method detected from the drafter config);
2. ``dsparkhub.validate.validate(draft, target, num_speculative_tokens=max(n))``: fc width, mask token, vocab...
   from safetensors headers, before any model is loaded (``ValidationFailedError`` lists every error); its
   settings-independent pass comes from the drafter's ``validation.json`` (or a record handed in) when its key
   matches (``dsparkhub.validate.record``);
3. read and tokenize every dataset (``PromptFileError`` names the file and line);
4. construct the backend; run every configuration (the baseline without the drafter, then every n) on every
   dataset at every concurrency, ``repeats`` times. A backend that switches configurations for free (the reference
   engine: ``interleaves = True``) runs them *interleaved* — per concurrency and repeat: baseline, n1, n2, ... — so
   a slow spell of a shared machine hits the baseline and the drafter alike; the vLLM backends start one engine per
   configuration and run configuration-outer, the repeats back to back. A speculative baseline (``--baseline``: a
   drafter on the reference engine, the target's MTP layers on vLLM, :mod:`dsparkhub.verify.baseline`) is timed in
   the baseline's place, after an untimed pass of the target alone its greedy outputs are checked against;
5. build and save the results (atomically); with temperature 0 a run whose outputs differ from the baseline makes
   the run *not lossless*: the file is still written (``lossless: false``) and ``LosslessMismatchError`` is raised
   with the dataset, prompt, position and both tokens. An engine that refuses or dies mid-sweep, or Ctrl-C, leaves
   the configurations measured so far in the file (each with the repeats all of them completed), the rest listed
   in ``incomplete``, and its error (or the KeyboardInterrupt) is raised after. Runs where no draft token was
   accepted at any position add a warning (``derive.no_acceptance``). An engine that times its steps (the reference
   engine's ``step_costs``) adds where the time went: draft / verify seconds per step shape and the latency law per
   (n, concurrency) (:func:`dsparkhub.verify.costs.step_costs_record`, the results' optional ``step_costs``).

A prompt plus ``max_new_tokens`` beyond the target's context is refused in steps 1 (``max_new_tokens`` alone) and 3
(each prompt) unless ``settings.allow_beyond_context`` (:mod:`dsparkhub.verify.context`).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsparkhub.errors import DsparkhubError, EngineUnavailableError, VerifyError
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.serving import method_names
from dsparkhub.target import TargetSpec, open_target, public_name
from dsparkhub.validate.record import validate_reusing
from dsparkhub.validate.report import validation_error
from dsparkhub.verify.context import check_new_tokens, check_prompts
from dsparkhub.verify.costs import StepCosts, step_costs_record
from dsparkhub.verify.engines import check_engine_options, detect_method, engine_entry, make_backend
from dsparkhub.verify.parallel import check_layout, layout_of
from dsparkhub.verify.results.derive import build_results, no_acceptance
from dsparkhub.verify.results.identity import target_fingerprint
from dsparkhub.verify.baseline import baseline_engine, baseline_n, check_baseline, mtp_baseline, parse_baseline
from dsparkhub.verify.baseline_results import check_baseline_file, read_baseline_file, rebase
from dsparkhub.verify.results.schema import BaselineRef, EngineInfo, ModelRef, Settings, VerifyResults
from dsparkhub.verify.settings import EngineOptionError, VerifyArgumentError, VerifySettings
from dsparkhub.verify.stats import Backend, RunStats
from dsparkhub.verify.vllm.contract import results_contract

def _validate(draft: str | Path | OpenedDraft, target: str | Path | TargetSpec | None, n: int,
              warn: Callable[[str], None] | None = None,
              engine: str = "vllm", validation=None, told: Callable[[str], None] | None = None):
    """Static checks before any model is loaded (``dsparkhub.validate``); raise with every error listed, pass
    each warning (e.g. DSH401: n larger than a trained block) to ``warn``. ``engine`` (``"reference"`` for the
    reference backend, which reads HF ``output_hidden_states``) decides DSH304 vs DSH313.

    The settings-independent pass is taken from ``validation`` (a :class:`~dsparkhub.validate.record.
    ValidationRecord` made in this process) or the folder's ``validation.json`` when its key matches the drafter and
    target (:func:`~dsparkhub.validate.record.validate_reusing`); otherwise (``told`` says why) it runs here.

    Returns the :class:`~dsparkhub.target.TargetSpec` validated against (a local target folder is opened here once),
    or None for a Hub id or no target."""
    if isinstance(target, (str, Path)) and Path(target).is_dir():
        target = open_target(target)
    report, _ = validate_reusing(draft, target, record=validation, num_speculative_tokens=n, engine=engine,
                                 note=told)
    for f in report.warnings if warn is not None else []:
        warn(f"warning [{f.code}] {f.message}")
    if not report.ok:
        path = draft.checkpoint.path if isinstance(draft, OpenedDraft) else draft
        raise validation_error(report, against="the target", refusing="no model was loaded", path=path,
                               hint="run `dsparkhub validate` for the full report")
    return target if isinstance(target, TargetSpec) else None


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


def _check_driver(row, driver: str | None) -> None:
    """Refuse a ``--load-driver`` the engine's row does not offer (before anything loads).

    Raises:
        EngineOptionError: naming the driver, the engine and the drivers it takes.
    """
    if driver is None or row is None:
        return
    offered = [m for m in (row.batching, *row.other_batching) if m is not None]
    if driver not in offered:
        raise EngineOptionError(f"--load-driver {driver} is not one the {row.label} ({row.name}) takes; it takes "
                                f"{', '.join(offered) or 'none (one request at a time)'}",
                                hint="drop --load-driver, or pick --backend vllm")


def _run_one(backend: Backend, prompts: list[list[int]], *, n: int | None, max_new_tokens: int,
             temperature: float, seed: int, desc: str, progress: bool, concurrency: int = 1) -> RunStats:
    """One configuration with a tqdm bar on stderr (per prompt where the backend reports progress)."""
    from tqdm import tqdm

    kwargs = dict(num_speculative_tokens=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    if concurrency != 1:
        kwargs["concurrency"] = concurrency
    # leave=False: a finished bar is cleared, so the summary table is not preceded by one line per configuration
    with tqdm(total=len(prompts), desc=desc, unit="prompt", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        # The Backend protocol has no progress hook; a backend that offers ``progress=callable(k)`` gets one.
        if _accepts(backend, "progress"):
            kwargs["progress"] = bar.update
        stats = backend.run(prompts, **kwargs)
        bar.update(bar.total - bar.n)
    if len(stats.outputs) != len(prompts):
        raise VerifyError(f"backend {backend.name} returned outputs for {len(stats.outputs)} prompts, "
                                     f"expected {len(prompts)} ({desc})")
    return stats


def open_inputs(draft: str | Path, target: str | Path) -> tuple[str | OpenedDraft, str | TargetSpec]:
    """Open a verify's drafter and target once, from headers and config, for :func:`run_verify` to hand down (to
    validation, the method, the engine and the results' names) instead of each step reading them again.

    A drafter folder is opened with :func:`~dsparkhub.layouts.reading.open_draft` (a DeepSpec run folder: its
    ``step_latest``), a local target folder with :func:`~dsparkhub.target.open_target`. Anything else (a Hub id, a
    served model name, a path that does not exist) is returned as the string it is, and so is a folder that cannot
    be opened: ``run_verify`` then reports that in its own order, after the usage checks, as before. Never reads the
    network.

    Returns:
        ``(the OpenedDraft or the drafter as given, the TargetSpec or the target as given)``.
    """
    d: str | OpenedDraft = str(draft)
    t: str | TargetSpec = str(target)
    if Path(d).is_dir():
        try:
            d = open_draft(d)
        except DsparkhubError:  # deferred, not dropped: run_verify raises it (or the usage error before it)
            pass
    if Path(t).is_dir():
        try:
            t = open_target(t)
        except DsparkhubError:  # as above: validation opens it again and raises
            pass
    return d, t


def _open_engine(backend: str, row, *, target: str, draft: str, opened: OpenedDraft | None, method: str | None, data,
                 load, settings: VerifySettings, spec_options, out, tokenizer) -> Backend:
    """The engine a named backend measures with: for a concurrency sweep the row's driver (vllm: ``engine-loop``,
    vllm-serve: ``bench-serve``) or the one ``--load-driver`` picks; batch 1 the backend itself.

    Raises:
        VerifyArgumentError: a concurrency above a dataset's prompt count (the closed loop sends each prompt once).
        EngineUnavailableError / VerifyError: the engine cannot be made (:func:`make_backend`, ``sweep_backend``).
    """
    # how a concurrency sweep is driven: the row's default (vllm: engine-loop, vllm-serve: bench-serve), or the
    # other mode --load-driver picks (vllm: bench-serve, dsparkhub's own `vllm serve`); batch 1 ignores it
    driver = (load.driver or row.batching) if load.concurrency != (1,) else None
    if driver == "engine-loop":  # the closed loop sends each prompt once, as the bench does
        from dsparkhub.verify.vllm.sweep import check_reach

        check_reach(load.concurrency, [len(ds.prompts) for ds in data], [ds.name for ds in data],
                    sender="dsparkhub's closed loop")
    if driver == "bench-serve":  # vllm serve + vllm bench serve
        from dsparkhub.verify.vllm.sweep import sweep_backend

        return sweep_backend(backend, target=target, draft=draft, method=method, concurrency=load.concurrency,
                             prompts_per_dataset=[len(ds.prompts) for ds in data],
                             dataset_names=[ds.name for ds in data], out=out,
                             tensor_parallel_size=settings.tensor_parallel_size,
                             max_model_len=settings.max_model_len, compilation_config=settings.compilation_config,
                             server_url=settings.server_url, baseline_url=settings.baseline_url,
                             tokenizer=tokenizer, layout=layout_of(settings))
    return make_backend(backend, target=target, draft=opened or draft, method=method,
                        device=settings.device, tensor_parallel_size=settings.tensor_parallel_size,
                        max_model_len=settings.max_model_len,
                        compilation_config=settings.compilation_config, layout=layout_of(settings),
                        confidence_threshold=settings.confidence_threshold, server_url=settings.server_url,
                        baseline_url=settings.baseline_url,
                        speculative_config=spec_options.speculative_config if spec_options else None,
                        max_concurrency=max(load.concurrency) if driver == "engine-loop" else None)


@dataclass
class _Measured:
    """What :func:`_measure` timed: per dataset the baseline runs per concurrency (``base``), the untimed target-alone
    pass a drafter / MTP baseline is checked against (``plain``), the drafter runs per (n, concurrency) (``spec``),
    the reference engine's step costs, where it stopped (``stopped`` / ``incomplete``), the intra-op threads, the
    engine's :class:`EngineInfo` and the order."""

    base: dict
    plain: dict
    spec: dict
    costs: dict
    stopped: DsparkhubError | KeyboardInterrupt | None
    incomplete: list[str]
    threads: int | None
    info: EngineInfo | None
    interleaved: bool


def _measure(engine: Backend, choice, base_n: int | None, *, ns: list[int], data, load, settings: VerifySettings,
             progress: bool, owned: bool) -> _Measured:
    """Run every configuration (the baseline, each n) on every dataset at every concurrency, ``load.repeats`` times:
    interleaved for an engine that switches configurations for free, else configuration-outer. An engine refusal,
    a crash or Ctrl-C stops the loop and is kept in ``stopped`` (what was measured so far is returned); the engine is
    closed here when ``owned``.

    Raises:
        EngineOptionError: a concurrency the engine cannot run (before anything is timed).
        EngineUnavailableError: a baseline the engine cannot run (``baseline_engine`` / ``mtp_baseline``).
    """
    base: dict[str, dict[int, list[RunStats]]] = {ds.name: {} for ds in data}
    plain: dict[str, dict[int, RunStats]] = {ds.name: {} for ds in data}  # a drafter baseline's lossless check
    base_engine = engine
    spec: dict[str, dict[tuple[int, int], list[RunStats]]] = {ds.name: {} for ds in data}
    threads = None
    # the reference engine times its steps (``step_costs``): per (n or None, concurrency), every dataset and repeat
    timed = hasattr(engine, "step_costs")
    costs: dict[tuple[int | None, int], list[tuple[StepCosts, float]]] = {}
    stopped: DsparkhubError | KeyboardInterrupt | None = None
    incomplete: list[str] = []
    try:
        _check_concurrency(engine, load.concurrency)
        threads = _set_threads(engine, load.intra_op_threads)
        if choice.kind == "drafter":  # the same loaded target drafting with the baseline drafter
            base_engine = baseline_engine(engine, choice)
        elif choice.kind == "mtp":  # vLLM with the target's own MTP layers, refused here before any engine starts
            base_engine = mtp_baseline(engine, choice)
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
                common = dict(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                              seed=settings.seed, progress=progress, concurrency=c)
                runner = base_engine if n is None else engine
                # the law prices speedups against the target alone: a drafter baseline's steps are not its T_target
                timing = timed and (n is not None or base_n is None)
                try:
                    if n is None and base_n is not None and settings.temperature == 0 and c not in plain[ds.name]:
                        # untimed: the target alone, against which the baseline drafter's outputs are checked
                        plain[ds.name][c] = _run_one(engine, ds.prompts, n=None, desc=f"{desc} (no speculation)",
                                                     **common)
                    if timing:
                        runner.step_costs = StepCosts()
                    st = _run_one(runner, ds.prompts, n=base_n if n is None else n, desc=desc, **common)
                    if timing:
                        costs.setdefault((n, c), []).append((runner.step_costs, st.wall_s))
                except (EngineUnavailableError, VerifyError, KeyboardInterrupt) as exc:
                    stopped = exc  # Ctrl-C too: what was measured is kept, as after an engine's refusal
                    why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc).splitlines()[0]
                    incomplete.append(f"stopped at {ds.name} {label}, concurrency {c}, repeat {rep + 1}: {why}")
                    break
                if n is None:
                    base[ds.name].setdefault(c, []).append(st)
                else:
                    spec[ds.name].setdefault((n, c), []).append(st)
            if stopped is not None:
                break
        info = EngineInfo(backend=engine.name, version=engine.version, device=engine.device,
                          contract=results_contract(engine.name, engine.version))
    finally:
        if timed:
            engine.step_costs = None
        if owned:
            engine.close()
    return _Measured(base=base, plain=plain, spec=spec, costs=costs, stopped=stopped, incomplete=incomplete,
                     threads=threads, info=info, interleaved=interleaved)


def _checked_ns(settings: VerifySettings) -> list[int]:
    """The n values, sorted, after checking the sampling settings.

    Raises:
        VerifyArgumentError: n values not distinct positive integers, a negative temperature, max_new_tokens < 1.
    """
    ns = sorted(set(int(n) for n in settings.num_speculative_tokens))
    if not ns or ns[0] < 1 or len(ns) != len(list(settings.num_speculative_tokens)):
        raise VerifyArgumentError(f"num_speculative_tokens must be distinct positive integers, found "
                                  f"{list(settings.num_speculative_tokens)}")
    if settings.temperature < 0:
        raise VerifyArgumentError(f"temperature must be >= 0, found {settings.temperature}")
    if settings.max_new_tokens < 1:
        raise VerifyArgumentError(f"max_new_tokens must be at least 1, found {settings.max_new_tokens}")
    return ns


def run_verify(draft: str | Path | OpenedDraft, target: str | Path | TargetSpec,
               settings: VerifySettings = VerifySettings(), *,
               backend: str | Backend = "reference", out: str | Path | None = None, overwrite: bool = False,
               progress: bool = True, check: bool = True, raise_on_mismatch: bool = True, tokenizer=None,
               validate_fn: Callable | None = None, warn: Callable[[str], None] | None = None,
               spec_options=None, validation=None) -> VerifyResults:
    """Verify a drafter against its target and return (and optionally save) the results.

    Args:
        draft: drafter folder (converted, e.g. the output of ``dsparkhub convert``), or the drafter opened once by
            :func:`open_inputs` (then no step reads its headers again).
        target: target folder (or Hub repo id / served model name for the vLLM backends), or its
            :class:`~dsparkhub.target.TargetSpec` (:func:`open_inputs`).
        settings: what to measure and the engine settings (:class:`~dsparkhub.verify.settings.VerifySettings`:
            n values, datasets, sampling, method, engine options, load), recorded in the results.
        backend: a backend name for :func:`make_backend`, or a ready :class:`Backend` (not closed here).
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
        spec_options: speculative-config extras, n = block size, notes (``spec_options.SpecOptions``; None: none).
        validation: the drafter's :class:`~dsparkhub.validate.record.ValidationRecord` when one was just made (the
            quickstart hands on convert's); used when its key matches, as the folder's ``validation.json`` is.

    Returns:
        The :class:`VerifyResults` (also written to ``out``).

    Raises:
        VerifyArgumentError (a ValueError): bad n values / temperature / max_new_tokens / method / results path, a
            prompt plus ``max_new_tokens`` beyond the target's context (without ``allow_beyond_context``), or
            (EngineOptionError) a backend setting the backend does not take; raised before any model loads.
        ValidationFailedError: the drafter does not fit the target (no model was loaded).
        PromptFileError: a dataset cannot be read or tokenized.
        EngineUnavailableError / VerifyError: the engine is missing, refused or crashed.
        LosslessMismatchError: greedy outputs differ (after ``out`` was written).
        OutputExistsError / OutputNotWritableError: ``out`` exists (without ``overwrite``) or cannot be written.
        EngineUnavailableError / VerifyError raised mid-sweep, or KeyboardInterrupt (Ctrl-C): after ``out`` was
            written with the configurations measured so far and ``incomplete`` naming where it stopped (the
            interrupt's ``partial_results`` is ``out``); with nothing measured with the drafter, no file.
    """
    load = settings.load.checked()
    method = settings.method
    opened = draft if isinstance(draft, OpenedDraft) else None  # a local drafter is opened once, below at latest
    target_spec = target if isinstance(target, TargetSpec) else None
    target = target_spec.source if target_spec is not None else target
    ns = _checked_ns(settings)
    check_new_tokens(target, settings.max_model_len, settings.max_new_tokens, settings.allow_beyond_context)
    choice = parse_baseline(settings.baseline)  # --baseline, refused (check_baseline) before anything loads
    named = engine_entry(backend) if isinstance(backend, str) else None  # a ready backend is measured as it is
    check_baseline(choice, backend=backend if isinstance(backend, str) else backend.name, target=target,
                   interleaves=backend == "reference" if isinstance(backend, str) else
                   bool(getattr(backend, "interleaves", False)),
                   runs_mtp=named.mtp_baseline if named else hasattr(backend, "check_mtp"),
                   serve_sweep=max(load.concurrency) > 1 and named is not None
                   and (load.driver or named.batching) == "bench-serve")
    if opened is not None:
        draft = opened.checkpoint.path  # its step_latest for a DeepSpec run folder, resolved when it was opened
    elif Path(draft).is_dir():  # a DeepSpec run folder: measure (and fingerprint, and name) its step_latest
        from dsparkhub.layouts.deepspec_run import resolve_step_dir

        draft = resolve_step_dir(draft)
    draft, target = str(draft), str(target)
    spec_notes: list[str] = []
    if spec_options is not None:  # dsparkhub.verify.spec_options: lossy-rejection refusal, n = block size
        from dsparkhub.verify.spec_options import prepare

        ns, spec_notes = prepare(spec_options, ns, draft=opened or draft, temperature=settings.temperature,
                                 backend=backend)
    if isinstance(backend, str):
        check_engine_options(backend, device=settings.device, tensor_parallel_size=settings.tensor_parallel_size,
                              confidence_threshold=settings.confidence_threshold, server_url=settings.server_url,
                              baseline_url=settings.baseline_url)
        if engine_entry(backend).batching is None and max(load.concurrency) > 1:  # refused before any model loads
            raise EngineOptionError(f"backend {backend} runs one request at a time, so --concurrency "
                                    f"{max(load.concurrency)} is out of its reach; measure serving load with "
                                    "--backend reference (batched decoding)", hint="drop --concurrency")
        _check_driver(engine_entry(backend), load.driver)
    if method is not None and method not in method_names():
        raise VerifyArgumentError(f"unknown method {method!r}; expected one of {', '.join(method_names())}")
    try:
        if opened is None and (Path(draft) / "config.json").is_file():  # without one, detect_method says so
            opened = open_draft(draft)
        detected = detect_method(opened or draft)
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
    if out is not None:
        check_results_path(out, overwrite=overwrite)
    row = engine_entry(backend)  # a ready backend: the row of its name (None: no row, e.g. a test's stand-in)
    if isinstance(backend, str) and method is not None and method not in row.methods:
        raise EngineUnavailableError(f"the {row.label} ({row.name}) does not serve {method} drafters; it serves "
                                     f"{', '.join(row.methods)}", hint="pick another --backend")
    layout_notes: list[str] = []
    if isinstance(backend, str):  # T x P fits the node / Ray cluster, layers split, drafter runs under it
        layout_notes = check_layout(layout_of(settings), backend=backend, target=target, method=method,
                                    speculative_config=spec_options.speculative_config if spec_options else None)
    if isinstance(backend, str) and method in row.gpu_methods:
        refuse_dspark_without_gpu(method)
    noted: list[str] = []  # stored in the results file as `warnings`, and passed on to `warn`

    def note(line: str) -> None:
        noted.append(line.removeprefix("warning: ").removeprefix("warning "))
        if warn is not None:
            warn(line)

    for line in spec_notes:
        note(line)
    for line in layout_notes:
        if line.startswith("warning"):
            note(line)
        elif warn is not None:
            warn(line)
    if check:
        # A running server's model name need not be a folder or a Hub id: check the drafter alone then.
        served_name = isinstance(backend, str) and row.server and not Path(target).is_dir()
        if validate_fn is not None:
            validate_fn(draft, None if served_name else target, max(ns))
        else:
            # a local target is opened once, by validation at the latest: the results' name reads the same one
            target_spec = _validate(opened or draft, None if served_name else (target_spec or target), max(ns), note,
                                    engine=row.name if row is not None else "vllm", validation=validation,
                                    told=warn) or target_spec
            if choice.kind == "drafter":  # the baseline drafter must fit the target too
                _validate(choice.path, target_spec or target, baseline_n(choice, ns), note,
                          engine=row.name if row else "vllm")

    from dsparkhub.verify.prompts import load_datasets

    data = load_datasets(settings.datasets, target, max_prompts=settings.max_prompts, tokenizer=tokenizer)
    check_prompts(data, target, settings.max_model_len, settings.max_new_tokens, settings.allow_beyond_context, note)
    # local folders are named by Hub id (target) or folder name plus fingerprint, never by local path
    target_ref = ModelRef(id=public_name(target_spec or target), fingerprint=target_fingerprint(target))
    base_file = None
    if choice.kind == "results":  # the file's setup must be this run's, refused before the engine starts
        base_file = read_baseline_file(f"{choice.path}@{choice.n}" if choice.n is not None else choice.path)
        file_setup = {"target_fingerprint": target_ref.fingerprint, "target_id": target_ref.id,
                      "datasets": [(ds.name, ds.source) for ds in data], "temperature": settings.temperature,
                      "max_new_tokens": settings.max_new_tokens, "concurrency": list(load.concurrency)}
        check_baseline_file(base_file, backend=backend if isinstance(backend, str) else backend.name, version=None,
                            **file_setup)

    owned = isinstance(backend, str)
    engine = _open_engine(backend, row, target=target, draft=draft, opened=opened, method=method, data=data,
                          load=load, settings=settings, spec_options=spec_options, out=out, tokenizer=tokenizer) \
        if owned else backend
    base_n = baseline_n(choice, ns) if choice.kind == "drafter" else choice.n if choice.kind == "mtp" else None
    m = _measure(engine, choice, base_n, ns=ns, data=data, load=load, settings=settings, progress=progress,
                 owned=owned)
    base, plain, spec, costs = m.base, m.plain, m.spec, m.costs
    stopped, incomplete, threads, info, interleaved = m.stopped, m.incomplete, m.threads, m.info, m.interleaved
    if stopped is not None and not any(spec.values()):
        raise stopped  # nothing with the drafter was measured: no file, the engine's error as it was
    runs = []
    for ds in data:
        done, by, short = _measured(base[ds.name], spec[ds.name], load.repeats)
        missing = [f"n={n} @ concurrency {c}" for c in load.concurrency for n in ns if (n, c) not in by]
        if missing and stopped is not None:
            incomplete.append(f"dataset {ds.name}: not measured: {', '.join(missing)}")
        incomplete += [f"dataset {ds.name} @ concurrency {c}: {k} of {load.repeats} repeat(s) measured"
                       for c, k in short.items()]
        runs.append((ds.name, ds.source, done, by))

    results = build_results(
        engine=info, method=method,
        target=target_ref,
        drafter=ModelRef(id=Path(draft).resolve().name if Path(draft).is_dir() else draft,
                         fingerprint=checkpoint_fingerprint(draft) if Path(draft).is_dir() else None),
        settings=Settings(temperature=float(settings.temperature), max_new_tokens=settings.max_new_tokens,
                          seed=settings.seed,
                          num_speculative_tokens=ns, tensor_parallel_size=settings.tensor_parallel_size,
                          max_model_len=settings.max_model_len, compilation_config=settings.compilation_config,
                          confidence_threshold=settings.confidence_threshold, batch_size=max(load.concurrency),
                          concurrency=list(load.concurrency), repeats=load.repeats,
                          order="interleaved" if interleaved else "configuration-outer",
                          spread_limit=load.spread_limit, intra_op_threads=threads),
        runs=runs, warnings=noted, incomplete=incomplete, plain=plain,
        baseline=BaselineRef() if base_n is None else BaselineRef(kind="mtp", id="mtp", n=base_n)
        if choice.kind == "mtp" else BaselineRef(
            kind="drafter", id=Path(choice.path).resolve().name, n=base_n,
            fingerprint=checkpoint_fingerprint(choice.path), method=detect_method(choice.path)),
    )
    if costs:  # before a rebase: the law predicts (and is checked against) the speedup over the target alone
        results.step_costs = step_costs_record(results, costs, source=f"{info.backend} engine's own decoding steps")
    if base_file is not None:  # the engine's version is known now; speedups against the file's tokens/s
        check_baseline_file(base_file, backend=info.backend, version=info.version, **file_setup)
        results = rebase(results, base_file)
    line = no_acceptance(results)
    if line is not None:  # a broken drafter (NaN weights, another target) must not pass as "τ 1.00"
        results.warnings = [*results.warnings, line]
        if warn is not None:
            warn(f"warning: {line}")
    if out is not None:
        results.save(out)
    if isinstance(stopped, KeyboardInterrupt):
        stopped.partial_results = out  # the CLI says where the measured configurations went
        raise stopped
    if stopped is not None:
        stopped.hint = ((getattr(stopped, "hint", None) or "") + (" " if getattr(stopped, "hint", None) else "") +
                        (f"partial results (marked `incomplete`) were written to {out}" if out is not None else
                         "the configurations measured before it are returned as partial results")).strip()
        raise stopped
    if raise_on_mismatch and results.lossless is False:
        raise results.lossless_error()
    return results


def _measured(base: dict[int, list[RunStats]], spec: dict[tuple[int, int], list[RunStats]],
              repeats: int) -> tuple[dict[int, list[RunStats]], dict[tuple[int, int], list[RunStats]], dict[int, int]]:
    """What one dataset's results keep: per concurrency the first k repeats of the baseline and of every n measured
    there, k being the fewest any of them completed (all ``repeats`` after a full run; fewer after a stop or Ctrl-C,
    so every configuration already measured stays, its repeats still paired with the baseline's).

    Returns:
        ``(baselines by concurrency, drafter runs by (n, concurrency), {concurrency: k} where k < repeats)``.
    """
    done, by, short = {}, {}, {}
    for c, b in base.items():
        runs = {key: v for key, v in spec.items() if key[1] == c}
        k = min([len(b)] + [len(v) for v in runs.values()])
        if k == 0:
            continue
        done[c] = b[:k]
        by.update({key: v[:k] for key, v in runs.items()})
        if k < repeats and runs:
            short[c] = k
    return done, by, short


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
    from dsparkhub.verify.vllm.refusals import refusal_paragraph

    raise EngineUnavailableError(refusal_paragraph(
        "Model Runner V1 does not support DSpark (no CUDA device here; refused before the baseline ran)",
        method=method, what="vLLM on this machine"))


def check_results_path(out: str | Path, *, overwrite: bool = False) -> None:
    """Make sure the results file can be written before a run of minutes (or hours) starts.

    ``out`` must not exist unless ``overwrite``, and then only as a results file (never a drafter's own file); its
    folder (or the nearest existing folder above it, where ``save`` will create the rest) must take a new entry
    (:func:`dsparkhub.io.ownership.claim_output`, which probes it).

    Raises:
        VerifyArgumentError: ``out`` is empty or a folder, or its parent is a file.
        OutputExistsError: ``out`` exists and ``overwrite`` is False, or it is not a results file.
        OutputNotWritableError: the folder does not take new files (read-only, no permission), or ``out`` is named
            like a checkpoint's own file (``config.json``, ``*.safetensors``, ...).
    """
    from dsparkhub.io.ownership import claim_output

    if str(out) == "" or Path(out).is_dir():
        raise VerifyArgumentError(f"--out {str(out)!r} is a folder (or empty); the results file needs a file path",
                                  hint=f"e.g. --out {Path(out or '.') / 'results.json'}")
    if Path(out).parent.exists() and not Path(out).parent.is_dir():
        raise VerifyArgumentError(f"--out {out}: {Path(out).parent} is a file, not a folder",
                                  hint="give a path in an existing (or new) folder")
    claim_output(out, overwrite=overwrite, kind="results")


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
