"""Build vLLM 0.32's own drafter classes on CPU and load checkpoints into them; run as a subprocess (vLLM's
distributed state and current config are process-global) by tests/conformance/test_upstream_loaders.py.

    python tests/conformance/vllm_load.py TARGET '[DRAFT, ...]'

Prints one JSON list: per drafter ``{"path", "ok", "method", "arch", "error", "missing", "causal"}``. For each:
``SpeculativeConfig(model=DRAFT, method=M)`` against ``EngineArgs(model=TARGET)`` resolves the architecture (M from
the config: dspark / dflash / eagle3, as vLLM's own speculators reader maps ``speculators_model_type``), vLLM's
registry gives the class, which is built inside ``set_current_vllm_config`` with a one-process gloo group (as
dsparkhub/verify/vllm_checks.py does), every parameter pre-filled with NaN, then ``load_weights`` runs on the
checkpoint's tensors: vLLM raises on unknown names; a parameter still NaN afterwards is one the checkpoint lacks
(except the embedding / LM head vLLM shares from the target, and the unused ``mask_embedding``). ``causal`` is each
DFlash / DSpark draft layer's attention causality as vLLM resolved it (``DFlashQwen3Attention.causal``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

SHARED = ("model.embed_tokens.", "lm_head.", "model.mask_embedding")


def _method(cfg: dict) -> str:
    kind = cfg.get("speculators_model_type")
    if kind:
        return {"dflash2": "dflash", "eagle3": "eagle3", "dspark": "dspark", "dflash": "dflash"}[kind]
    arch = (cfg.get("architectures") or [""])[0]
    return "dflash" if arch.startswith("DFlash") else "dspark"


def _engine_config(target: str):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=target, skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
                      dtype="bfloat16").create_engine_config()


def check(target: str, path: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import SpeculativeConfig, set_current_vllm_config
    from vllm.model_executor.models.registry import ModelRegistry

    cfg = json.loads((Path(path) / "config.json").read_text())
    result = {"path": path, "ok": False, "method": _method(cfg), "arch": None, "error": None, "missing": [],
              "causal": None}
    try:
        base = _engine_config(target)  # fresh per drafter: vLLM registers attention layer names per config
        spec = SpeculativeConfig(model=path, method=result["method"], num_speculative_tokens=2,
                                 target_model_config=base.model_config, target_parallel_config=base.parallel_config)
        object.__setattr__(base, "speculative_config", spec)
        archs = list(spec.draft_model_config.hf_config.architectures)
        cls, arch = ModelRegistry.resolve_model_cls(archs, spec.draft_model_config)
        result["arch"] = arch
        with set_current_vllm_config(base):
            model = cls(vllm_config=base)
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)
            tensors = {}
            for f in sorted(Path(path).glob("*.safetensors")):
                tensors.update(load_file(str(f)))
            model.load_weights(iter(tensors.items()))
        for name, p in model.named_parameters():
            unset = torch.isnan(p).any() if p.is_floating_point() else (p == torch.iinfo(p.dtype).min).any()
            if bool(unset) and not name.startswith(SHARED):
                result["missing"].append(name)
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        causal = [getattr(layer.self_attn, "causal", None) for layer in layers]
        result["causal"] = causal if causal and None not in causal else None
        result["ok"] = not result["missing"]
    except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the result
        result["error"] = f"{type(exc).__name__}: {exc}"[:1500]
    return result


def main() -> None:
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment
    target, drafts = sys.argv[1], json.loads(sys.argv[2])
    base = _engine_config(target)
    from vllm.config import set_current_vllm_config

    init_file = Path(tempfile.mkdtemp(prefix="conformance-gloo-")) / "init"
    with set_current_vllm_config(base):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{init_file}")
        ensure_model_parallel_initialized(1, 1)
    out = [check(target, d) for d in drafts]
    print("CONFORMANCE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
