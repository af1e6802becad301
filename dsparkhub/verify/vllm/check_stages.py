"""The stages of ``dsparkhub vllm-check`` that run inside the vLLM child process (``config``, ``load_weights``,
``engine``; see :mod:`dsparkhub.verify.vllm.checks` for what each checks and why). Imported only by
``python -m dsparkhub.verify.vllm.child check`` (and vLLM parity tests): it imports vLLM.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparkhub.errors import CheckpointNotFoundError, VerifyError
from dsparkhub.verify.vllm.checks import (FAILED, PASSED, REFUSED, SKIPPED, StageResult, VllmCheckReport,
                                         default_num_speculative_tokens, serves_method, vllm_said)
from dsparkhub.verify.vllm.contract import VllmContract, contract_for, installed_contract
from dsparkhub.verify.vllm.stand_in import CpuStandIn

# Stacked parameters of vLLM's Qwen3 / Llama layers (qwen3_dflash.py, llama_eagle3.py orig_to_new_stacked) and
# of vLLM 0.34's K3 MLA drafter (models/kimi_k3/nvidia/dspark_mla.py:452-453): checkpoint part -> order.
_STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
           "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}


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


def build_drafter_model(vllm_config, contract: VllmContract | None = None):
    """vLLM's own drafter module for ``vllm_config.speculative_config``, built on CPU with random weights.

    The class is the one vLLM's ``ModelRegistry`` resolves for the drafter's architecture; it must live in a module
    of the installed vLLM's contract ``drafter_classes`` (default: :func:`installed_contract`). Call it in a child
    process: it initialises a one-process gloo group and sets vLLM's current config (both process-global).

    Returns:
        ``(model, class_name)``.

    Raises:
        LookupError: the class lives in a module that does not build on CPU (none of the contract's
            ``drafter_classes``).
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
    cpu_modules = {module for classes in (contract or installed_contract()).value("drafter_classes").values()
                   for module, _ in classes.values()}
    # the contract names a module as the registry does: short (qwen3_dspark) or dotted (vllm.models.minimax_m3...)
    if cls.__module__ not in cpu_modules and cls.__module__.rsplit(".", 1)[-1] not in cpu_modules:
        raise LookupError(f"vLLM resolved {archs} to {cls.__module__}.{cls.__name__}, which does not build on CPU")
    with set_current_vllm_config(vllm_config):
        if not model_parallel_is_initialized():
            init_file = Path(tempfile.mkdtemp(prefix="dsparkhub-gloo-")) / "init"
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{init_file}")
            ensure_model_parallel_initialized(1, 1)
        return cls(vllm_config=vllm_config), cls.__name__


@dataclass(frozen=True)
class VocabFacts:
    """What decides whether vLLM shares a target tensor with the drafter, and which guards apply.

    Attributes:
        input_vocab: the drafter's ``vocab_size`` (its embedding rows).
        draft_vocab: the drafter's output vocab (``draft_vocab_size``, else ``vocab_size``).
        target_vocab: the target's vocab size (vLLM ``model_config.get_vocab_size()``).
        confidence_declared: the config sets ``enable_confidence_head``.
    """

    input_vocab: int
    draft_vocab: int
    target_vocab: int
    confidence_declared: bool = False

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "VocabFacts":
        hf = vllm_config.speculative_config.draft_model_config.hf_config
        vocab = int(getattr(hf, "vocab_size", 0) or 0)
        return cls(vocab, int(getattr(hf, "draft_vocab_size", None) or vocab),
                   int(vllm_config.model_config.get_vocab_size()),
                   bool(getattr(hf, "enable_confidence_head", False)))

    def shared(self, rule: str) -> bool:
        """Whether a contract ``shares_from_target`` rule (``"draft output vocab == target vocab"``) holds."""
        m = re.fullmatch(r"draft (input|output) vocab (<=|==) target vocab", rule.strip())
        if m is None:
            raise VerifyError(f"contract.yaml shares_from_target rule {rule!r}: expected 'draft input|output vocab "
                              f"<=|== target vocab'")
        mine = self.input_vocab if m.group(1) == "input" else self.draft_vocab
        return mine <= self.target_vocab if m.group(2) == "<=" else mine == self.target_vocab


def _load_weights_stage(vllm_config, draft: Path, contract: VllmContract | None = None) -> StageResult:
    """Build vLLM's drafter class, fill every parameter with a sentinel, run its ``load_weights`` on ``draft``'s
    tensors and account for each parameter with ``contract`` (the vLLM whose sharing rules and guards apply; default
    the installed one); see :func:`account_load`."""
    import torch

    from vllm.config import set_current_vllm_config

    tensors = _read_tensors(draft)
    model, class_name = build_drafter_model(vllm_config)
    # a class that renames its checkpoint's names before loading (vLLM 0.34 MiniMaxM3DSparkForCausalLM:
    # models/minimax_m3/common/dspark.py:416-427) is accounted for in the names it renames them to
    rename = getattr(type(model), "_rename_checkpoint_weights", None)
    named = dict(rename(tensors.items())) if rename is not None else tensors
    with set_current_vllm_config(vllm_config):
        modules = dict(model.named_modules())
        params_before = dict(model.named_parameters())
        with torch.no_grad():
            for p in params_before.values():
                p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)
        model.load_weights(iter(tensors.items()))
        params = dict(model.named_parameters())  # vLLM <= 0.33 drops a confidence head not shipped
    return account_load(params, modules, named, class_name, VocabFacts.from_vllm_config(vllm_config),
                        contract or installed_contract())


