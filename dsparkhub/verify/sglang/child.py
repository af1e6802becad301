"""SGLang 0.5.23's own checks of a DSpark / DFlash drafter, run as a script by ``.venv-sglang/bin/python`` on CPU.

This file is executed in SGLang's virtual environment (built by ``scripts/setup_sglang.sh``), where dsparkhub itself
is not installed: it imports only the standard library, torch, safetensors and sglang, and prints one JSON report on
stdout. The parent side is :mod:`dsparkhub.verify.sglang.checks`.

Stages (SGLang file:line in the 0.5.23 wheel):

1. ``config`` — ``ServerArgs(model_path=TARGET, speculative_algorithm=DSPARK|DFLASH,
   speculative_draft_model_path=DRAFT, device="cuda").resolve_once()``: SGLang's own server-argument resolution as a
   GPU node runs it (``arg_groups/speculative_hook.py:666`` ``_handle_dspark``: reads the draft checkpoint config
   through ``dspark_config.read_draft_checkpoint_config``, sets ``speculative_num_draft_tokens`` = γ + 1 at
   ``:824-838``); then ``hf_transformers_utils.get_config`` on the drafter, ``ModelRegistry.resolve_model_cls`` on
   its architectures, ``dspark_config.parse_dspark_draft_config`` (``:215``; DFlash:
   ``dflash_utils.parse_dflash_draft_config``, ``:588``) and, for DSpark, ``dspark_config.resolve_runtime_config``
   with the target's vocab (mask token inside the target vocab, ``:110-121``).
2. ``load_weights`` — SGLang's draft class (``models/dspark.py:977`` ``Qwen3DSparkModel`` /
   ``models/dflash.py`` ``DFlashDraftModel``) built on CPU and its ``load_weights`` run on the drafter's tensors. Every
   parameter is pre-filled with NaN; a NaN left afterwards is a tensor the checkpoint lacks (SGLang's DFlash backbone
   loader ignores unknown names, ``models/dflash.py:944-946``, and never reports missing ones). Checkpoint tensors
   SGLang drops on purpose (``embed_tokens`` / ``lm_head``, shared from the target: ``models/dspark.py:510, 632-639``)
   and tensors it drops silently (``d2t``, anything unknown) are listed. With ``enable_confidence_head`` the class is
   built a second time under ``SGLANG_RAGGED_VERIFY_MODE=compact`` (the default ``static`` builds no confidence head:
   ``models/dspark.py:486-487``, ``environ.py:1572``) so the head's weights are loaded and compared too.
3. ``engine`` — the same resolution with ``device="cpu"``: SGLang refuses ("DSpark speculative decoding only
   supports CUDA, NPU or XPU device.", ``speculative_hook.py:669-672``); the report keeps its message.

A drafter whose architectures SGLang's ``ModelRegistry`` lacks (``models/registry.py`` ``resolve_model_cls`` would
fall back to ``TransformersForCausalLM``: Kimi K3's ``K3DSparkModel``) is refused at the ``config`` stage before any of
this, in one paragraph listing the draft classes SGLang registers for the algorithm (:func:`unserved_stage`); the
other two stages are then skipped.

Two concessions to CPU, both limited to this child process: SGLang's config package imports torchvision for
multimodal image processors (``multimodal/internvl_utils.py:5``), and PyPI's torchvision wheel needs CUDA torch, so
``torchvision`` imported *by sglang modules* resolves to a placeholder whose callables raise ImportError (no drafter
path calls them); and the rotary embedding's constructor picks a kernel by platform (``layers/rotary_embedding/
base.py:121-141``) — it is told the platform is CPU, the torch-native path SGLang's CPU engine takes, because the CPU
engine itself needs SGLang's CPU kernel package (not on PyPI).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types


# ------------------------------------------------------------------------ torchvision placeholder (see docstring)


class _Missing:
    """Stands for a torchvision attribute; attribute access chains, calling raises ImportError."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self._name} is unavailable in .venv-sglang (torchvision needs CUDA torch)")


