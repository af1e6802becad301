"""The verify backends by name: construct one from its row of :data:`dsparkhub.serving.ENGINES` (reference PyTorch
engine, vLLM offline, ``vllm serve``, an SGLang server), refuse the settings it does not take, and read the
speculative method of a drafter. Each backend's module is imported only when it is constructed, so ``dsparkhub verify
--backend reference`` never imports vLLM. The engines themselves, their names and what each supports are data in
:mod:`dsparkhub.serving`; nothing here names one."""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import CheckpointFormatError, EngineUnavailableError
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.serving import ENGINES, Engine, method_names, server_engine_names
from dsparkhub.verify.settings import EngineOptionError
from dsparkhub.verify.stats import Backend

def engine_entry(backend: str | Backend) -> Engine | None:
    """The table row of a backend name, or of a ready backend's ``name`` (None: not an engine of the table)."""
    return ENGINES.get(backend if isinstance(backend, str) else getattr(backend, "name", ""))


def detect_method(draft: str | Path | OpenedDraft) -> str:
    """The speculative method of a drafter folder (or of one already opened): ``dspark``, ``dflash`` or ``eagle3``.

    The variant of its :class:`~dsparkhub.layouts.spec.DraftSpec`, as the vLLM backend reads it
    (:func:`dsparkhub.verify.vllm.method.method_for_drafter`), so the results file and the engine agree. Never
    guesses from the folder name (vLLM does, and loads a DSpark drafter stored under a path containing "dflash" as
    DFlash; FORMATS.md §1).

    Raises:
        LayoutError: no ``config.json``, no known layout matches it, or its variant is not one vLLM serves.
        CheckpointFormatError: the method found is not one a results file records (e.g. EAGLE-1).
    """
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.verify.vllm.method import method_for_drafter, method_for_spec  # no vLLM import here

    if isinstance(draft, OpenedDraft):
        method = method_for_spec(draft.spec)
    else:  # a DeepSpec run folder: its step_latest (as every reader follows it)
        method = method_for_drafter(resolve_step_dir(draft) if Path(draft).is_dir() else draft)
    if method not in method_names():
        raise CheckpointFormatError(f"the drafter's method is {method!r}; dsparkhub verify records "
                                    f"{', '.join(method_names())}", path=draft, hint="pass --method to override")
    return method


def make_backend(name: str, *, target: str, draft: str | OpenedDraft, method: str, device: str | None = None,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 compilation_config: dict | None = None, confidence_threshold: float | None = None,
                 server_url: str | None = None, baseline_url: str | None = None,
                 speculative_config: dict | None = None, layout=None, max_concurrency: int | None = None) -> Backend:
    """Construct a verify backend by name, importing its module only now.

    Args:
        name: a key of :data:`dsparkhub.serving.ENGINES`: ``reference`` (dsparkhub's PyTorch engine, CPU or CUDA),
            ``vllm`` (vLLM offline ``LLM`` in a child process), ``vllm-serve`` (a running ``vllm serve`` at
            ``server_url``) or ``sglang-serve`` (a running SGLang server, :mod:`dsparkhub.verify.sglang.backend`).
            The row's ``arguments`` say which of the values below its class is constructed with.
        target / draft: target and drafter (folders, or what the engine accepts); an opened drafter is handed on
            as it is to an engine whose row takes ``opened_draft`` (the reference engine), as its folder otherwise.
        method: ``dspark`` | ``dflash`` | ``eagle3`` (always passed explicitly to vLLM).
        device: ``cpu`` / ``cuda`` for the reference engine (None = its default).
        tensor_parallel_size / max_model_len / compilation_config: vLLM engine settings.
        confidence_threshold: proposal truncation threshold (reference engine).
        server_url: base URL of ``vllm serve`` with the drafter (``vllm-serve`` only).
        baseline_url: base URL of a ``vllm serve`` of the same target without a drafter (``vllm-serve`` only).
        speculative_config: extra keys for vLLM's ``speculative_config`` (``vllm`` only; ``spec_options``).
        layout: the :class:`~dsparkhub.verify.parallel.ParallelLayout` (``vllm``: pipeline parallel size,
            executor and ``RAY_ADDRESS`` for the engine; checked before by ``check_layout``).
        max_concurrency: the sweep's highest concurrency for an engine driven by a closed loop over its own API
            (``vllm``: ``max_num_seqs`` >= it, :mod:`dsparkhub.verify.vllm.closed_loop`); None: batch 1.

    Raises:
        EngineUnavailableError: unknown name, the engine's module is missing (vLLM not installed), or a setting the
            chosen backend does not take.
    """
    check_engine_options(name, device=device, tensor_parallel_size=tensor_parallel_size,
                          confidence_threshold=confidence_threshold, server_url=server_url, baseline_url=baseline_url)
    engine = ENGINES[name]
    folder = str(draft.checkpoint.path) if isinstance(draft, OpenedDraft) else draft
    values = {"target": target, "draft": folder, "opened_draft": draft, "method": method, "device": device,
              "tensor_parallel_size": tensor_parallel_size, "max_model_len": max_model_len,
              "compilation_config": compilation_config, "confidence_threshold": confidence_threshold,
              "server_url": server_url, "baseline_url": baseline_url, "speculative_config": speculative_config or None,
              "engine_args": (layout.engine_args() or None) if layout else None,
              "env": (layout.env() or None) if layout else None, "max_concurrency": max_concurrency}
    try:
        cls = engine.load()
    except ImportError as exc:
        raise EngineUnavailableError(f"the {engine.label} ({name}) cannot be imported: {exc}") from exc
    # A running server's settings were fixed at launch; TP / max_model_len / compilation config are recorded
    # in the results as given (Engine.settings), so give the values the servers were started with.
    return cls(**{kw: values[key] for key, kw in engine.arguments.items() if values[key] is not None})


def check_engine_options(name: str, *, device: str | None, tensor_parallel_size: int,
                          confidence_threshold: float | None, server_url: str | None,
                          baseline_url: str | None) -> None:
    """Refuse a backend name or a setting the chosen backend does not take; ``run_verify`` calls this before any
    model or prompt is loaded.

    Raises:
        EngineOptionError: naming the setting and the backend that takes it.
    """
    engine = ENGINES.get(name)
    if engine is None:
        raise EngineOptionError(f"unknown backend {name!r}; expected one of {', '.join(ENGINES)}")
    servers = " / ".join(server_engine_names())
    if not engine.server and (server_url or baseline_url):
        raise EngineOptionError(f"--server-url / --baseline-url are only for --backend {servers}")
    if "tensor_parallel_size" not in engine.settings and tensor_parallel_size != 1:
        raise EngineOptionError(f"the {name} engine runs on one device; --tp {tensor_parallel_size} needs "
                                "--backend vllm")
    if "confidence_threshold" not in engine.settings and confidence_threshold is not None:
        raise EngineOptionError(f"the {engine.label} has no confidence threshold (the reference engine's proposal "
                                "truncation; vLLM 0.32 offers adaptive verification, a cost model); drop "
                                "--confidence-threshold or use --backend reference")
    if "device" not in engine.settings and device is not None:
        raise EngineOptionError(f"--device is for the reference engine; {engine.label} picks its own device")
    if "device" in engine.settings:
        check_torch_device(device)
    if engine.server and not server_url:
        raise EngineOptionError(f"--backend {name} needs --server-url (the {engine.label} started with the drafter) "
                                "and --baseline-url (the same target without a drafter)")


def check_torch_device(device: str | None) -> None:
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
