"""Regenerate tests/conformance/fixtures/minimax-m3-dspark/ (a MiniMax-M3 DSpark drafter) and minimax-m3-target/ (a
tiny MiniMax-M3 target skeleton) with vLLM 0.34.0's own classes (.venv-vllm034):

    PYTHONPATH=. .venv-vllm034/bin/python tests/conformance/generators/make_minimax_m3_dspark_fixture.py

What runs is vLLM 0.34's code and transformers 5.22's config classes:

1. the target: ``transformers.MiniMaxM3VLConfig`` (model_type ``minimax_m3_vl``, one of vLLM's
   ``_MINIMAX_M3_MODEL_TYPES``, config/speculative.py:133) with a toy ``MiniMaxM3VLTextConfig`` (hidden 32, 4 layers,
   vocab 128) as ``config.json``, architecture ``MiniMaxM3SparseForConditionalGeneration`` (registry.py:537), and a
   ``model.safetensors`` holding only the embedding and LM head (``language_model.model.embed_tokens.weight``,
   ``language_model.lm_head.weight``): what dsparkhub reads of a target (headers, embedding / head bytes);
2. the drafter config: ``MiniMaxM3VLTextConfig`` at toy size plus the DSpark keys vLLM 0.34 reads (``dspark_*``,
   ``enable_confidence_head``, ``confidence_head_with_markov``), architecture ``DSparkMiniMaxDraftModel``;
3. the drafter: vLLM's ``SpeculativeConfig(model=DRAFT, method="dspark")`` resolves it (config/speculative.py:1234-1250
   rewrites it to ``minimax_m3_dspark``), the registry's class (``MiniMaxM3DSparkForCausalLM``,
   models/minimax_m3/common/dspark.py) is built inside ``set_current_vllm_config`` with a one-process gloo group,
   its parameters drawn N(0, 0.02) in BF16 (the confidence head F32, as the class makes it) (norms around 0: Gemma RMSNorm is ``x * (1 + w)``), and its state dict
   written under the checkpoint names ``_rename_checkpoint_weights`` (dspark.py:416-427) maps back:
   ``language_model.model.dspark.`` + ``layers.{i}.decoder_layer.*`` / ``final_norm.*``, the stacked ``qkv_proj`` /
   ``gate_up_proj`` split into the q / k / v and gate / up parts its ``hf_to_vllm_mapper`` stacks
   (qwen3_dflash.py:436-442);
4. the check: a fresh instance of the class loads the written file with its own ``load_weights`` and every parameter
   is compared bit-exact with the one saved (the script fails otherwise).

Stand-ins, nothing else: vllm-check's own (verify/vllm/stand_in.py, the 0.34 contract's ``cpu_stand_in``):
``VLLM_TARGET_DEVICE=cpu`` and ``vllm.triton_utils.HAS_TRITON`` treated as true (vLLM 0.34 refuses an x86 CPU without
triton-cpu at config time, platforms/cpu.py:239-243), and ``vllm.transformers_utils.processors.minimax_m3`` (it imports
torchvision, which the venv leaves out) replaced by placeholders of the five names ``vllm/models/minimax_m3/__init__.py``
reaches through common/mm_preprocess.py:41-47 on the way to the class. The engine config is 0.34's own
(``EngineArgs(...).create_engine_config()``) for the MiniMax-M3 target skeleton of step 1.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "conformance" / "fixtures"
DRAFT, TARGET = FIXTURES / "minimax-m3-dspark", FIXTURES / "minimax-m3-target"
PREFIX = "language_model.model.dspark."

TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, max_position_embeddings=1024, num_local_experts=2, num_experts_per_tok=1,
            dense_intermediate_size=64, shared_intermediate_size=16, index_n_heads=1, index_head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            bos_token_id=1, eos_token_id=2)
DSPARK = {"dspark_block_size": 4, "dspark_noise_token_id": 127, "dspark_target_layer_ids": [0, 2],
          "dspark_markov_rank": 4, "dspark_ffn_hidden_size": 48, "dspark_use_dense_ffn": True,
          "enable_confidence_head": True, "confidence_head_with_markov": True, "num_target_layers": 4}


def write_target(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import MiniMaxM3VLConfig

    folder.mkdir(parents=True, exist_ok=True)
    cfg = MiniMaxM3VLConfig(text_config={**TEXT, "num_hidden_layers": 4},
                            vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                           "num_attention_heads": 1}, projector_hidden_size=32).to_dict()
    cfg["architectures"] = ["MiniMaxM3SparseForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    g = torch.Generator().manual_seed(0)
    save_file({n: (torch.randn(128, 32, generator=g) * 0.02).to(torch.bfloat16)
               for n in ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight")},
              str(folder / "model.safetensors"))


def write_draft_config(folder: Path) -> None:
    from transformers import MiniMaxM3VLTextConfig

    folder.mkdir(parents=True, exist_ok=True)
    cfg = MiniMaxM3VLTextConfig(**TEXT, num_hidden_layers=2).to_dict()
    cfg.update(DSPARK, architectures=["DSparkMiniMaxDraftModel"], torch_dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build(draft: Path, target: Path):
    """vLLM 0.34's drafter class for ``draft``, built on CPU (the VllmConfig it was built under is returned too)."""
    from vllm.config import SpeculativeConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (ensure_model_parallel_initialized, init_distributed_environment,
                                                 model_parallel_is_initialized)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.utils.torch_utils import set_default_torch_dtype

    vc = EngineArgs(model=str(target), skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
                    dtype="bfloat16").create_engine_config()
    spec = SpeculativeConfig(model=str(draft), method="dspark", target_model_config=vc.model_config,
                             target_parallel_config=vc.parallel_config)
    object.__setattr__(vc, "speculative_config", spec)
    hf = spec.draft_model_config.hf_config
    cls, _ = ModelRegistry.resolve_model_cls(list(hf.architectures), model_config=spec.draft_model_config)
    with set_current_vllm_config(vc), set_default_torch_dtype(vc.model_config.dtype):  # as vLLM's model loader
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
            ensure_model_parallel_initialized(1, 1)
        return cls(vllm_config=vc), vc


