"""The multi-node serving commands of a target whose manifest's ``serving`` spans nodes (``pipeline_parallel_size``
and ``nodes``): Ray head and workers, ``vllm serve`` with TP x PP on the Ray executor, and the ``dsparkhub verify``
that measures the served drafter. Generated from the manifest (README "Targets beyond one node", ``dsparkhub
manifests show``, and the card of a drafter for such a target), never typed by hand.

The Ray steps are Ray's own (``ray start --head`` / ``ray start --address``); vLLM's Ray executor connects to the
running cluster (``vllm/v1/executor/ray_utils.py`` ``initialize_ray_cluster``: ``ray.init(address=...)``) and packs
one rank per GPU bundle.
"""

from __future__ import annotations

import json
import shlex

from dsparkhub.layouts.manifests import TargetManifest, load_manifests

__all__ = ["manifest_for_target", "multinode_commands", "serving_layout"]

RAY_PORT = 6379
HEAD = "HEAD_IP"  # the head node's address, to be filled in by the user


def serving_layout(manifest: TargetManifest) -> dict | None:
    """``{tensor_parallel_size, pipeline_parallel_size, nodes, gpus_per_node}`` of a manifest whose published
    serving layout spans nodes; None for a target served on one node."""
    s = manifest.serving or {}
    nodes = int(s.get("nodes") or 1)
    if nodes < 2:
        return None
    tp, pp = int(s.get("tensor_parallel_size") or 1), int(s.get("pipeline_parallel_size") or 1)
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "nodes": nodes,
            "gpus_per_node": -(-tp * pp // nodes)}


def manifest_for_target(target: str) -> TargetManifest | None:
    """The target manifest named ``target`` or whose ``repo_id`` it is (None when none is)."""
    targets, _ = load_manifests()
    return targets.get(target.removeprefix("manifest:")) or next(
        (m for m in targets.values() if m.repo_id == target), None)


def _drafter_repo(manifest: TargetManifest, method: str) -> str | None:
    _, releases = load_manifests()
    return next((r.repo_id for r in releases.values()
                 if r.target == manifest.name and r.variant == method and r.repo_id), None)


def multinode_commands(manifest: TargetManifest, *, model: str | None = None, n: int | None = None) -> str | None:
    """The shell commands that serve ``manifest``'s target with its drafter over its published multi-node layout,
    then measure it; None when the manifest's layout fits one node (:func:`serving_layout`).

    Args:
        manifest: the target manifest (``serving``: ``tensor_parallel_size``, ``pipeline_parallel_size``, ``nodes``,
            ``speculative_config``).
        model: the drafter's Hub id for ``speculative_config["model"]``; default the release manifest's for this
            target and method, else none (a drafter attached to the target, DeepSeek-V4).
        n: ``num_speculative_tokens``; default the manifest's ``speculative_config``.
    """
    layout = serving_layout(manifest)
    if layout is None:
        return None
    spec = dict(manifest.serving.get("speculative_config") or {})
    method = spec.get("method")
    model = model or (_drafter_repo(manifest, method) if method else None)
    if model:
        spec = {"model": model, **spec}
    if n is not None:
        spec["num_speculative_tokens"] = n
    tp, pp, nodes = layout["tensor_parallel_size"], layout["pipeline_parallel_size"], layout["nodes"]
    serve = [f"vllm serve {manifest.repo_id}", f"--tensor-parallel-size {tp}", f"--pipeline-parallel-size {pp}",
             "--distributed-executor-backend ray"]
    if manifest.serving.get("max_model_len"):
        serve.append(f"--max-model-len {manifest.serving['max_model_len']}")
    if manifest.serving.get("compilation_config"):
        serve.append(f"--compilation-config {shlex.quote(json.dumps(manifest.serving['compilation_config']))}")
    serve.append(f"--speculative-config {shlex.quote(json.dumps(spec))}")
    verify = [f"dsparkhub verify {model or 'DRAFTER'}", f"--target {manifest.repo_id}", "--backend vllm-serve",
              f"--server-url http://{HEAD}:8000", f"--tp {tp} --pp {pp}", f"--ray-address {HEAD}:{RAY_PORT}"]
    return "\n".join([
        f"# {manifest.title}: TP {tp} x PP {pp} = {tp * pp} GPUs on {nodes} nodes of {layout['gpus_per_node']} "
        "(same vLLM, model files and network on every node)",
        "# node 0 (head):",
        f"ray start --head --port {RAY_PORT}",
        "# node 1 (worker):" if nodes == 2 else f"# nodes 1..{nodes - 1} (workers):",
        f"ray start --address {HEAD}:{RAY_PORT}",
        "# on the head node, once `ray status` lists every GPU:",
        " \\\n  ".join(serve),
        "# measure it (checks the layout against the cluster first):",
        " \\\n  ".join(verify),
    ])
