"""The stages of ``dsparkhub vllm-check`` that run inside the vLLM child process (``config``, ``load_weights``,
``engine``; see :mod:`dsparkhub.verify.vllm.checks` for what each checks and why). Imported only by
``python -m dsparkhub.verify.vllm.child check`` (and vLLM parity tests): it imports vLLM.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dsparkhub.errors import CheckpointNotFoundError, VerifyError
from dsparkhub.verify.vllm.checks import (FAILED, PASSED, REFUSED, SKIPPED, StageResult, VllmCheckReport,
                                         default_num_speculative_tokens, serves_method, vllm_said)

# Stacked parameters of vLLM's Qwen3 / Llama layers (qwen3_dflash.py, llama_eagle3.py orig_to_new_stacked):
# checkpoint part -> order.
_STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# vLLM 0.32 modules whose drafter classes build on CPU with this module's procedure (K3 / DeepSeek-V4 / Gemma4 DSpark
# and Laguna DFlash need GPU kernels or a different target).
_CPU_MODULES = ("qwen3_dspark", "qwen3_dflash", "qwen3_dflash2", "llama_eagle3", "qwen3_eagle3")


def _read_tensors(folder: Path) -> dict:
    """All tensors of a safetensors checkpoint folder (single file or shards) as a name -> torch.Tensor dict."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointNotFoundError(f"no *.safetensors file in {folder}", path=folder)
    tensors: dict = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            if name in tensors:
                raise VerifyError(f"tensor {name} appears in two shards of {folder} (second: {f.name})", path=f)
            tensors[name] = t
    return tensors


def _stage(name: str, fn) -> StageResult:
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - vLLM's own message is the result of this stage
        result = StageResult(name, FAILED, vllm_said(exc), {"exception": type(exc).__name__,
                                                            "vllm_message": str(exc)[-4000:]})
    result.seconds = time.perf_counter() - t0
    return result


def _param_for(name: str) -> tuple[str, str | None, int | None]:
    """vLLM parameter name for a checkpoint tensor name, plus (stack part, index) for stacked parameters."""
    if name == "d2t":
        return "draft_id_to_target_id", None, None
    if name.startswith("lm_head"):
        return name, None, None
    full = "model." + name.replace("midlayer.", "layers.0.")  # llama_eagle3.py hf_to_vllm_mapper
    for stacked, parts in _STACKS.items():
        for i, part in enumerate(parts):
            if f".{part}." in full:
                return full.replace(f".{part}.", f".{stacked}."), part, i
    return full, None, None


def build_drafter_model(vllm_config):
    """vLLM's own drafter module for ``vllm_config.speculative_config``, built on CPU with random weights.

    The class is the one vLLM's ``ModelRegistry`` resolves for the drafter's architecture. Call it in a child
    process: it initialises a one-process gloo group and sets vLLM's current config (both process-global).

    Returns:
        ``(model, class_name)``.

    Raises:
        LookupError: the class lives in a module that does not build on CPU (see ``_CPU_MODULES``).
    """
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
        model_parallel_is_initialized,
    )
    from vllm.model_executor.models.registry import ModelRegistry

    draft_config = vllm_config.speculative_config.draft_model_config
    archs = list(getattr(draft_config.hf_config, "architectures", None) or [])
    cls, _ = ModelRegistry.resolve_model_cls(archs, model_config=draft_config)
    if cls.__module__.rsplit(".", 1)[-1] not in _CPU_MODULES:
        raise LookupError(f"vLLM resolved {archs} to {cls.__module__}.{cls.__name__}, which does not build on CPU")
    with set_current_vllm_config(vllm_config):
        if not model_parallel_is_initialized():
            init_file = Path(tempfile.mkdtemp(prefix="dsparkhub-gloo-")) / "init"
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{init_file}")
            ensure_model_parallel_initialized(1, 1)
        return cls(vllm_config=vllm_config), cls.__name__