def checkpoint_names(state: dict, split: dict) -> dict:
    """vLLM parameter names -> the checkpoint names its loader maps back (see the module docstring, step 3)."""
    out = {}
    for name, t in state.items():
        if name == "model.mask_embedding" or name.startswith(("model.embed_tokens.", "lm_head.")):
            continue  # an unused placeholder, and the two tensors shared from the target
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            i, rest = name[len("layers."):].split(".", 1)
            name = f"layers.{i}.decoder_layer.{rest}"
        elif name.startswith("norm."):
            name = "final_" + name
        for stacked, parts in split.items():
            if f".{stacked}." in name:
                rows = t.shape[0] // sum(n for _, n in parts)
                offset = 0
                for part, n in parts:
                    size = n * rows
                    out[PREFIX + name.replace(f".{stacked}.", f".{part}.")] = t[offset:offset + size].clone()
                    offset += size
                break
        else:
            out[PREFIX + name] = t.clone()
    return out


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from dsparkhub.verify.vllm.contract import contract_for
    from dsparkhub.verify.vllm.stand_in import CpuStandIn

    stand_in = CpuStandIn(contract_for(version("vllm")))  # before vLLM loads: its env and import stubs
    write_target(TARGET)
    write_draft_config(DRAFT)
    with stand_in:
        model, vc = build(DRAFT, TARGET)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
    hf = vc.speculative_config.draft_model_config.hf_config
    nh, nkv = hf.num_attention_heads, hf.num_key_value_heads
    # q / k / v rows in head_dim units, gate / up rows in halves (MergedColumnParallelLinear [I, I])
    split = {"qkv_proj": [("q_proj", nh), ("k_proj", nkv), ("v_proj", nkv)],
             "gate_up_proj": [("gate_proj", 1), ("up_proj", 1)]}
    state = dict(model.named_parameters())
    tensors = checkpoint_names({n: p.detach() for n, p in state.items()}, split)
    save_file(tensors, str(DRAFT / "model.safetensors"), metadata={"format": "pt"})
    print(json.dumps({n: list(t.shape) for n, t in sorted(tensors.items())}, indent=1))

    with stand_in:
        fresh, vc2 = build(DRAFT, TARGET)
    from vllm.config import set_current_vllm_config
    with set_current_vllm_config(vc2):
        fresh.load_weights(iter(load_file(str(DRAFT / "model.safetensors")).items()))
    after = dict(fresh.named_parameters())
    bad = [n for n, p in state.items() if not n.startswith(("model.embed_tokens.", "lm_head.", "model.mask"))
           and not torch.equal(after[n].detach(), p.detach())]
    if bad:
        raise SystemExit(f"{type(fresh).__name__}.load_weights did not restore {bad}")
    manifest = json.loads((FIXTURES / "MANIFEST.json").read_text())
    manifest["minimax-m3-dspark"] = {
        "producer": f"vllm {version('vllm')} {type(model).__module__}.{type(model).__name__}",
        "how": "tests/conformance/generators/make_minimax_m3_dspark_fixture.py", "transformers": version("transformers"),
        "torch": version("torch")}
    manifest["minimax-m3-target"] = {
        "producer": f"transformers {version('transformers')} MiniMaxM3VLConfig (config only; embedding + LM head)",
        "how": "tests/conformance/generators/make_minimax_m3_dspark_fixture.py", "transformers": version("transformers"),
        "torch": version("torch")}
    (FIXTURES / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{type(fresh).__name__}: {len(state)} parameters, {len(tensors)} checkpoint tensors, round trip bit-exact")


if __name__ == "__main__":
    main()
