"""The engines dsparkhub measures a drafter with, and the speculative methods they serve it by: one table each.

Everything that names an engine or a method reads it from here: ``verify --backend`` / ``--method`` choices, the
results schema's allowed ``engine.backend`` and ``method``, ``validate --engine`` and the final-layer rule, the card's
labels, ``vllm-check --method``, and the verify runner's capability checks (:mod:`dsparkhub.verify.engines`). Adding an
engine is one module with a :class:`~dsparkhub.verify.stats.Backend` class plus one :class:`Engine` row here (the
README's "Extending dsparkhub" lists the rest); ``tests/test_engines.py`` registers a toy engine that way.

A leaf: it imports nothing of dsparkhub, so every layer (validate, verify, card, cli) may read it. It does not import
an engine: :meth:`Engine.load` does, when a verify constructs one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Engine:
    """One engine ``dsparkhub verify --backend NAME`` measures with.

    Attributes:
        name: the ``--backend`` value and the results file's ``engine.backend``.
        label: how the card titles its numbers (``"vLLM server"``).
        server: True when it measures running servers (``--server-url`` with the drafter, ``--baseline-url``
            without); False when dsparkhub starts the engine itself (offline).
        batching: how ``--concurrency`` above 1 is measured by default: ``"batched"`` (the engine decodes a batch
            itself), ``"engine-loop"`` (dsparkhub keeps exactly c requests in flight through the engine's own API,
            :mod:`dsparkhub.verify.vllm.closed_loop`), ``"bench-serve"`` (``vllm serve`` driven by ``vllm bench
            serve``, :mod:`dsparkhub.verify.vllm.sweep`), or None (one request at a time: refused before anything
            loads).
        other_batching: the other modes ``verify --load-driver`` may pick for it instead of ``batching``.
        final_layer_state: how it reads the state of a target layer that is the last one: ``"raw"`` (the decoder
            layer's output, before the final norm) or ``"normed"`` (after it); :mod:`dsparkhub.validate.settings`
            rule DSH304 / DSH313.
        final_layer_source: where that state comes from, in words, for the finding's message.
        methods: the speculative methods it serves (names in :data:`METHODS`).
        gpu_methods: methods it serves on a CUDA GPU only; refused on a machine without one before anything runs.
        mtp_baseline: it measures ``verify --baseline mtp:N`` (the target's own MTP layers) one request at a time.
        settings: the verify settings it takes besides target / drafter / method (``device``,
            ``tensor_parallel_size``, ``confidence_threshold``, ...); any other one given is refused
            (:func:`dsparkhub.verify.engines.check_engine_options`). A server records TP / context length / compile
            settings as given: they were fixed at its launch.
        module / cls: where its :class:`~dsparkhub.verify.stats.Backend` class lives, imported by :meth:`load` only.
        arguments: verify setting -> keyword of ``cls(...)`` for the values it is constructed with (None values are
            not passed, so the class's defaults hold); ``draft`` is the drafter's folder, ``opened_draft`` the
            drafter verify opened (:class:`~dsparkhub.layouts.reading.OpenedDraft`, or the folder when none was).
    """

    name: str
    label: str
    server: bool
    batching: str | None
    final_layer_state: str
    final_layer_source: str
    methods: tuple[str, ...]
    module: str
    cls: str
    arguments: dict[str, str] = field(default_factory=dict)
    settings: frozenset[str] = frozenset()
    gpu_methods: tuple[str, ...] = ()
    other_batching: tuple[str, ...] = ()
    mtp_baseline: bool = False

    def load(self) -> type:
        """Import the engine's module and return its backend class.

        Raises:
            ImportError: the module (or a library it needs, e.g. torch) cannot be imported, or has no ``cls``.
        """
        module = importlib.import_module(self.module)
        try:
            return getattr(module, self.cls)
        except AttributeError:
            raise ImportError(f"{self.module} has no {self.cls}") from None


@dataclass(frozen=True)
class Method:
    """One speculative method, as vLLM 0.32 keeps them in one ``SpeculativeMethod`` literal.

    Attributes:
        name: vLLM's ``speculative_config["method"]`` (``config/speculative.py``) and the results file's ``method``.
        label: the card's name for it.
        variants: the :class:`~dsparkhub.layouts.spec.DraftSpec` variants served by it (vLLM loads DFlash-2
            drafters, ``DFlash2DraftModel``, with method ``dflash``).
        sglang_algorithm: SGLang 0.5.23's ``--speculative-algorithm`` for it (None: no SGLang command is given).
    """

    name: str
    label: str
    variants: tuple[str, ...]
    sglang_algorithm: str | None = None


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dspark", "DSpark", ("dspark",), "DSPARK"),
    Method("dflash", "DFlash", ("dflash", "dflash2"), "DFLASH"),
    Method("eagle3", "EAGLE-3", ("eagle3",)),
)}

_SERVER_SETTINGS = frozenset({"server_url", "baseline_url", "tensor_parallel_size", "max_model_len",
                              "compilation_config"})

ENGINES: dict[str, Engine] = {e.name: e for e in (
    # HF output_hidden_states: its last entry is the final norm's output (DeepSpec eval/base_evaluator.py:100-112)
    Engine("reference", "dsparkhub reference engine", server=False, batching="batched",
           final_layer_state="normed", final_layer_source="HF output_hidden_states",
           methods=("dspark", "dflash", "eagle3"),
           module="dsparkhub.verify.reference.engine", cls="ReferenceEngine",
           arguments={"target": "target", "opened_draft": "drafter", "device": "device",
                      "confidence_threshold": "confidence_threshold"},
           settings=frozenset({"device", "confidence_threshold"})),
    # vLLM 0.32 model_executor/models/qwen2.py:430-445 _maybe_add_hidden_state, before self.norm (Qwen3 inherits it)
    # --concurrency: a closed loop over LLM.llm_engine (add_request / step); --load-driver bench-serve: vllm serve
    Engine("vllm", "vLLM offline engine", server=False, batching="engine-loop", final_layer_state="raw",
           final_layer_source="vLLM aux hidden states", methods=tuple(METHODS),
           module="dsparkhub.verify.vllm.offline", cls="VllmBackend",
           arguments={"target": "target", "draft": "drafter", "method": "method",
                      "tensor_parallel_size": "tensor_parallel_size", "max_model_len": "max_model_len",
                      "compilation_config": "compilation_config", "speculative_config": "speculative_extra",
                      "engine_args": "extra_engine_args", "env": "env", "max_concurrency": "max_concurrency"},
           settings=frozenset({"tensor_parallel_size", "max_model_len", "compilation_config", "speculative_config"}),
           # vLLM 0.32 runs DSpark in its V2 GPU model runner only (config/vllm.py)
           gpu_methods=("dspark",), other_batching=("bench-serve",), mtp_baseline=True),
    Engine("vllm-serve", "vLLM server", server=True, batching="bench-serve", final_layer_state="raw",
           final_layer_source="vLLM aux hidden states", methods=tuple(METHODS),
           module="dsparkhub.verify.vllm.server", cls="VllmServerBackend",
           arguments={"server_url": "base_url", "baseline_url": "baseline_url"}, settings=_SERVER_SETTINGS),
    # SGLang 0.5.23 srt/models/qwen2.py:455-465 captures layer id + 1's input, i.e. layer id's output before the norm
    Engine("sglang-serve", "SGLang server", server=True, batching=None, final_layer_state="raw",
           final_layer_source="SGLang aux hidden states", methods=tuple(METHODS),
           module="dsparkhub.verify.sglang.backend", cls="SglangServerBackend",
           arguments={"server_url": "base_url", "baseline_url": "baseline_url"}, settings=_SERVER_SETTINGS),
)}


def engine_names() -> tuple[str, ...]:
    """The names of :data:`ENGINES`, in table order (read at call time, so a registered engine is included)."""
    return tuple(ENGINES)


def server_engine_names() -> tuple[str, ...]:
    """The names of the engines that measure running servers."""
    return tuple(e.name for e in ENGINES.values() if e.server)


def method_names() -> tuple[str, ...]:
    """The names of :data:`METHODS`: ``("dspark", "dflash", "eagle3")``."""
    return tuple(METHODS)


def sglang_algorithms() -> tuple[str, ...]:
    """SGLang's ``--speculative-algorithm`` values of the methods that have one: ``("DSPARK", "DFLASH")``."""
    return tuple(m.sglang_algorithm for m in METHODS.values() if m.sglang_algorithm)


def method_for_variant(variant: str) -> str | None:
    """The method that serves a :class:`~dsparkhub.layouts.spec.DraftSpec` ``variant`` (None: none does)."""
    return next((m.name for m in METHODS.values() if variant in m.variants), None)