def _load_weights_stage(vllm_config, draft: Path) -> StageResult:
    import torch

    from vllm.config import set_current_vllm_config

    tensors = _read_tensors(draft)
    model, class_name = build_drafter_model(vllm_config)
    with set_current_vllm_config(vllm_config):
        modules = dict(model.named_modules())
        params_before = dict(model.named_parameters())
        with torch.no_grad():
            for p in params_before.values():
                p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)
        model.load_weights(iter(tensors.items()))
        params = dict(model.named_parameters())  # the confidence head is dropped when not shipped

    def unset_rows(pname: str, p) -> "torch.Tensor":
        """Boolean mask over dim 0: rows still holding the sentinel (padded vocab rows excluded)."""
        data = p.detach()
        bad = torch.isnan(data) if data.is_floating_point() else data == torch.iinfo(data.dtype).min
        bad = bad.reshape(bad.shape[0], -1).any(dim=1) if bad.dim() > 0 else bad.reshape(1)
        module = modules.get(pname.rsplit(".", 1)[0])
        org = getattr(module, "org_vocab_size", None)
        if org is not None and bad.dim() == 1:
            bad[org:] = False  # ParallelLMHead / VocabParallelEmbedding pad the vocab; padding is never loaded
        return bad

    shipped = set(tensors)
    borrowed = []
    for pname, key in (("model.embed_tokens.weight", "embed_tokens"), ("lm_head.weight", "lm_head")):
        if pname in params and not any(n.split(".", 1)[0] == key for n in shipped):
            borrowed.append(pname)  # vLLM aliases the target's (v1/worker/gpu/spec_decode/dspark/utils.py)
    ignored = ["model.mask_embedding"] if "model.mask_embedding" in params else []  # unused placeholder

    missing: list[str] = []
    for pname, p in params.items():
        if pname in borrowed or pname in ignored:
            continue
        bad = unset_rows(pname, p)
        if not bool(bad.any()):
            continue
        leaf = pname.split(".")[-2]
        if leaf in _STACKS:
            # Name the checkpoint tensors whose slice of the stacked parameter stayed unset.
            offset = 0
            prefix = pname[len("model."):].rsplit(".", 2)[0]
            for part in _STACKS[leaf]:
                src = tensors.get(f"{prefix}.{part}.weight")
                rows = src.shape[0] if src is not None else None
                if rows is None:
                    missing.append(f"{prefix}.{part}.weight (slice of {pname})")
                    # without the tensor we cannot know its rows; the rest of the stack is reported as a whole
                    break
                if bool(bad[offset:offset + rows].any()):
                    missing.append(f"{prefix}.{part}.weight (slice of {pname})")
                offset += rows
        else:
            # Report checkpoint names (what the user can fix), not vLLM's parameter names.
            missing.append("d2t" if pname == "draft_id_to_target_id" else pname.removeprefix("model."))

    compared, mismatched, cast = 0, [], []
    for name, src in tensors.items():
        if name == "t2d":
            continue
        pname, part, index = _param_for(name)
        p = params.get(pname)
        if p is None:
            continue
        data = p.detach()
        if part is not None:
            prefix = name.rsplit(".", 2)[0]
            parts = _STACKS[pname.split(".")[-2]]
            earlier = [tensors.get(f"{prefix}.{q}.weight") for q in parts[:index]]
            if any(t is None for t in earlier):
                continue  # an earlier slice is missing (reported above), so this slice's offset is unknown
            offset = sum(t.shape[0] for t in earlier)
            data = data[offset:offset + src.shape[0]]
        elif data.dim() >= 1 and src.dim() >= 1 and data.shape[0] > src.shape[0]:
            data = data[: src.shape[0]]  # padded vocab rows
        if tuple(data.shape) != tuple(src.shape):
            mismatched.append(f"{name}: shape {list(src.shape)} in the checkpoint, {list(data.shape)} in vLLM")
            continue
        if src.dtype != data.dtype:
            cast.append(f"{name}: {src.dtype} -> {data.dtype}")
        compared += 1
        if not torch.equal(data, src.to(data.dtype)):
            mismatched.append(f"{name}: values differ after loading")

    details = {"class": class_name, "parameters": len(params),
               "loaded": len(params) - len(missing) - len(borrowed) - len(ignored),
               "missing": missing, "borrowed_from_target": borrowed, "ignored": ignored,
               "checkpoint_tensors": len(tensors), "compared_bit_exact": compared, "mismatched": mismatched,
               "cast": cast[:20], "confidence_head_loaded": any(n.startswith("model.confidence_head") for n in params)}
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} parameter(s) not set by the checkpoint (vLLM leaves them as "
                         f"uninitialized memory and does not say so): {', '.join(missing[:8])}")
        if mismatched:
            parts.append(f"{len(mismatched)} tensor(s) did not land bit-exact: {'; '.join(mismatched[:5])}")
        return StageResult("load_weights", FAILED, f"{class_name}.load_weights: " + "; ".join(parts), details)
    return StageResult("load_weights", PASSED,
                       f"vLLM's {class_name}.load_weights set all {details['loaded']} parameters; "
                       f"{compared} tensors compared bit-exact"
                       + (f"; {len(borrowed)} borrowed from the target" if borrowed else ""), details)