def account_load(params: dict, modules: dict, tensors: dict, class_name: str, vocab: VocabFacts,
                 contract: VllmContract) -> StageResult:
    """The load_weights stage's verdict on parameters after a sentinel-filled ``load_weights``.

    Args:
        params: vLLM parameter name -> tensor after loading (floating ones pre-filled with NaN, integer ones with
            their dtype's minimum: a sentinel left is a value the checkpoint did not set).
        modules: vLLM module name -> module (``org_vocab_size`` marks padded vocab rows).
        tensors: checkpoint name -> tensor.
        class_name: vLLM's drafter class, named in the message.
        vocab: the vocab sizes that decide what vLLM shares from the target (:class:`VocabFacts`).
        contract: the vLLM version's facts: ``shares_from_target`` (a missing tensor counts as borrowed only where
            that vLLM aliases the target's) and ``loader_guards`` (named in the message where vLLM dropped them).

    Returns:
        ``failed`` when a parameter is unset (not shared by that vLLM), a declared confidence head ships no tensors,
        or a tensor did not land bit-exact; else ``passed``.
    """
    import torch

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
    borrowed, not_shared = [], []
    rules = contract.value("shares_from_target")
    for pname, key in (("model.embed_tokens.weight", "embed_tokens"), ("lm_head.weight", "lm_head")):
        if pname in params and not any(n.split(".", 1)[0] == key for n in shipped):
            # vLLM aliases the target's only where its rule holds (v1/worker/gpu/spec_decode/dspark/utils.py)
            (borrowed if vocab.shared(rules[key]) else not_shared).append(pname)
    ignored = ["model.mask_embedding"] if "model.mask_embedding" in params else []  # unused placeholder

    missing: list[str] = _guarded(not_shared, shipped, params, vocab, contract)
    for pname, p in params.items():
        if pname in borrowed or pname in ignored or pname in not_shared or (
                pname.startswith("model.confidence_head") and any(m.startswith("confidence_head") for m in missing)):
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
            if pname == "draft_id_to_target_id":
                missing.append("d2t" + _guard_note("reduced_vocab_needs_d2t", vocab, contract))
            else:
                missing.append(pname.removeprefix("model."))

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
               "loaded": max(0, len(params) - len(missing) - len(borrowed) - len(ignored)),
               "missing": missing, "borrowed_from_target": borrowed, "ignored": ignored,
               "checkpoint_tensors": len(tensors), "compared_bit_exact": compared, "mismatched": mismatched,
               "cast": cast[:20], "confidence_head_loaded": any(n.startswith("model.confidence_head") for n in params)}
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} parameter(s) not set by the checkpoint (vLLM leaves them as "
                         f"uninitialized memory and does not say so): {'; '.join(missing[:8])}")
        if mismatched:
            parts.append(f"{len(mismatched)} tensor(s) did not land bit-exact: {'; '.join(mismatched[:5])}")
        return StageResult("load_weights", FAILED, f"{class_name}.load_weights: " + "; ".join(parts), details)
    return StageResult("load_weights", PASSED,
                       f"vLLM's {class_name}.load_weights set all {details['loaded']} parameters; "
                       f"{compared} tensors compared bit-exact"
                       + (f"; {len(borrowed)} borrowed from the target" if borrowed else ""), details)


def _guard_note(guard: str, vocab: VocabFacts, contract: VllmContract) -> str:
    """`` (...)`` after a missing tensor a reduced-vocab drafter needs: what the contract's vLLM does about it."""
    if vocab.draft_vocab == vocab.target_vocab:
        return ""
    applied = contract.guard(guard)
    return (f" (draft vocab {vocab.draft_vocab} < target vocab {vocab.target_vocab}: vLLM {contract.line}'s "
            f"load_weights {'refuses this' if applied else 'no longer refuses this and serves it'}; "
            f"{contract.source('loader_guards')})")


