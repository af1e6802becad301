"""The tensors a target manifest describes: names, safetensors dtypes and shapes of its checkpoint (and of the
DeepSeek-V4 DSpark stages shipped inside it), at real size or at tiny dimensions, and their check against
transformers' own model class (:func:`meta_check`).

Tensor lists come from the manifest:

- ``checkpoint.source: templates``: ``head`` / ``per_layer`` (``{i}`` over the layers, optional ``repeat: {e: E}``
  and ``when``) / ``tail`` entries with shapes in the manifest's symbols (``H``, ``V``, ``L`` and ``vars``);
- ``checkpoint.source: transformers``: the model class named by ``checkpoint.class`` built on the ``meta`` device
  from the manifest's config (transformers 5.19), whose state-dict names are the checkpoint names (Qwen3).

Does not write anything (:mod:`dsparkhub.skeleton` lays the tensors out in shards) or download anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from dsparkhub.errors import ManifestError
from dsparkhub.io.header import DTYPE_BITS
from dsparkhub.layouts.families import evaluate
from dsparkhub.layouts.manifests import TargetManifest, get_manifest

__all__ = ["META_CLASSES", "MetaCheck", "SkeletonTensor", "meta_check", "skeleton_tensors", "tiny_manifest",
           "v4_drafter_tensors"]


@dataclass(frozen=True)
class SkeletonTensor:
    """One tensor of a skeleton: checkpoint name, safetensors dtype code, shape, bytes of its data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = -1

    def __post_init__(self):
        if self.nbytes < 0:
            object.__setattr__(self, "nbytes", (math.prod(self.shape) * DTYPE_BITS[self.dtype] + 7) // 8)


def _names(m: TargetManifest) -> dict:
    names = {"H": m.hidden_size, "L": m.num_hidden_layers, "V": m.vocab_size}
    for k, v in (m.checkpoint.get("vars") or {}).items():
        names[k] = evaluate(v, names)
    return names


def _expand(entries, names: dict, extra: dict | None = None) -> list[SkeletonTensor]:
    scope = {**names, **(extra or {})}
    ints = {k: v for k, v in scope.items() if isinstance(v, int)}
    out = []
    for e in entries or []:
        if not evaluate(e.get("when", "1"), scope):
            continue
        reps = e.get("repeat") or {}
        if not reps:
            out.append(SkeletonTensor(e["name"].format(**ints), e["dtype"],
                                      tuple(evaluate(x, scope) for x in e["shape"])))
            continue
        ((var, count),) = reps.items()
        # the shape rarely depends on the repeat variable (experts); evaluate it once when it does not
        depends = any(var in str(x) for x in e["shape"])
        shape = None if depends else tuple(evaluate(x, {**scope, var: 0}) for x in e["shape"])
        stem = e["name"].replace("{" + var + "}", "\x00").format(**ints)
        for j in range(evaluate(count, scope)):
            out.append(SkeletonTensor(stem.replace("\x00", str(j)), e["dtype"],
                                      shape or tuple(evaluate(x, {**scope, var: j}) for x in e["shape"])))
    return out


def _from_transformers(m: TargetManifest) -> list[SkeletonTensor]:
    import torch
    import transformers

    ck = m.checkpoint
    cls = getattr(transformers, ck["class"])
    cfg_cls = getattr(transformers, ck["class"].replace("ForCausalLM", "Config"))
    cfg = cfg_cls(**{**m.config, "hidden_size": m.hidden_size, "num_hidden_layers": m.num_hidden_layers,
                     "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied})
    with torch.device("meta"):
        model = cls(cfg)
    dtype = ck.get("dtype", "BF16")
    # named_parameters lists a tied LM head once, under the embedding's name, as save_pretrained stores it
    unique = set(dict(model.named_parameters()))
    return [SkeletonTensor(n, dtype, tuple(p.shape)) for n, p in model.state_dict().items()
            if n in unique or not m.tied]


def skeleton_tensors(m: TargetManifest | str) -> list[SkeletonTensor]:
    """Every tensor of ``m``'s checkpoint, in file order.

    Raises:
        ManifestError: the manifest has no tensor layout (``checkpoint.source`` missing or ``none``), or a template
            names an unknown symbol.
    """
    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    ck = m.checkpoint or {}
    source = ck.get("source", "none")
    if source == "transformers":
        return _from_transformers(m)
    if source != "templates":
        raise ManifestError(f"target manifest {m.name!r} has no checkpoint tensor layout (checkpoint.source is "
                            f"{source!r})", path=m.path, hint="add `checkpoint.source: templates` with head / "
                                                              "per_layer / tail entries")
    names = _names(m)
    try:
        out = _expand(ck.get("head"), names)
        for i in range(m.num_hidden_layers):
            out += _expand(ck.get("per_layer"), names, {"i": i})
        out += _expand(ck.get("tail"), names)
    except (KeyError, ValueError) as exc:
        raise ManifestError(f"checkpoint templates of {m.name!r}: {exc}", path=m.path) from None
    seen = set()
    for t in out:
        if t.name in seen:
            raise ManifestError(f"checkpoint templates of {m.name!r} produce tensor {t.name!r} twice", path=m.path)
        seen.add(t.name)
    return out


def tiny_manifest(m: TargetManifest | str, *, hidden: int = 256, layers: int = 3, vocab: int = 512,
                  **var_overrides) -> TargetManifest:
    """``m`` at tiny dimensions: hidden ``hidden``, ``layers`` layers, vocab ``vocab``, and the manifest's
    ``checkpoint.tiny`` var overrides (experts, heads, ranks small enough for random data), plus ``var_overrides``.
    Shapes stay expressions of these symbols, so the structure (names, dtypes, experts per layer) is the real one."""
    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    ck = dict(m.checkpoint)
    ck["vars"] = {**(ck.get("vars") or {}), **(ck.get("tiny") or {}), **var_overrides}
    ck["shards"] = min(int(ck.get("shards", 1)), max(1, layers))
    embed = replace(m.embed, shape=(vocab, hidden))
    head = replace(m.lm_head, shape=(vocab, hidden))
    drafter = dict(m.drafter_defaults)
    ids = drafter.get("target_layer_ids")
    if ids:
        drafter["target_layer_ids"] = sorted({min(max(i, 0), layers - 2) for i in ids})
    if drafter.get("mask_token_id") is not None and drafter["mask_token_id"] >= vocab:
        drafter["mask_token_id"] = vocab - 1  # the noise token must lie in the tiny vocab
    cfg = {k: v for k, v in m.config.items()}
    for k in ("hidden_size", "num_hidden_layers", "vocab_size"):
        cfg.pop(k, None)
    cfg.update({k: v for k, v in (ck.get("tiny_config") or {}).items()})
    return replace(m, name=m.name + "-tiny", hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
                   embed=embed, lm_head=head, checkpoint=ck, drafter_defaults=drafter, config=cfg)

def v4_drafter_tensors(m: TargetManifest) -> list[SkeletonTensor]:
    """The ``mtp.{0..S-1}.*`` stages of a DeepSeek-V4 DSpark drafter for manifest ``m``: each stage is one of the
    target's decoder layers (the manifest's ``per_layer`` templates) under ``mtp.{s}.``; the last stage also holds
    ``main_proj`` [H, A*H], ``main_norm``, ``norm``, ``hc_head_*``, the Markov head [V, r] x 2 and the bias-less
    F32 confidence head [1, H + r] that vLLM 0.32 builds (``DSparkConfidenceHead(hidden_size + dspark_markov_rank)``,
    vllm/models/deepseek_v4/nvidia/dspark.py:152-156; FORMATS §6's [1, H] is a head over h alone, which vLLM's V4
    class cannot load).

    Raises:
        ManifestError: the manifest has no ``drafter_defaults.stages`` or no templates.
    """
    dd = m.drafter_defaults or {}
    stages, r, ids = dd.get("stages"), dd.get("markov_rank"), dd.get("target_layer_ids")
    if not stages or not r or not ids or (m.checkpoint or {}).get("source") != "templates":
        raise ManifestError(f"manifest {m.name!r} does not describe an attached drafter (drafter_defaults.stages / "
                            "markov_rank / target_layer_ids and checkpoint templates needed)", path=m.path)
    names = _names(m)
    out: list[SkeletonTensor] = []
    for sidx in range(stages):
        # stage s is built as decoder layer L + s: DeepSeek numbers its MTP layers after the main ones (V3:
        # `model.layers.61` for 61 layers), so per-layer conditions (hash-routed first layers) read the same for
        # every stage and the stages hold the same parameters
        i = m.num_hidden_layers + sidx
        for t in _expand(m.checkpoint.get("per_layer"), names, {"i": i}):
            out.append(SkeletonTensor(t.name.replace(f"layers.{i}.", f"mtp.{sidx}.", 1), t.dtype, t.shape,
                                      t.nbytes))
    last = f"mtp.{stages - 1}."
    H, V, hc = m.hidden_size, m.vocab_size, int(names.get("hc", 4))
    out += [SkeletonTensor(last + "main_proj.weight", "BF16", (H, len(ids) * H)),
            SkeletonTensor(last + "main_norm.weight", "BF16", (H,)),
            SkeletonTensor(last + "norm.weight", "BF16", (H,)),
            SkeletonTensor(last + "hc_head_fn", "F32", (hc, hc * H)),
            SkeletonTensor(last + "hc_head_base", "F32", (hc,)),
            SkeletonTensor(last + "hc_head_scale", "F32", (1,)),
            SkeletonTensor(last + "markov_head.markov_w1.weight", "BF16", (V, r)),
            SkeletonTensor(last + "markov_head.markov_w2.weight", "BF16", (V, r)),
            SkeletonTensor(last + "confidence_head.proj.weight", "F32", (1, H + r))]
    return out

# ---- checking a manifest against transformers' own model class ------------------------------------------------


#: transformers 5.19 classes that build a target of a manifest ``model_type`` (for :func:`meta_check`).
META_CLASSES = {"qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
                "deepseek_v4": ("DeepseekV4ForCausalLM", "DeepseekV4Config"),
                "kimi_k25": ("Kimi_K25ForConditionalGeneration", None)}


@dataclass
class MetaCheck:
    """How a manifest's checkpoint tensors compare with transformers' own model class built on the ``meta`` device.

    Attributes:
        model_class: the transformers class used.
        matched: checkpoint names whose renamed HF name exists with the same shape.
        merged: checkpoint names that transformers merges into a fused tensor (experts); existence checked only.
        mismatched: ``(checkpoint name, manifest shape, HF shape)`` for shape disagreements.
        unmapped: checkpoint names with no HF counterpart (quantization side tensors such as ``.scale``).
    """

    model_class: str
    matched: list = field(default_factory=list)
    merged: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    unmapped: list = field(default_factory=list)


def meta_check(m: TargetManifest | str, *, layers: int | None = 2) -> MetaCheck:
    """Compare ``m``'s checkpoint tensor names / shapes with transformers 5.19's model class on the ``meta`` device.

    Checkpoint names are mapped to HF names with transformers' own ``conversion_mapping`` (``rename_source_key``),
    exactly as ``from_pretrained`` would; the model is built from the manifest's geometry and ``config`` (with
    ``layers`` decoder layers to keep it quick: every layer has the same tensors). Costs no memory (meta tensors).

    Raises:
        ManifestError: no transformers class for the manifest's model type, or no tensor layout.
    """
    import dataclasses

    import torch
    import transformers
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    m = m if isinstance(m, TargetManifest) else get_manifest(m)
    if m.model_type not in META_CLASSES:
        raise ManifestError(f"no transformers class to check manifest {m.name!r} (model_type {m.model_type!r})")
    cls_name, cfg_name = META_CLASSES[m.model_type]
    geometry = {"hidden_size": m.hidden_size, "num_hidden_layers": layers or m.num_hidden_layers,
                "vocab_size": m.vocab_size, "tie_word_embeddings": m.tied}
    text = {k: v for k, v in m.config.items() if not k.startswith("num_mla") and not k.startswith("num_kda")}
    if m.model_type == "kimi_k25":
        from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config

        cfg = Kimi_K25Config(text_config={**text, **geometry, "model_type": "deepseek_v3"})
    else:
        cfg = getattr(transformers, cfg_name)(**{**text, **geometry})
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg)
    hf = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    mapping = get_checkpoint_conversion_mapping(m.model_type) or []
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    small = dataclasses.replace(m, num_hidden_layers=layers or m.num_hidden_layers)
    out = MetaCheck(cls_name)
    for t in skeleton_tensors(small):
        name, conv = rename_source_key(t.name, renamings, converters, model.base_model_prefix, hf)
        if conv is not None:
            (out.merged if name in hf else out.unmapped).append(t.name)
        elif name not in hf:
            out.unmapped.append(t.name)
        elif hf[name] != t.shape:
            out.mismatched.append((t.name, list(t.shape), list(hf[name])))
        else:
            out.matched.append(t.name)
    return out
