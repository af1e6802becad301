"""EAGLE-3 in the reference engine: the forward equals speculators 0.9.0's own ``Eagle3DraftModel.forward`` on the
conformance fixture (every training-time-test step, and chain drafting from the last slot), and decoding with it is
lossless batched and unbatched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsparkhub.errors import LayoutError
from dsparkhub.testing.factories import make_qwen3_target
from dsparkhub.verify.reference.eagle3 import Eagle3Drafter
from dsparkhub.verify.reference.engine import ReferenceEngine
from dsparkhub.verify.reference.loading import load_drafter

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "conformance" / "fixtures" / "speculators-eagle3"
UPSTREAM_PY = REPO / ".venv-upstream" / "bin" / "python"


@pytest.fixture(scope="module")
def toy_target(tmp_path_factory) -> Path:
    """The toy Qwen3 verifier the conformance fixtures were made against (hidden 32, 4 layers, vocab 128)."""
    return make_qwen3_target(tmp_path_factory.mktemp("target") / "toy-qwen3-target")


def test_forward_matches_speculators(tmp_path):
    if not UPSTREAM_PY.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{UPSTREAM_PY} is missing (scripts/setup_upstream.sh)")
        pytest.skip(f"{UPSTREAM_PY} is missing: build it with `bash scripts/setup_upstream.sh`")
    g = torch.Generator().manual_seed(0)
    t, steps = 10, 3
    inputs = {"hidden_states": torch.randn(1, t, 96, generator=g), "input_ids": torch.randint(0, 128, (1, t), generator=g),
              "position_ids": (1 + torch.arange(t)).unsqueeze(0), "ttt_steps": torch.tensor([steps])}
    save_file(inputs, str(tmp_path / "in.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(UPSTREAM_PY), str(REPO / "tests" / "conformance" / "upstream_eagle3_forward.py"),
                           str(FIXTURE), str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = load_file(str(tmp_path / "out.safetensors"))
    drafter = load_drafter(FIXTURE)
    assert isinstance(drafter, Eagle3Drafter) and drafter.options.norm_before_fc and drafter.options.norm_output
    with torch.no_grad():
        ours = drafter.ttt_forward(inputs["input_ids"], inputs["hidden_states"], inputs["position_ids"], steps)
        chain: list[torch.Tensor] = []

        def choose(step, logits):  # speculators pads the teacher-forced ids past the end with 0
            chain.append(logits[0])
            return torch.zeros(1, dtype=torch.int64)

        ctx = drafter.context_kv(inputs["hidden_states"], inputs["position_ids"], next_tokens=inputs["input_ids"])
        drafter.draft_steps(inputs["input_ids"][:, -1], inputs["position_ids"][:, -1] + 1, ctx, None, steps, choose)
    for step in range(steps):
        torch.testing.assert_close(ours[step], theirs[f"step_{step}"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chain[step], theirs[f"step_{step}"][0, -1], atol=1e-5, rtol=1e-5)


def test_lossless_batched(toy_target):
    engine = ReferenceEngine(toy_target, FIXTURE, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 9, 7, 12)]
    base = engine.run(prompts, num_speculative_tokens=None, max_new_tokens=16)
    for c in (1, 3):
        run = engine.run(prompts, num_speculative_tokens=3, max_new_tokens=16, concurrency=c)
        assert run.outputs == base.outputs and run.num_draft_tokens == 3 * run.num_drafts
    # sampling: rejection sampling accepts drafts; each prompt has its own generator, so batched == unbatched
    one = engine.run(prompts, num_speculative_tokens=3, max_new_tokens=16, temperature=0.8, seed=3)
    three = engine.run(prompts, num_speculative_tokens=3, max_new_tokens=16, temperature=0.8, seed=3, concurrency=3)
    assert one.num_accepted_tokens > 0 and one.outputs == three.outputs
    assert one.num_accepted_tokens == three.num_accepted_tokens


def test_multi_layer_refused(fixture_copy_eagle3):
    with pytest.raises(LayoutError, match="2 decoder layers"):
        load_drafter(fixture_copy_eagle3)


@pytest.fixture
def fixture_copy_eagle3(tmp_path) -> Path:
    import json
    import shutil

    dest = tmp_path / "eagle3"
    shutil.copytree(FIXTURE, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["transformer_layer_config"]["num_hidden_layers"] = 2
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest
