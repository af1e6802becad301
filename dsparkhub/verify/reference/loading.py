"""From a drafter on disk to a filled :class:`~dsparkhub.verify.reference.modeling.Drafter`.

The layout recipes (``dsparkhub.layouts.recipes``) are the one reader of drafter configs: :func:`load_drafter` opens
the folder with :func:`~dsparkhub.layouts.reading.open_draft`, turns the :class:`~dsparkhub.layouts.spec.DraftSpec`
into a :class:`DrafterConfig` (:func:`drafter_config_from_spec`) and reads the tensors through
``dsparkhub.io.checkpoint`` (the same header checks and shard-path policy as ``convert`` and ``validate``), under the
spec's canonical names (vLLM 0.32 / DeepSpec checkpoint names).

What the reference drafter implements: Qwen3-backbone DSpark and DFlash drafters (DeepSpec, ``convert --to vllm``,
``convert --to speculators`` and z-lab layouts: the recipe gives the same spec for each, the speculators one with its
``aux_hidden_state_layer_ids`` turned into layer-index numbering), and single-layer Llama / Qwen3 EAGLE-3 drafters
(speculators / TorchSpec layouts, :class:`~dsparkhub.verify.reference.eagle3.Eagle3Drafter`). Refused with
:class:`~dsparkhub.errors.LayoutError`: other families (Gemma4 / K3 / DeepSeek-V4), DFlash2, multi-layer EAGLE-3,
attention-sink bias, interleaved (non-neox) RoPE and non-default RoPE scaling.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, IncompatibleTargetError, LayoutError
from dsparkhub.io.checkpoint import Checkpoint
from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.layouts.causality import vllm_causality
from dsparkhub.layouts.reading import OpenedDraft, open_draft, spec_from_config
from dsparkhub.layouts.spec import ANCHOR_FIRST, DraftSpec
from dsparkhub.verify.reference.drafter_config import DrafterConfig, LayerAttention
from dsparkhub.verify.reference.eagle3 import Eagle3Drafter, Eagle3Options
from dsparkhub.verify.reference.modeling import Drafter

__all__ = ["drafter_config_from_spec", "drafter_config_of", "eagle3_from_spec", "resolve_layer_attention",
           "load_drafter"]

_SLIDING = "sliding_attention"
#: the variants the reference drafter computes (DraftSpec.variant)
_VARIANTS = ("dspark", "dflash")


def drafter_config_of(config: dict, *, layout: str | None = None) -> DrafterConfig:
    """:func:`drafter_config_from_spec` of ``reading.spec_from_config`` (a config dict -> the drafter's numerics)."""
    return drafter_config_from_spec(spec_from_config(config, layout=layout))


def _rope_theta(decoder: dict, path) -> float:
    params = decoder.get("rope_parameters") or decoder.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if rope_type not in ("default", None):
        raise LayoutError(f"RoPE type {rope_type!r} is not supported by the reference drafter (only 'default')",
                          path=path)
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is None:
        theta = decoder.get("rope_theta", 1_000_000.0)  # vLLM set_default_rope_theta(default_theta=1e6)
    return float(theta)


def resolve_layer_attention(spec: DraftSpec, *, path: str | Path | None = None) -> tuple[LayerAttention, ...]:
    """Per-layer (sliding window, causal) of a Qwen3 DSpark / DFlash drafter, resolved as vLLM 0.32 resolves it.

    vLLM reads the drafter config through transformers' ``Qwen3Config``, which drops ``sliding_window`` unless
    ``use_sliding_window`` is true and fills ``layer_types`` (sliding from ``max_window_layers`` on) when absent
    (transformers ``models/qwen3/configuration_qwen3.py:87-95``); then ``qwen3_dflash.py`` decides per layer:

    - sliding: ``layer_types[i] == "sliding_attention"``; ``dflash_config.use_swa`` (DraftSpec extra ``use_swa``)
      makes every layer sliding when no layer is (``_resolve_layer_attention``, lines 145-167). Window:
      ``dflash_config.swa_window_size``, else the (transformers-filtered) ``sliding_window`` (lines 169-178).
    - causal: :attr:`DraftSpec.causal`, read by ``dsparkhub.layouts.causality`` (``is_causal``, else
      ``dflash_config.causal``, else "this layer is sliding"; ``_dflash_layer_causal``, lines 86-97); for a layout
      whose recipe states no causality rule (DeepSpec), the same vLLM rule over its decoder keys.

    Mixed sliding / full layers are resolved too (vLLM's V2 model runner serves them; V1 refuses, line 152).

    Args:
        spec: the drafter, as the recipes read it.
        path: the config file, for error messages.

    Returns:
        One :class:`LayerAttention` per draft layer.

    Raises:
        LayoutError: a sliding layer without a window size, a window that is not a positive int, or an attention
            sink bias (``dflash_config.attention_sink_bias`` / ``add_swa_attention_sink_bias``), which the
            reference drafter does not implement.
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import Qwen3Config

    decoder, extras = spec.decoder_config, spec.extras
    if extras.get("attention_sink_bias", decoder.get("add_swa_attention_sink_bias", False)):
        raise LayoutError("attention-sink bias draft layers (dflash_config.attention_sink_bias) are not supported "
                          "by the reference drafter", path=path, hint="measure this drafter with --backend vllm")
    keys = {k: decoder[k] for k in ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
            if k in decoder}
    keys["num_hidden_layers"] = spec.num_layers
    try:
        hf = Qwen3Config(**keys)  # transformers' own defaults and filtering, as vLLM sees the config
    except (ValueError, TypeError, StrictDataclassError) as exc:  # transformers validates configs with these
        raise LayoutError(f"draft attention keys {sorted(keys)} are not a valid Qwen3 config: {exc}",
                          path=path) from exc
    layer_types = list(hf.layer_types or [])
    if len(layer_types) != spec.num_layers:
        raise LayoutError(f"layer_types has {len(layer_types)} entries, expected num_hidden_layers = "
                          f"{spec.num_layers}", path=path)
    causal = spec.causal if spec.causal is not None else vllm_causality(decoder, decoder, spec.num_layers)
    any_sliding = any(t == _SLIDING for t in layer_types)
    use_swa = bool(extras.get("use_swa", False))
    window = extras.get("swa_window_size", hf.sliding_window)
    out = []
    for i, layer_type in enumerate(layer_types):
        sliding = use_swa if (use_swa and not any_sliding) else layer_type == _SLIDING
        if sliding and window is None:
            raise LayoutError(
                f"draft layer {i} is sliding_attention but no window size is set: vLLM 0.32 reads "
                "dflash_config.swa_window_size, else sliding_window (which transformers' Qwen3Config keeps only "
                "with use_sliding_window: true)", path=path,
                hint="set use_sliding_window: true next to sliding_window in config.json")
        if sliding and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise LayoutError(f"sliding window must be a positive int, found {window!r}", path=path)
        out.append(LayerAttention(sliding_window=int(window) if sliding else None, causal=bool(causal[i])))
    return tuple(out)


def _int_key(decoder: dict, key: str, path, default=None) -> int:
    value = decoder.get(key)
    if value is None and default is not None:
        return default
    if type(value) is not int:
        raise LayoutError(f"config key `{key}` missing or not an int (found {value!r})", path=path)
    return value


def drafter_config_from_spec(spec: DraftSpec, *, path: str | Path | None = None) -> DrafterConfig:
    """The reference drafter's :class:`DrafterConfig` of a :class:`DraftSpec`.

    Everything comes from the spec: variant, block size and layout (anchor-first = vLLM ``sample_from_anchor``),
    target layer ids (layer-index numbering), mask token, vocabularies, Markov / confidence heads, and the Qwen3
    backbone keys of :attr:`DraftSpec.decoder_config` (heads, head_dim, intermediate_size, eps, RoPE, activation,
    ``logit_scale``, ``attention_bias``).

    Raises:
        LayoutError: a family or variant the reference drafter does not implement, no mask token, a missing backbone
            key, or a draft-attention option it does not implement (attention sinks,
            interleaved RoPE; see :func:`resolve_layer_attention`).
    """
    if spec.extras.get("no_rope_layers"):
        raise LayoutError(f"{spec.architecture} declares NoPE layers no_rope_layers={spec.extras['no_rope_layers']} "
                          "(vLLM 0.34 ricursive_dflash2.py); the reference drafter applies RoPE in every layer and "
                          "computes no DFlash2, so it would measure another model", path=path,
                          hint="measure it with --backend vllm on vLLM 0.34")
    if spec.family != "qwen3" or spec.variant not in _VARIANTS:
        raise LayoutError(f"{spec.architecture} is a {spec.family} {spec.variant} drafter; the reference drafter "
                          f"computes Qwen3 DSpark / DFlash drafters only", path=path,
                          hint="expected Qwen3DSparkModel or DFlashDraftModel; measure others with --backend vllm")
    if spec.architecture == "DSparkDraftModel" and spec.decoder_config.get("model_type") != "qwen3":
        # validate DSH115: vLLM 0.32 renames the legacy class to Qwen3DSparkModel for model_type qwen3 only
        raise LayoutError(f"architectures ['DSparkDraftModel'] with model_type "
                          f"{spec.decoder_config.get('model_type')!r}: vLLM 0.32 loads it as DeepSeek-V4, not as the "
                          "Qwen3 drafter the reference engine computes", path=path,
                          hint="`dsparkhub convert` writes architectures [\"Qwen3DSparkModel\"]")
    if spec.variant == "dflash" and spec.extras.get("sample_from_anchor"):
        raise LayoutError("dflash_config.sample_from_anchor=true is not supported for DFlash (vLLM refuses it)",
                          path=path)
    decoder = spec.decoder_config
    if not decoder.get("is_neox_style", True):
        raise LayoutError("is_neox_style: false (interleaved RoPE) is not supported by the reference drafter",
                          path=path)
    if spec.mask_token_id is None:
        raise LayoutError("drafter config has no mask token: expected `dflash_config.mask_token_id`, `mask_token_id`, "
                          "`dspark_noise_token_id`, `pard_token` or `ptd_token_id`", path=path)
    heads = _int_key(decoder, "num_attention_heads", path)
    intermediate = _int_key(decoder, "intermediate_size", path)
    value_scale = spec.extras.get("attention_value_scale")
    markov_rank = spec.markov_rank if spec.variant == "dspark" else 0
    enable_conf = spec.confidence_head if spec.variant == "dspark" else False
    return DrafterConfig(
        kind=spec.variant,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(decoder.get("num_key_value_heads") or heads),
        head_dim=int(decoder.get("head_dim") or spec.hidden_size // heads),
        intermediate_size=intermediate,
        vocab_size=spec.vocab_size,
        draft_vocab_size=spec.draft_vocab_size,
        target_hidden_size=spec.target_hidden_size,
        target_layer_ids=tuple(spec.target_layer_ids),
        mask_token_id=spec.mask_token_id,
        block_size=spec.block_size,
        sample_from_anchor=spec.block_layout == ANCHOR_FIRST,
        markov_rank=markov_rank,
        enable_confidence_head=enable_conf,
        confidence_head_with_markov=spec.confidence_head_with_markov and enable_conf,
        rms_norm_eps=float(decoder.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(decoder, path),
        hidden_act=str(decoder.get("hidden_act", "silu")),
        logit_scale=float(decoder.get("logit_scale", 1.0)),
        attention_bias=bool(decoder.get("attention_bias", False)),
        layer_attention=resolve_layer_attention(spec, path=path),
        value_scale=float(value_scale) if value_scale is not None else None,
    )


def eagle3_from_spec(spec: DraftSpec, *, path: str | Path | None = None) -> Eagle3Drafter:
    """An empty :class:`Eagle3Drafter` for an ``eagle3`` :class:`DraftSpec` (speculators / TorchSpec layouts).

    Geometry from :attr:`DraftSpec.decoder_config` (``transformer_layer_config``); switches from the spec's extras
    (``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``); ``q_norm`` / ``k_norm`` when the
    checkpoint holds them (a Qwen3 layer). Sliding window: ``layer_types[0] == "sliding_attention"`` with
    ``sliding_window`` (speculators ``Eagle3DraftModel.__init__``; a Qwen3 layer needs ``use_sliding_window``).

    Raises:
        LayoutError: more than one decoder layer, a missing backbone key, non-default RoPE or a bad window.
    """
    decoder = spec.decoder_config
    if spec.num_layers != 1:
        raise LayoutError(f"EAGLE-3 drafter with {spec.num_layers} decoder layers: the reference engine computes "
                          "single-layer EAGLE-3 drafters only", path=path, hint="measure it with --backend vllm")
    heads = _int_key(decoder, "num_attention_heads", path)
    window = None
    layer_types = decoder.get("layer_types") or []
    if layer_types and layer_types[0] == _SLIDING and (decoder.get("model_type") != "qwen3"
                                                         or decoder.get("use_sliding_window")):
        window = decoder.get("sliding_window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise LayoutError(f"layer 0 is sliding_attention but sliding_window is {window!r}, expected a positive "
                              "int", path=path)
    cfg = DrafterConfig(
        kind="eagle3", hidden_size=spec.hidden_size, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=int(decoder.get("num_key_value_heads") or heads),
        head_dim=int(decoder.get("head_dim") or spec.hidden_size // heads),
        intermediate_size=_int_key(decoder, "intermediate_size", path), vocab_size=spec.vocab_size,
        draft_vocab_size=spec.draft_vocab_size, target_hidden_size=spec.target_hidden_size,
        target_layer_ids=tuple(spec.target_layer_ids), mask_token_id=0, block_size=spec.block_size or None,
        sample_from_anchor=True, rms_norm_eps=float(decoder.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(decoder, path), hidden_act=str(decoder.get("hidden_act", "silu")),
        logit_scale=float(decoder.get("logit_scale", 1.0)), attention_bias=bool(decoder.get("attention_bias", False)),
        layer_attention=(LayerAttention(sliding_window=window, causal=True),))
    extras = spec.extras
    options = Eagle3Options(norm_before_residual=bool(extras.get("norm_before_residual", False)),
                            norm_before_fc=bool(extras.get("norm_before_fc", False)),
                            fc_norm=bool(extras.get("fc_norm", False)),
                            norm_output=bool(extras.get("norm_output", False)),
                            qk_norm="layers.0.self_attn.q_norm.weight" in spec.tensors)
    return Eagle3Drafter(cfg, options)


def _read_weights(ckpt: Checkpoint, spec: DraftSpec) -> dict[str, torch.Tensor]:
    """The spec's tensors under their canonical names, one ``safe_open`` per shard (headers already checked by
    ``open_checkpoint``: shard paths inside the folder, no overlaps, sizes).

    Raises:
        CheckpointFormatError: a shard that safetensors cannot read.
    """
    from safetensors import SafetensorError, safe_open

    by_file: dict[str, list[str]] = defaultdict(list)
    for name, info in spec.tensors.items():
        by_file[info.file].append(name)
    out: dict[str, torch.Tensor] = {}
    for file, names in sorted(by_file.items()):
        try:
            with safe_open(str(ckpt.file_path(file)), framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(spec.source_names.get(name, name))
        except SafetensorError as exc:
            raise CheckpointFormatError(f"unreadable safetensors: {exc}", path=ckpt.file_path(file)) from exc
    return out


def _target_embed_head(target_model) -> tuple[torch.Tensor | None, torch.Tensor | None, int, int, int]:
    cfg = target_model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    emb = target_model.get_input_embeddings().weight
    head_mod = target_model.get_output_embeddings()
    head = head_mod.weight if head_mod is not None else None
    return emb, head, int(cfg.vocab_size), int(cfg.hidden_size), int(cfg.num_hidden_layers)


def _check_names(drafter: Drafter, tensors: dict, folder) -> None:
    """Raise one LayoutError listing every missing, unexpected and misshapen tensor."""
    cfg = drafter.config
    expected = drafter.state_dict()
    optional = {"embed_tokens.weight", "lm_head.weight"}
    if drafter.confidence_head is not None:
        optional |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    ignored = {n for n in tensors if n == "t2d" or n.endswith(".t2d") or n == "mask_embedding"}
    missing = sorted(n for n in expected if n not in tensors and n not in optional)
    unexpected = sorted(n for n in tensors if n not in expected and n not in ignored)
    misshapen = sorted(f"{n}: {list(tensors[n].shape)} != expected {list(expected[n].shape)}"
                       for n in expected if n in tensors and tensors[n].shape != expected[n].shape)
    if missing or unexpected or misshapen:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected}")
        if misshapen:
            parts.append(f"wrong shapes {misshapen}")
        raise LayoutError(f"{cfg.kind} drafter weights do not match its config: " + "; ".join(parts), path=folder)


def _check_target(cfg: DrafterConfig, tensors: dict, target_model, config_path) -> None:
    """Raise IncompatibleTargetError when the target cannot feed the drafter (layers, hidden size, vocab)."""
    emb, head, t_vocab, t_hidden, t_layers = _target_embed_head(target_model)
    bad = [i for i in cfg.target_layer_ids if not -1 <= i < t_layers]
    if bad:
        raise IncompatibleTargetError(
            f"target_layer_ids {list(cfg.target_layer_ids)} (layer-index numbering) reference layers {bad} the "
            f"target does not have (it has {t_layers} layers, valid ids -1..{t_layers - 1})", path=config_path)
    if cfg.target_hidden_size != t_hidden:
        raise IncompatibleTargetError(
            f"drafter expects target hidden size {cfg.target_hidden_size}, the target has {t_hidden}",
            path=config_path)
    if cfg.vocab_size > t_vocab and "embed_tokens.weight" not in tensors:
        raise IncompatibleTargetError(
            f"drafter input vocab {cfg.vocab_size} > target vocab {t_vocab} and no embed_tokens.weight",
            path=config_path)


def load_drafter(folder: str | Path | OpenedDraft, target_model=None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Load a drafter from a DeepSpec step / run dir, a dsparkhub-converted vLLM- or speculators-layout folder or a
    z-lab DFlash folder.

    Args:
        folder: the drafter folder (a DeepSpec run dir resolves to ``step_latest``; ``resolve_step_dir``), or the
            drafter already opened (``dsparkhub.layouts.reading.open_draft``; its headers are not read again).
        target_model: the transformers target (``PreTrainedModel``); required when the checkpoint lacks
            ``embed_tokens`` / ``lm_head`` (they are then shared with the target, as vLLM ``load_dspark_model`` does).
        dtype: parameter dtype (the confidence head stays float32, as in vLLM).
        device: where to put the drafter.

    Returns:
        An eval-mode :class:`Drafter` whose ``source`` is the resolved folder.

    Raises:
        CheckpointNotFoundError: folder, config or weights missing.
        CheckpointFormatError: invalid JSON or safetensors.
        UnsafeCheckpointError: pickle-only weights, shards escaping the folder.
        LayoutError: unknown layout, a drafter the reference does not implement (see
            :func:`drafter_config_from_spec`), or missing / unexpected / misshapen tensors (all listed).
        IncompatibleTargetError: the target cannot feed this drafter (layers, hidden size, vocab).
    """
    if isinstance(folder, OpenedDraft):
        opened = folder
    else:
        folder = resolve_step_dir(folder)  # the one run-folder resolver (issue 14)
        if not (folder / "config.json").is_file():
            raise CheckpointNotFoundError(f"no config.json (and no DeepSpec step_latest link) in {folder}",
                                          path=folder, hint="pass the drafter folder, a DeepSpec step folder or its "
                                                            "run folder")
        opened = open_draft(folder)
    ckpt, spec = opened.checkpoint, opened.spec
    folder = Path(ckpt.path)
    config_path = folder / "config.json"
    if spec.variant == "eagle3":
        drafter = eagle3_from_spec(spec, path=config_path)
        cfg = drafter.config
    else:
        cfg = drafter_config_from_spec(spec, path=config_path)
        drafter = Drafter(cfg)
    tensors = _read_weights(ckpt, spec)
    _check_names(drafter, tensors, folder)
    if target_model is not None:
        _check_target(cfg, tensors, target_model, config_path)
    with torch.no_grad():
        for name, param in drafter.state_dict().items():
            if name in tensors:
                param.copy_(tensors[name].to(param.dtype))
    drafter.to(device=device, dtype=dtype)
    if drafter.confidence_head is not None:
        if "confidence_head.proj.weight" not in tensors:
            drafter.confidence_head = None  # vLLM drops an enabled head whose weights are absent
        else:
            drafter.confidence_head.float()
    for name, attr in (("embed_tokens.weight", "embed_tokens"), ("lm_head.weight", "lm_head")):
        if name in tensors:
            continue
        if target_model is None:
            raise LayoutError(f"checkpoint has no {name}; pass the target model to share the target's", path=folder)
        emb, head, *_ = _target_embed_head(target_model)
        source = emb if attr == "embed_tokens" else head
        want = list(getattr(drafter, attr).weight.shape)
        if source is None or list(source.shape) != want:
            raise IncompatibleTargetError(
                f"checkpoint has no {name} and the target's {attr} has shape "
                f"{None if source is None else list(source.shape)}, expected {want}", path=folder)
        getattr(drafter, attr).weight = nn.Parameter(source.detach().to(device=device, dtype=dtype),
                                                     requires_grad=False)
    drafter.source = str(folder)
    return drafter.eval()