def _guarded(not_shared: list[str], shipped: set[str], params: dict, vocab: VocabFacts,
             contract: VllmContract) -> list[str]:
    """The guards dsparkhub owns whatever vLLM applies: a target tensor vLLM would not share, and a declared
    confidence head without tensors (vLLM <= 0.33 drops the head, 0.34 keeps it uninitialised)."""
    out = []
    for pname in not_shared:
        key = "lm_head" if pname.startswith("lm_head") else "embed_tokens"
        guard = "reduced_vocab_needs_lm_head" if key == "lm_head" else "expanded_input_vocab_needs_embed_tokens"
        mine = vocab.draft_vocab if key == "lm_head" else vocab.input_vocab
        out.append(f"{pname.removeprefix('model.')} (not borrowed: vLLM {contract.line} shares the target's "
                   f"{key} only when {contract.value('shares_from_target')[key]}, and this drafter's is {mine} "
                   f"vs {vocab.target_vocab}; its load_weights "
                   f"{'refuses this' if contract.guard(guard) else 'no longer refuses this and serves it'}: "
                   f"{contract.source('loader_guards')})")
    if vocab.confidence_declared and not any(n.startswith("confidence_head") for n in shipped):
        fate = contract.guard("confidence_head_without_tensors")
        out.append("confidence_head.* (enable_confidence_head is true but the checkpoint ships no "
                   f"confidence_head tensors: vLLM {contract.line} "
                   + ("drops the declared head" if fate == "dropped" else
                      "keeps the head uninitialised and adaptive verification uses it")
                   + f"; {contract.source('loader_guards')})")
    return out


def run_checks(draft: str, target: str, num_speculative_tokens: int | None = None, dtype: str = "auto",
               max_model_len: int = 512, method: str = "dspark", vllm_version: str | None = None) -> VllmCheckReport:
    """The three stages with ``method``, in this process (call it in a child: it initialises vLLM's global state).

    Args:
        vllm_version: judge the load stage with this vLLM version's contract (what it shares from the target, which
            guards its loader applies) instead of the installed one's: a node you are not on.

    Raises:
        ModuleNotFoundError: vLLM is not installed (the parent turns it into EngineUnavailableError).
        EngineUnavailableError: the installed vLLM lacks a module / attribute its contract says the checks touch
            (engine self-check, before anything loads), or a version is older than the contract's first line.
    """
    from dsparkhub.errors import EngineUnavailableError
    from dsparkhub.verify.vllm.contract import self_check, self_check_paragraph, vllm_version as installed_version
    from dsparkhub.verify.vllm.refusals import refusal_reason

    stand_in = CpuStandIn(contract_for(installed_version() or "0.32.0"))  # its env must be set before vLLM loads
    import vllm

    installed = contract_for(vllm.__version__)
    paragraph = self_check_paragraph(installed, self_check(installed, "check"))
    if paragraph:
        raise EngineUnavailableError(paragraph)
    judged = contract_for(vllm_version) if vllm_version else installed
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
        hf_config = spec.draft_model_config.hf_config
        details = {"method": spec.method, "architectures": archs,
                   "config_class": f"{type(hf_config).__module__}.{type(hf_config).__name__}",
                   "num_speculative_tokens": spec.num_speculative_tokens,
                   "draft_model_type": getattr(spec.draft_model_config.hf_config, "model_type", None)}
        if spec.method != method or not archs or not serves_method(archs[0], method):
            return StageResult("config", FAILED, f"vLLM resolved method {spec.method!r}, architectures {archs}; "
                                                 f"expected {method} and a {method} drafter architecture", details)
        return StageResult("config", PASSED, f"vLLM's SpeculativeConfig accepted the drafter as {archs[0]} "
                                             f"(method {method}, num_speculative_tokens={spec.num_speculative_tokens}; "
                                             f"config class {type(hf_config).__name__})", details)

    def load_stage() -> StageResult:
        try:
            return _load_weights_stage(holder["vllm_config"], draft_path, judged)
        except LookupError as exc:
            return StageResult("load_weights", SKIPPED, f"{exc} (contract gpu_drafter_classes: "
                                                        f"{installed.source('gpu_drafter_classes')})")

    with stand_in:
        stages = [_stage("config", config_stage)]
        if not stages[0].ok:
            stages.append(StageResult("load_weights", SKIPPED, "the config stage failed"))
        else:
            stages.append(_stage("load_weights", load_stage))
    if stand_in.used:
        for stage in stages:
            stage.details["stand_in"] = stand_in.used

    def engine_stage() -> StageResult:
        spec = {"model": str(draft_path), "method": method, "num_speculative_tokens": n}
        try:
            vc = EngineArgs(**base_args, speculative_config=spec).create_engine_config()
        except (ValueError, RuntimeError) as exc:  # 0.34's x86 CPU platform raises RuntimeError
            said = vllm_said(exc)
            reason = refusal_reason(said)
            if reason is None:
                raise
            return StageResult("engine", REFUSED, said, {"runner": "V1" if "V1 " in said else "V2",
                                                         "reason": reason, "vllm_message": str(exc)})
        attribute = installed.value("runner_attribute")  # None from 0.34 on: Model Runner V1 is gone
        runner = ("V2" if getattr(vc, attribute) else "V1") if attribute else "V2"
        return StageResult("engine", PASSED, f"vLLM accepted the engine configuration for {method} "
                                             f"(model runner {runner})", {"runner": runner})

    stages.append(_stage("engine", engine_stage))
    return VllmCheckReport(draft=str(draft_path), target=target, vllm_version=vllm.__version__,
                           num_speculative_tokens=n, stages=stages, method=method, contract=judged.to_dict(),
                           stand_in=stand_in.used)

