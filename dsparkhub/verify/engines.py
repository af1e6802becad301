"""The verify backends by name: which engine measures (reference PyTorch engine, vLLM offline, ``vllm serve``,
an SGLang server), the settings each one takes, and the speculative method of a drafter. Each backend's module is
imported only when it is constructed, so ``dsparkhub verify --backend reference`` never imports vLLM."""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import CheckpointFormatError, EngineUnavailableError
from dsparkhub.verify.results.schema import METHODS
from dsparkhub.verify.settings import EngineOptionError
from dsparkhub.verify.stats import Backend

BACKEND_NAMES = ("reference", "vllm", "vllm-serve", "sglang-serve")
SERVER_BACKENDS = ("vllm-serve", "sglang-serve")


def detect_method(draft: str | Path) -> str:
    """The speculative method of a drafter folder: ``dspark``, ``dflash`` or ``eagle3``.

    The variant of its :class:`~dsparkhub.layouts.spec.DraftSpec`, as the vLLM backend reads it
    (:func:`dsparkhub.verify.vllm.method.method_for_drafter`), so the results file and the engine agree. Never
    guesses from the folder name (vLLM does, and loads a DSpark drafter stored under a path containing "dflash" as
    DFlash; FORMATS.md §1).

    Raises:
        LayoutError: no ``config.json``, no known layout matches it, or its variant is not one vLLM serves.
        CheckpointFormatError: the method found is not one a results file records (e.g. EAGLE-1).
    """
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.verify.vllm.method import method_for_drafter  # no vLLM import: only its child imports vLLM

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
    check_engine_options(name, device=device, tensor_parallel_size=tensor_parallel_size,
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
    from dsparkhub.verify.vllm.offline import VllmBackend
    from dsparkhub.verify.vllm.server import VllmServerBackend

    if name == "vllm":
        return VllmBackend.from_options(target, draft, method=method, tensor_parallel_size=tensor_parallel_size,
                                        max_model_len=max_model_len, compilation_config=compilation_config,
                                        **({"speculative_extra": speculative_config} if speculative_config else {}))
    # A running server's settings were fixed at launch; TP / max_model_len / compilation config are recorded
    # in the results as given, so give the values the servers were started with.
    return VllmServerBackend.from_options(server_url, baseline_url=baseline_url)


def check_engine_options(name: str, *, device: str | None, tensor_parallel_size: int,
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
        check_torch_device(device)
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