def run_checks(draft: str, target: str, num_speculative_tokens: int | None = None, dtype: str = "auto",
               max_model_len: int = 512, method: str = "dspark") -> VllmCheckReport:
    """The three stages with ``method``, in this process (call it in a child: it initialises vLLM's global state).

    Raises:
        ModuleNotFoundError: vLLM is not installed (the parent turns it into EngineUnavailableError).
    """
    import vllm
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    draft_path = Path(draft)
    n = num_speculative_tokens
    if n is None:
        n = default_num_speculative_tokens(json.loads((draft_path / "config.json").read_text()))
    base_args = dict(model=target, skip_tokenizer_init=True, enforce_eager=True, max_model_len=max_model_len,
                     dtype=dtype)
    holder: dict[str, Any] = {}

    def config_stage() -> StageResult:
        from dsparkhub.verify.vllm.method import method_for_drafter

        declared = method_for_drafter(draft_path)
        if declared != method:
            # vLLM renames the architecture to the method's class (e.g. DSparkDraftModel) and would accept it.
            return StageResult("config", FAILED, f"the drafter's config.json says it is a {declared} drafter; "
                                                 f"checking it as {method} would test another engine path",
                               {"method": method, "declared_method": declared})
        vllm_config = EngineArgs(**base_args).create_engine_config()
        spec = SpeculativeConfig(model=str(draft_path), method=method, num_speculative_tokens=n,
                                 target_model_config=vllm_config.model_config,
                                 target_parallel_config=vllm_config.parallel_config)
        # Set without re-validating the VllmConfig: that validation is the engine stage (and refuses on CPU).
        object.__setattr__(vllm_config, "speculative_config", spec)
        holder["vllm_config"] = vllm_config
        archs = list(getattr(spec.draft_model_config.hf_config, "architectures", None) or [])
        holder["archs"] = archs
        details = {"method": spec.method, "architectures": archs,
                   "num_speculative_tokens": spec.num_speculative_tokens,
                   "draft_model_type": getattr(spec.draft_model_config.hf_config, "model_type", None)}
        if spec.method != method or not archs or not serves_method(archs[0], method):
            return StageResult("config", FAILED, f"vLLM resolved method {spec.method!r}, architectures {archs}; "
                                                 f"expected {method} and a {method} drafter architecture", details)
        return StageResult("config", PASSED, f"vLLM's SpeculativeConfig accepted the drafter as {archs[0]} "
                                             f"(method {method}, num_speculative_tokens={spec.num_speculative_tokens})",
                           details)

    def load_stage() -> StageResult:
        try:
            return _load_weights_stage(holder["vllm_config"], draft_path)
        except LookupError as exc:
            return StageResult("load_weights", SKIPPED, f"{exc} (vLLM 0.32 has no CPU class for K3 / DeepSeek-V4 / "
                                                        "Gemma4 DSpark drafters)")

    stages = [_stage("config", config_stage)]
    if not stages[0].ok:
        stages.append(StageResult("load_weights", SKIPPED, "the config stage failed"))
    else:
        stages.append(_stage("load_weights", load_stage))

    def engine_stage() -> StageResult:
        spec = {"model": str(draft_path), "method": method, "num_speculative_tokens": n}
        try:
            vc = EngineArgs(**base_args, speculative_config=spec).create_engine_config()
        except ValueError as exc:
            said = vllm_said(exc)
            if "Model Runner" not in said:
                raise
            return StageResult("engine", REFUSED, said, {"runner": "V1" if "V1 " in said else "V2",
                                                         "vllm_message": str(exc)})
        runner = "V2" if vc.use_v2_model_runner else "V1"
        return StageResult("engine", PASSED, f"vLLM accepted the engine configuration for {method} "
                                             f"(model runner {runner})", {"runner": runner})

    stages.append(_stage("engine", engine_stage))
    return VllmCheckReport(draft=str(draft_path), target=target, vllm_version=vllm.__version__,
                           num_speculative_tokens=n, stages=stages, method=method)
