"""Tensor x pipeline parallel layouts for ``verify --backend vllm|vllm-serve|sglang-serve --tp T --pp P``, checked
before anything loads: that T x P ranks fit the devices the Ray cluster (``ray.cluster_resources``) or this node
has, that the target's layers split over P stages by vLLM's own rule, and that the drafter can run under that
layout on the installed engine version. Each refusal is an :class:`LayoutRefusedError` naming the rule and its
upstream source (vLLM facts: the ``parallel`` fact of :mod:`dsparkhub.verify.vllm.contract`; SGLang 0.5.23's
``srt/arg_groups/speculative_hook.py``).

The multi-node commands for a manifest's published serving layout are :mod:`dsparkhub.card.multinode`'s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from dsparkhub.errors import EngineUnavailableError

__all__ = ["LayoutRefusedError", "ParallelLayout", "Resources", "check_layout", "layout_of", "pp_partition",
           "probe_resources", "target_geometry"]

EXECUTORS = ("ray", "mp")
# SGLang 0.5.23 refuses speculative decoding with PP > 1 in its server-argument hooks.
_SGLANG_PP = {
    "dspark": "srt/arg_groups/speculative_hook.py:713-718 (\"DSpark pipeline parallelism requires PD prefill; "
              "decode and non-disaggregated serving require pp_size == 1.\")",
    "dflash": "srt/arg_groups/speculative_hook.py:319-322 (\"Currently DFLASH speculative decoding only supports "
              "pp_size == 1.\")",
}


class LayoutRefusedError(EngineUnavailableError):
    """A tensor x pipeline parallel layout that cannot run: too few devices, layers that do not split, or a drafter
    the engine version cannot run under it. Raised before anything loads."""


@dataclass(frozen=True)
class ParallelLayout:
    """How the target is split: ``tensor_parallel_size`` ranks per stage, ``pipeline_parallel_size`` stages.

    Attributes:
        tensor_parallel_size / pipeline_parallel_size: vLLM's ``--tensor-parallel-size`` / ``--pipeline-parallel-size``.
        executor: vLLM ``distributed_executor_backend`` (``ray`` | ``mp``; None: vLLM's choice, ``mp`` on one node).
        ray_address: the Ray cluster (``ray start --head``'s ``HOST:PORT``); None: ``RAY_ADDRESS`` or ``auto``.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    executor: str | None = None
    ray_address: str | None = None

    @property
    def world_size(self) -> int:
        """Ranks (one device each): T x P."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def engine_args(self) -> dict:
        """The ``LLM(...)`` keywords beyond ``tensor_parallel_size`` (only those that differ from vLLM's defaults)."""
        args: dict = {}
        if self.pipeline_parallel_size != 1:
            args["pipeline_parallel_size"] = self.pipeline_parallel_size
        if self.executor is not None:
            args["distributed_executor_backend"] = self.executor
        return args

    def env(self) -> dict[str, str]:
        """Environment for the engine's process: ``RAY_ADDRESS`` (vLLM's ``ray.init`` reads it) when given."""
        return {"RAY_ADDRESS": self.ray_address} if self.ray_address else {}

    def words(self) -> str:
        return f"TP {self.tensor_parallel_size} x PP {self.pipeline_parallel_size}"


@dataclass(frozen=True)
class Resources:
    """What a Ray cluster or this node offers.

    Attributes:
        where: ``"Ray cluster at ADDR (N nodes)"`` or ``"this node"``.
        gpus / cpus: totals (Ray: ``cluster_resources()["GPU"/"CPU"]``; node: CUDA devices, usable CPU cores).
        available_gpus / available_cpus: not in use now (Ray: ``available_resources()``); None for a node.
        gpus_per_node: GPUs of each Ray node (a TP group is packed on one node); [gpus] for this node.
    """

    where: str
    gpus: int
    cpus: int
    available_gpus: int | None = None
    available_cpus: int | None = None
    gpus_per_node: tuple[int, ...] = ()

    def words(self) -> str:
        free = "" if self.available_gpus is None else \
            f" ({self.available_gpus} GPU(s), {self.available_cpus} CPU(s) available now)"
        return f"{self.where}: {self.gpus} GPU(s), {self.cpus} CPU(s){free}"


def layout_of(settings) -> ParallelLayout:
    """The layout of a :class:`~dsparkhub.verify.settings.VerifySettings` (``--ray-address`` alone implies the Ray
    executor)."""
    executor = settings.distributed_executor_backend or ("ray" if settings.ray_address else None)
    return ParallelLayout(settings.tensor_parallel_size, settings.pipeline_parallel_size, executor,
                          settings.ray_address)


def probe_resources(layout: ParallelLayout) -> Resources:
    """The devices the layout can use, read before any model loads.

    With ``executor == "ray"``, Ray's own ``cluster_resources()`` / ``available_resources()`` / ``nodes()`` of the
    cluster at ``ray_address`` (else ``RAY_ADDRESS``, else ``auto``), connected to and left again (``ray.shutdown``);
    otherwise this node: ``torch.cuda.device_count()`` GPUs and the CPU cores this process may use.

    Raises:
        LayoutRefusedError: ``ray`` is not installed or no Ray cluster answers at the address.
    """
    if layout.executor != "ray":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return Resources("this node", gpus, len(os.sched_getaffinity(0)), gpus_per_node=(gpus,))
    address = layout.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        import ray
    except ImportError as exc:
        raise LayoutRefusedError(f"--distributed-executor-backend ray needs the `ray` package ({exc})",
                                 hint="pip install 'dsparkhub[ray]' (ray 2.60), or use --distributed-executor-backend "
                                      "mp on one node") from None
    was_connected = ray.is_initialized()
    try:
        if not was_connected:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        total, free = ray.cluster_resources(), ray.available_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise LayoutRefusedError(
            f"no Ray cluster answered at {address}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            hint="start one (`ray start --head` on the first node, `ray start --address HEAD:6379` on the others) "
                 "and pass --ray-address HEAD:6379") from None
    finally:
        if not was_connected and ray.is_initialized():
            ray.shutdown()
    per_node = tuple(int(n.get("Resources", {}).get("GPU", 0)) for n in nodes)
    return Resources(f"Ray cluster at {address} ({len(nodes)} node(s))", int(total.get("GPU", 0)),
                     int(total.get("CPU", 0)), int(free.get("GPU", 0)), int(free.get("CPU", 0)), per_node)


def pp_partition(num_layers: int, pp: int, env: Mapping[str, str] | None = None) -> list[int]:
    """Layers per pipeline stage, by vLLM's rule (``vllm/distributed/utils.py`` ``get_pp_indices``, 0.32:126-170).

    ``VLLM_PP_LAYER_PARTITION`` (comma-separated counts) when set: P counts summing to L. Otherwise L // P layers
    per stage and the remainder, one each, to the stages before the last (the last holds the norm and LM head).

    Raises:
        LayoutRefusedError: fewer layers than stages, or a ``VLLM_PP_LAYER_PARTITION`` of the wrong length or sum,
            or with a stage of no layers.
    """
    env = os.environ if env is None else env
    source = "vLLM get_pp_indices (vllm/distributed/utils.py:126-170 in 0.32, :211 in 0.34)"
    given = env.get("VLLM_PP_LAYER_PARTITION")
    if given:
        try:
            parts = [int(p) for p in given.split(",")]
        except ValueError:
            raise LayoutRefusedError(f"VLLM_PP_LAYER_PARTITION={given!r} is not comma-separated layer counts "
                                     f"({source})") from None
        if len(parts) != pp or sum(parts) != num_layers or min(parts) < 1:
            raise LayoutRefusedError(
                f"VLLM_PP_LAYER_PARTITION={given!r} does not split the target's {num_layers} layers over PP {pp}: "
                f"it needs {pp} positive counts summing to {num_layers} ({source})")
        return parts
    if num_layers < pp:
        raise LayoutRefusedError(f"the target's {num_layers} layers do not split over PP {pp}: every stage needs at "
                                 f"least one layer ({source})", hint=f"use --pp {num_layers} or fewer")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def target_geometry(target: str) -> tuple[int, str | None, dict] | None:
    """``(num_hidden_layers, model_type, manifest serving)`` of a target folder's config.json (``text_config`` first)
    or a target manifest; None for a served name or Hub id (nothing local to read)."""
    folder = Path(target)
    if (folder / "config.json").is_file():
        from dsparkhub.target import text_config

        cfg = text_config(json.loads((folder / "config.json").read_text()))
        if isinstance(cfg.get("num_hidden_layers"), int):
            return cfg["num_hidden_layers"], cfg.get("model_type"), {}
        return None
    from dsparkhub.layouts.manifests import load_manifests

    targets, _ = load_manifests()  # by name (kimi-k3, manifest:kimi-k3) or by repo id (moonshotai/Kimi-K3)
    m = targets.get(target.removeprefix("manifest:")) or next(
        (t for t in targets.values() if t.repo_id == target), None)
    if m is not None:
        return m.num_hidden_layers, m.text_model_type or m.model_type, dict(m.serving)
    return None


def _sglang_refusal(layout: ParallelLayout, method: str | None) -> LayoutRefusedError:
    rule = _SGLANG_PP.get(method or "", _SGLANG_PP["dspark"])
    return LayoutRefusedError(
        f"--backend sglang-serve with --pp {layout.pipeline_parallel_size}: SGLang 0.5.23 serves "
        f"{method or 'a'} drafter only at pp_size == 1 ({rule}; DSpark PP > 1 only for the prefill side of "
        "PD-disaggregated serving, and SGLang's pipeline-parallel speculative decoding is only in open PRs). "
        "What to do: serve the target with SGLang at --tp-size T --pp-size 1 (add nodes with --nnodes / "
        "--node-rank for more GPUs), or measure a TP x PP layout with --backend vllm / vllm-serve.")


def _device_refusal(layout: ParallelLayout, device: str, found: Resources, serving: dict) -> LayoutRefusedError:
    published = ""
    if serving.get("pipeline_parallel_size") or serving.get("tensor_parallel_size"):
        published = (f" The target's manifest serves it at TP {serving.get('tensor_parallel_size', 1)} x PP "
                     f"{serving.get('pipeline_parallel_size', 1)} on {serving.get('nodes', 1)} node(s); "
                     "README \"Targets beyond one node\" has the Ray commands.")
    how = ("a Ray cluster with that many GPUs (--distributed-executor-backend ray --ray-address HEAD:6379)"
           if device == "GPU" else "fewer ranks")
    return LayoutRefusedError(
        f"{layout.words()} needs {layout.world_size} {device}(s), one per rank (vLLM places one rank per "
        f"{device} bundle: vllm/v1/executor/ray_utils.py initialize_ray_cluster; mp starts one worker per device "
        f"on one node); found {found.words()}.{published}",
        hint=f"run where {layout.world_size} {device}s are, e.g. {how}")


def check_layout(layout: ParallelLayout, *, backend: str, target: str, method: str | None,
                 speculative_config: Mapping | None = None, gpu: bool | None = None,
                 resources: Callable[[ParallelLayout], Resources] = probe_resources) -> list[str]:
    """Check a layout before anything loads; return notes (where the drafter runs, warnings).

    Args:
        layout: the requested layout.
        backend: ``vllm`` (offline, checked against the node or Ray cluster), ``vllm-serve`` (a running server:
            the cluster is checked only with a ``ray_address``), ``sglang-serve`` (PP refused).
        target: target folder or manifest name (layers read from it); a served name / Hub id skips the layer check.
        method: ``dspark`` | ``dflash`` | ``eagle3`` (None: target only).
        speculative_config: extra speculative_config keys (``enable_adaptive_verification`` refuses PP > 1).
        gpu: whether the engine runs on GPUs; None reads the resources (and a DSpark drafter, which vLLM runs in
            its GPU model runner only, or a manifest target, which has no weights to run on CPU, needs GPUs).
        resources: the probe (:func:`probe_resources`; tests pass their own).

    Raises:
        LayoutRefusedError: too few devices (what it needs, what it found); layers that do not split over P;
            Ray with vLLM's CPU platform; a drafter under PP where the vLLM version cannot run one (V1 model runner,
            adaptive verification); SGLang with PP > 1. Each names the rule and its upstream source.
    """
    pp, notes = layout.pipeline_parallel_size, []
    if layout.world_size == 1 and layout.executor is None:
        return notes
    if backend not in ("vllm", "vllm-serve", "sglang-serve"):
        from dsparkhub.verify.settings import EngineOptionError

        raise EngineOptionError(f"the {backend} engine runs on one device; {layout.words()} / "
                                "--distributed-executor-backend need --backend vllm (or vllm-serve)")
    if backend == "sglang-serve":
        if pp > 1 and method is not None:
            raise _sglang_refusal(layout, method)
        return notes
    geometry = target_geometry(str(target))
    serving = geometry[2] if geometry else {}
    if geometry and pp > 1:
        parts = pp_partition(geometry[0], pp)
        notes.append(f"layers per pipeline stage {parts} (vLLM get_pp_indices, VLLM_PP_LAYER_PARTITION to change)")
    from dsparkhub.verify.vllm.contract import installed_contract

    contract = installed_contract()
    facts = contract.value("parallel")

    def source(*rules: str) -> str:
        return f"vLLM {contract.line} " + "; ".join(facts["sources"][r] for r in rules)
    if backend == "vllm" or layout.ray_address:
        found = resources(layout)
        if gpu is None:
            gpu = found.gpus > 0 or method == "dspark" or bool(geometry and serving)
        device = "GPU" if gpu else "CPU"
        have = found.gpus if gpu else found.cpus
        if have < layout.world_size:
            raise _device_refusal(layout, device, found, serving)
        if layout.executor == "ray" and not gpu and facts["ray_device_key"].get("cpu") is None:
            raise LayoutRefusedError(
                f"--distributed-executor-backend ray on CPU: vLLM {contract.version}'s CPU platform has no Ray device "
                f"key, so its Ray executor refuses to start (\"current platform cpu does not support ray.\"; "
                f"{source('ray_device_key')}); found {found.words()}",
                hint="use --distributed-executor-backend mp on one CPU node, or Ray on GPU nodes")
        if layout.executor == "ray" and gpu and found.gpus_per_node and \
                max(found.gpus_per_node) < layout.tensor_parallel_size:
            notes.append(f"warning: no Ray node has {layout.tensor_parallel_size} GPUs (per node: "
                         f"{list(found.gpus_per_node)}); each TP group then spans nodes (slow all-reduce)")
    if pp > 1 and gpu is False and contract.value("runner_attribute") is not None and \
            not (facts["v1_runner_spec_pp"] and facts["v1_runner_cpu_pp"]):
        drafter = "" if method is None else (
            f"; the {method} drafter cannot run either: the V1 runner builds it on the last PP rank only and reads "
            "it on every rank (\"'CPUModelRunner' object has no attribute 'drafter'\" on the ranks before the last)")
        raise LayoutRefusedError(
            f"{layout.words()} on CPU: vLLM {contract.version} runs CPU in its V1 model runner, where PP > 1 fails "
            f"already for the target alone (the scheduler loses the request: KeyError in update_from_output)"
            f"{drafter} ({source('v1_runner_cpu_pp', *(['v1_runner_spec_pp'] if method else []))})",
            hint="measure PP > 1 on GPU nodes (the V2 model runner), or --pp 1 on CPU (--tp 2 with "
                 "--distributed-executor-backend mp runs)")
    if pp > 1 and method is not None:
        if (speculative_config or {}).get("enable_adaptive_verification") and not facts["adaptive_verification_pp"]:
            raise LayoutRefusedError(f"adaptive verification with PP {pp}: vLLM {contract.version} refuses it "
                                     f"(\"Adaptive verification is not currently compatible with pipeline "
                                     f"parallelism\"; {source('adaptive_verification_pp')})",
                                     hint="--adaptive-verification off, or --pp 1")
        notes.append(f"the {method} drafter runs whole on the {facts['draft_stage']} pipeline stage, itself at "
                     f"PP 1 ({source('draft_stage')})")
        model_type = geometry[1] if geometry else None
        if model_type and model_type not in facts["aux_relay_model_types"]:
            notes.append(f"warning: vLLM {contract.line} relays the drafter's target hidden states across PP stages "
                         f"only for targets whose decoder supports it ({', '.join(facts['aux_relay_model_types'])} "
                         f"read in its sources); {model_type} is not among them, so the engine may refuse at load "
                         f"(\"does not support ... with pipeline parallelism\"; {source('aux_relay_model_types')})")
    return notes
