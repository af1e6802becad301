"""vLLM 0.34.0's own checks on CPU, from `.venv-vllm034` (built by `bash scripts/setup_vllm034.sh`; ~5 GB, not
built by `scripts/setup.sh --test` too; these tests skip with a reason where it is missing, and FAIL in CI, where it
must be).

`dsparkhub vllm-check` runs there with 0.34's own `SpeculativeConfig` resolution and `Qwen3DSparkForCausalLM`'s
`load_weights`, behind the contract's named stand-in for what 0.34 refuses on an x86 CPU (no triton-cpu); the
engine stage runs without it and is refused with 0.34's real reason. A reduced-vocab drafter without `lm_head`,
which 0.34's own loader lets through, must not pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm034, pytest.mark.slow]
from conftest import vllm034_check  # noqa: E402
ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-vllm034" / "bin" / "python"


def test_example_drafter_passes_034_config_and_load_weights(example, converted_example):
    code, report = vllm034_check(converted_example, example.target)
    stages = {s["name"]: s for s in report["stages"]}
    assert report["vllm_version"] == "0.34.0" and report["contract"]["contract_line"] == "0.34"
    assert code == 0 and report["ok"], json.dumps(report, indent=1)
    assert stages["config"]["details"]["architectures"] == ["Qwen3DSparkModel"]
    assert stages["load_weights"]["details"]["class"] == "Qwen3DSparkForCausalLM"
    assert stages["load_weights"]["details"]["missing"] == []
    assert stages["load_weights"]["details"]["compared_bit_exact"] > 0
    assert "vllm.triton_utils:HAS_TRITON" in report["stand_in"]
    # the engine stage runs without the stand-in: 0.34's real reason
    assert stages["engine"]["status"] == "refused"
    assert stages["engine"]["details"]["reason"] == "x86_cpu_triton", stages["engine"]


def test_reduced_vocab_without_lm_head_does_not_pass_on_034(example, converted_example, tmp_path):
    """0.34's load_weights no longer refuses it (qwen3_dspark.py:321-359) and 0.34 shares the target's head only
    when the vocabs match: dsparkhub's load stage fails it instead of calling lm_head borrowed."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "reduced-no-lm-head"
    shutil.copytree(converted_example, folder)
    config = json.loads((folder / "config.json").read_text())
    vocab = config["vocab_size"]
    vd = vocab // 4
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
        f.unlink()
    import torch

    tensors.pop("lm_head.weight", None)
    if "markov_head.markov_w2.weight" in tensors:
        tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][:vd].contiguous()
    tensors["d2t"] = torch.arange(vd, dtype=torch.int64)
    config["draft_vocab_size"] = vd
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    code, report = vllm034_check(folder, example.target)
    load = next(s for s in report["stages"] if s["name"] == "load_weights")
    assert code == 1 and not report["ok"] and load["status"] == "failed", json.dumps(report, indent=1)
    assert "lm_head.weight" not in load["details"]["borrowed_from_target"]
    assert any(m.startswith("lm_head.weight (not borrowed") and "no longer refuses" in m
               for m in load["details"]["missing"]), load["details"]["missing"]


def test_034_finds_the_dspark_subfolder_attach_writes_for_a_minimax_m3_target(example, tmp_path):
    """`convert --attach T --attach-as dspark-subfolder` output, looked up by vLLM 0.34's own DSpark default-model
    path (v1/worker/gpu/spec_decode/dspark/config.py `DSparkSpeculatorConfig.default_model`, which for a MiniMax-M3
    target calls config/speculative.py `_get_minimax_m3_dspark_draft`). The lookup reads only the target's
    `model_type` and folder, so the example target stands in for a MiniMax-M3 one through its model_type."""
    from dsparkhub.attach_subfolder import SUBFOLDER, attach_subfolder

    if not PYTHON.exists():
        pytest.skip(".venv-vllm034 is missing: build it with `bash scripts/setup_vllm034.sh`")
    out = tmp_path / "attached"
    attach_subfolder(example.deepspec_run, example.target, out)
    code = ("import json, sys\nfrom types import SimpleNamespace as N\n"
            "from vllm.v1.worker.gpu.spec_decode.dspark.config import DSparkSpeculatorConfig as C\n"
            "def find(model):\n"
            "    t = N(model=model, revision=None, hf_config=N(model_type='minimax_m3_text'))\n"
            "    try:\n        return C.default_model(N(target_model_config=t, draft_load_config=None))\n"
            "    except ValueError as exc:\n        return 'refused: ' + str(exc)\n"
            "print(json.dumps([find(sys.argv[1]), find(sys.argv[2])]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("VLLM_TARGET_DEVICE", None)
    proc = subprocess.run([str(PYTHON), "-c", code, str(out), str(example.target)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found, bare = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(found) == out / SUBFOLDER
    assert json.loads((Path(found) / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert bare.startswith("refused: MiniMax-M3 DSpark found no draft checkpoint in the 'dspark/' subfolder")