def _importer() -> str:
    """Module name of the code running the current import statement (importlib frames skipped)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen_importlib")) or frame.f_code.co_filename.startswith("<frozen")):
            return name
        frame = frame.f_back
    return ""


class _TorchvisionPlaceholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision...`` from sglang modules only (transformers' availability probe sees nothing)."""

    def find_spec(self, name, path, target=None):
        if name.split(".", 1)[0] != "torchvision":
            return None
        if name in sys.modules or _importer().startswith("sglang"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def getattr_(attr, _name=spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Missing(f"{_name}.{attr}")

        module.__getattr__ = getattr_
        return module

    def exec_module(self, module):
        return None


def install_placeholder() -> None:
    """Install the torchvision placeholder unless a working torchvision is importable."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure (absent, or CUDA wheel beside CPU torch) means: use the placeholder
        for key in [k for k in sys.modules if k.split(".", 1)[0] == "torchvision"]:
            del sys.modules[key]
        sys.meta_path.insert(0, _TorchvisionPlaceholder())


# ------------------------------------------------------------------------------------------------- stages

PASSED, FAILED, REFUSED, SKIPPED = "passed", "failed", "refused", "skipped"
_STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_SHARED = ("embed_tokens.", "lm_head.")  # models/dspark.py:510 (_DSPARK_SKIPPED_WEIGHT_PREFIXES) and :632-636


def _stage(name, fn):
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - SGLang's own message is the result of this stage
        result = {"name": name, "status": FAILED, "message": f"{type(exc).__name__}: {exc}", "details": {}}
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def _server_args(draft: str | None, target: str, algorithm: str, device: str):
    """SGLang's ServerArgs; ``draft`` None leaves --speculative-draft-model-path unset (SGLang looks for the
    bundled dspark_* keys, then a ``dspark/`` subfolder: speculative_hook.py:720-755)."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=target, speculative_algorithm=algorithm, speculative_draft_model_path=draft,
                      device=device, skip_tokenizer_init=True)


def _read_tensors(folder: str) -> dict:
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    tensors: dict = {}
    for f in files:
        tensors.update(load_file(os.path.join(folder, f)))
    return tensors


#: the module-name marks of the draft classes each --speculative-algorithm loads (models/dspark*.py, models/dflash.py,
#: models/*eagle3.py)
_DRAFT_MODULES = {"DSPARK": "dspark", "DFLASH": "dflash", "EAGLE3": "eagle3"}


def _where(obj) -> str:
    """``sglang/<path>:<line>`` of a class or function in the installed wheel."""
    import inspect

    path = inspect.getsourcefile(obj) or "?"
    return f"{path[path.rfind('sglang/'):]}:{inspect.getsourcelines(obj)[1]}"


def _entry_line(module) -> str:
    """``sglang/srt/models/<file>.py:<line>`` of a model module's ``EntryClass`` assignment."""
    path = module.__file__
    with open(path, encoding="utf-8") as f:
        line = next((i for i, text in enumerate(f, 1) if text.startswith("EntryClass")), 0)
    return f"{path[path.rfind('sglang/'):]}:{line}"


def unserved_stage(draft: str, algorithm: str) -> dict | None:
    """The ``config`` stage refused, when SGLang's ModelRegistry has no class for any of the drafter's architectures
    (``models/registry.py`` ``resolve_model_cls`` would fall back to ``TransformersForCausalLM``, which no
    speculative worker drives); None when it has one. The message lists the draft classes SGLang registers for
    ``algorithm``, each with its module's ``EntryClass`` line, read from the installed wheel."""
    import sys as _sys

    from sglang.srt.models.registry import ModelRegistry, _ModelRegistry

    with open(os.path.join(draft, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    supported = ModelRegistry.get_supported_archs()
    if any(a in supported for a in archs):
        return None
    mark = _DRAFT_MODULES.get(algorithm, algorithm.lower())
    served: dict[str, list[str]] = {}
    for arch in sorted(supported):
        cls = ModelRegistry.models[arch]
        module = _sys.modules.get(getattr(cls, "__module__", ""))
        if module is not None and mark in module.__name__.rsplit(".", 1)[-1]:
            served.setdefault(_entry_line(module), []).append(arch)
    listing = "; ".join(f"{', '.join(names)} ({where})" for where, names in served.items())
    resolver = _where(_ModelRegistry.resolve_model_cls)
    message = (f"SGLang does not serve this drafter: its ModelRegistry has no class for architectures {archs} "
               f"(model_type {cfg.get('model_type')!r}); resolve_model_cls ({resolver}) "
               f"would fall back to TransformersForCausalLM, which no --speculative-algorithm {algorithm} worker "
               f"drives. The {algorithm} draft classes it registers (EntryClass of each models/*.py) are: "
               f"{listing or 'none'}.")
    return {"name": "config", "status": REFUSED, "message": message,
            "details": {"architectures": archs, "model_type": cfg.get("model_type"), "algorithm": algorithm,
                        "registered_draft_classes": served}}


def config_stage(draft: str, target: str, algorithm: str, holder: dict) -> dict:
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.utils.hf_transformers_utils import get_config

    if draft is not None and (refused := unserved_stage(draft, algorithm)) is not None:
        return refused
    args = _server_args(draft, target, algorithm, "cuda")
    args.resolve_once()
    holder["server_args"] = args
    view = resolved_view(args)
    details = {"algorithm": algorithm, "speculative_num_draft_tokens": view.speculative_num_draft_tokens,
               "speculative_num_steps": view.speculative_num_steps,
               "draft_path_given": draft is not None,
               "speculative_draft_model_path": view.speculative_draft_model_path}
    if draft is None:
        if view.speculative_draft_model_path is None:  # str(None) would name the drafter "None"
            raise ValueError(f"SGLang found no drafter in {target}: no dspark_* keys in its config.json and no "
                             "dspark/ subfolder; pass the drafter folder as DRAFT")
        draft = str(view.speculative_draft_model_path)
        if (refused := unserved_stage(draft, algorithm)) is not None:
            return refused
    holder["draft"] = draft
    cfg = get_config(draft, trust_remote_code=False)
    target_cfg = get_config(target, trust_remote_code=False)
    archs = list(getattr(cfg, "architectures", None) or [])
    cls, arch = ModelRegistry.resolve_model_cls(archs)
    details.update(architectures=archs, model_class=f"{cls.__module__}.{cls.__name__}",
                   draft_model_type=getattr(cfg, "model_type", None))
    holder.update(cfg=cfg, cls=cls)
    if algorithm == "DSPARK":
        from sglang.srt.speculative.dspark_components.dspark_config import (
            get_dspark_sample_from_anchor, parse_dspark_draft_config, resolve_runtime_config)

        parsed = parse_dspark_draft_config(draft_hf_config=cfg)
        runtime = resolve_runtime_config(draft_hf_config=cfg, speculative_num_draft_tokens=None,
                                         target_vocab_size=int(target_cfg.vocab_size))
        details.update(gamma=runtime.gamma, verify_num_draft_tokens=runtime.verify_num_draft_tokens,
                       mask_token_id=runtime.mask_token_id, target_layer_ids=parsed.target_layer_ids,
                       num_target_layers=parsed.num_target_layers, markov_rank=parsed.markov_rank,
                       markov_head_type=parsed.markov_head_type,
                       sample_from_anchor=get_dspark_sample_from_anchor(cfg),
                       confidence_head_with_markov=bool(getattr(cfg, "confidence_head_with_markov",
                                                                parsed.markov_rank > 0)),
                       enable_confidence_head=getattr(cfg, "enable_confidence_head", None))
        message = (f"SGLang resolved the drafter as {arch} ({cls.__name__}); gamma {runtime.gamma}, "
                   f"speculative_num_draft_tokens {runtime.verify_num_draft_tokens} (= gamma + 1)")
    elif algorithm == "EAGLE3":
        eagle = dict(getattr(cfg, "eagle_config", None) or {})
        details.update(target_layer_ids=eagle.get("eagle_aux_hidden_state_layer_ids"),
                       draft_vocab_size=getattr(cfg, "draft_vocab_size", None))
        message = (f"SGLang resolved the drafter as {arch} ({cls.__name__}); speculative_num_steps "
                   f"{view.speculative_num_steps}, speculative_num_draft_tokens {view.speculative_num_draft_tokens}")
    else:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        parsed = parse_dflash_draft_config(draft_hf_config=cfg)
        details.update(block_size=parsed.block_size, target_layer_ids=parsed.target_layer_ids,
                       num_target_layers=parsed.num_target_layers, mask_token_id=parsed.mask_token_id)
        message = f"SGLang resolved the drafter as {arch} ({cls.__name__}); block_size {parsed.block_size}"
    return {"name": "config", "status": PASSED, "message": message, "details": details}


def _build_and_load(cls, cfg, tensors: dict):
    import torch

    import sglang.srt.layers.rotary_embedding.base as rotary_base
    from sglang.srt.runtime_context import get_parallel

    rotary_base._is_cpu = True  # the torch-native rotary path (see the module docstring)
    try:
        get_parallel().override_permanently(tp_size=1, tp_rank=0)
    except ValueError:
        pass  # already set by the first build in this process
    try:  # llama_eagle3.py:284 keeps the pipeline group; one rank on CPU
        get_parallel().override_permanently(pp_group=types.SimpleNamespace(
            is_first_rank=True, is_last_rank=True, rank_in_group=0, world_size=1))
    except ValueError:
        pass  # already set by the first build in this process
    model = cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)
    model.load_weights(iter(tensors.items()))
    return model


def _param_for(name: str):
    base = name.removeprefix("model.")
    for stacked, parts in _STACKS.items():
        for i, part in enumerate(parts):
            if f".{part}." in base:
                return base.replace(f".{part}.", f".{stacked}."), part, i
    return base, None, None


def load_weights_stage(holder: dict) -> dict:
    import torch

    cfg, cls = holder["cfg"], holder["cls"]
    tensors = _read_tensors(holder["draft"])
    eagle3 = holder.get("algorithm") == "EAGLE3"
    if eagle3:  # llama_eagle3.py reads get_spec().speculative_draft_window_size: the scheduler publishes it
        from sglang.srt.runtime_context import publish

        publish(holder["server_args"], role="scheduler")
    # llama_eagle3.py:350-356 turns d2t into hot_token_id and skips t2d; the drafter's own lm_head is a parameter;
    # embed_tokens comes from the target when the checkpoint has none (eagle_worker's set_embed)
    shared_prefixes = ("embed_tokens.",) if eagle3 else _SHARED
    read_as_buffers = {"d2t", "t2d"} if eagle3 else set()
    builds = [("static", _build_and_load(cls, cfg, tensors))]
    if getattr(cfg, "enable_confidence_head", False) and any(n.startswith("confidence_head.") for n in tensors):
        os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
        try:
            builds.append(("compact", _build_and_load(cls, cfg, tensors)))
        finally:
            os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "static"
    model = builds[-1][1]
    params = dict(model.named_parameters())
    missing = []
    for pname, p in params.items():
        data = p.detach()
        bad = torch.isnan(data) if data.is_floating_point() else data == torch.iinfo(data.dtype).min
        if bool(bad.any()) and not (eagle3 and pname.endswith("embed_tokens.weight")
                                    and not any(n.endswith("embed_tokens.weight") for n in tensors)):
            missing.append(pname)
    shared, dropped, compared, mismatched = [], [], 0, []
    for name, src in tensors.items():
        base = name.removeprefix("model.")
        if base.startswith(shared_prefixes):
            shared.append(name)
            continue
        if name in read_as_buffers:
            continue
        pname, part, index = _param_for(name)
        if pname not in params and f"model.{pname}" in params:
            pname = f"model.{pname}"
        p = params.get(pname)
        if p is None:
            dropped.append(name)
            continue
        data = p.detach()
        if part is not None:
            parts = _STACKS[pname.split(".")[-2]]
            prefix = name.rsplit(".", 2)[0]
            earlier = [tensors.get(f"{prefix}.{q}.weight") for q in parts[:index]]
            if any(t is None for t in earlier):
                continue
            offset = sum(t.shape[0] for t in earlier)
            data = data[offset:offset + src.shape[0]]
        if tuple(data.shape) != tuple(src.shape):
            mismatched.append(f"{name}: shape {list(src.shape)} in the checkpoint, {list(data.shape)} in SGLang")
            continue
        compared += 1
        if not torch.equal(data, src.to(data.dtype)):
            mismatched.append(f"{name}: values differ after loading")
    details = {"parameters": len(params), "missing": missing, "shared_from_target": shared,
               "dropped_silently": dropped, "checkpoint_tensors": len(tensors), "compared_bit_exact": compared,
               "mismatched": mismatched, "builds": [b[0] for b in builds],
               "confidence_head_loaded": any(n.startswith("confidence_head.") for n in params)}
    problems = []
    if missing:
        problems.append(f"{len(missing)} parameter(s) not set by the checkpoint (SGLang does not say so): "
                        + ", ".join(missing[:8]))
    if mismatched:
        problems.append(f"{len(mismatched)} tensor(s) did not land bit-exact: " + "; ".join(mismatched[:5]))
    if dropped:
        problems.append(f"{len(dropped)} checkpoint tensor(s) SGLang drops without a word: " + ", ".join(dropped[:8])
                        + (" (SGLang 0.5.23 has no reduced draft vocab: d2t and the draft lm_head are not read)"
                           if "d2t" in dropped else ""))
    if problems:
        return {"name": "load_weights", "status": FAILED, "message": "; ".join(problems), "details": details}
    return {"name": "load_weights", "status": PASSED, "details": details,
            "message": f"SGLang's {cls.__name__}.load_weights set all {len(params)} parameters; {compared} tensors "
                       f"compared bit-exact" + (f"; {len(shared)} shared from the target" if shared else "")}


def engine_stage(draft: str | None, target: str, algorithm: str) -> dict:
    try:
        _server_args(draft, target, algorithm, "cpu").resolve_once()
    except ValueError as exc:
        if "device" not in str(exc):
            raise
        return {"name": "engine", "status": REFUSED, "message": str(exc), "details": {"device": "cpu"}}
    return {"name": "engine", "status": PASSED, "message": "SGLang accepted the server arguments on CPU",
            "details": {"device": "cpu"}}


def run(draft: str | None, target: str, algorithm: str) -> dict:
    """All three stages; returns the JSON-serialisable report (see dsparkhub.verify.sglang.checks)."""
    import importlib.metadata

    holder: dict = {"algorithm": algorithm}
    stages = [_stage("config", lambda: config_stage(draft, target, algorithm, holder))]
    if stages[0]["status"] != PASSED:
        stages.append({"name": "load_weights", "status": SKIPPED, "message": f"the config stage {stages[0]['status']}",
                       "details": {}, "seconds": 0.0})
    elif holder["cls"].__module__.rsplit(".", 1)[-1] not in ("dspark", "dflash", "llama_eagle3"):
        stages.append({"name": "load_weights", "status": SKIPPED, "details": {}, "seconds": 0.0,
                       "message": f"SGLang resolved {holder['cls'].__name__}; this check builds only the "
                                  "DSpark / DFlash / EAGLE-3 draft classes (models/dspark.py, models/dflash.py, "
                                  "models/llama_eagle3.py) on CPU"})
    else:
        stages.append(_stage("load_weights", lambda: load_weights_stage(holder)))
    if stages[0]["status"] == REFUSED:  # SGLang has no class for the drafter: nothing for the engine to resolve
        stages.append({"name": "engine", "status": SKIPPED, "message": "SGLang does not serve this drafter",
                       "details": {}, "seconds": 0.0})
    else:
        stages.append(_stage("engine", lambda: engine_stage(draft, target, algorithm)))
    return {"draft": holder.get("draft", draft), "target": target, "algorithm": algorithm,
            "sglang_version": importlib.metadata.version("sglang"), "stages": stages}


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: sglang_child.py DRAFT|- TARGET DSPARK|DFLASH|EAGLE3   (- lets SGLang find the drafter)",
              file=sys.stderr)
        return 2
    install_placeholder()
    report = run(None if argv[1] == "-" else argv[1], argv[2], argv[3])
    sys.stdout.write("\n@@DSPARKHUB-REPORT@@" + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
