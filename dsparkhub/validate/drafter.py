"""Rules on the drafter alone: its config vs its tensors, the layout's own rules, stage names, ``d2t``."""

from __future__ import annotations

import re
from pathlib import Path

from dsparkhub.layouts.families import expected_tensors, markov_head_types
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.layouts.spec import ANCHOR_FIRST, DraftSpec
from dsparkhub.validate.report import Collector
from dsparkhub.validate.sidecar import check_sidecar


def check_intrinsic(d: OpenedDraft, out: Collector) -> None:
    """Every rule on the drafter alone that depends on its files only (not on n, the engine or the folder's name:
    :mod:`dsparkhub.validate.settings`)."""
    spec, cfg = d.spec, d.checkpoint.config
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    if spec.block_size <= 0:
        out.add("DSH104", "block size must be a positive integer", location=cfg_file, expected="> 0",
                found=spec.block_size)
    w1 = spec.tensors.get("markov_head.markov_w1.weight")
    if spec.markov_rank == 0 and w1 is not None:
        out.add("DSH101", "Markov head tensors ship but the config gives no Markov rank (vLLM 0.32 qwen3_dspark.py "
                "reads `markov_rank` unconditionally)", location=f"{cfg_file} key markov_rank",
                expected=f"markov_rank: {w1.shape[-1]} (markov_w1 is {list(w1.shape)})", found="absent or 0",
                hint="add markov_rank to config.json")
    learned_mask = bool(d.recipe.data.get("learned_mask_embedding"))  # Mistral Large 4: out-of-vocab sentinel
    if spec.mask_token_id is None and spec.variant != "eagle3" and not learned_mask:  # EAGLE-3: no mask slots
        out.add("DSH102", "no mask token: vLLM needs one of dflash_config.mask_token_id, mask_token_id, "
                "dspark_noise_token_id, pard_token, ptd_token_id", location=cfg_file,
                hint="set mask_token_id to the token the drafter was trained with in the masked slots")
    elif spec.mask_token_id is not None and not 0 <= spec.mask_token_id < spec.vocab_size:
        out.add("DSH102", "mask token id is outside the drafter's input vocab", location=f"{cfg_file} key mask_token_id",
                expected=f"0 <= id < {spec.vocab_size}", found=spec.mask_token_id)
    ids = spec.target_layer_ids
    if any(b <= a for a, b in zip(ids, ids[1:])):
        out.add("DSH103", "target layer ids must be strictly increasing without duplicates",
                location=f"{cfg_file} key target_layer_ids", found=ids)
    served_heads = markov_head_types(spec)
    if spec.variant == "dspark" and spec.markov_head_type not in (None, *served_heads):
        out.add("DSH105", f"Markov head type {spec.markov_head_type!r}: vLLM serves a {spec.family} drafter with "
                f"the {' / '.join(served_heads)} head only (the recurrent rnn head: Mistral Large 4, vLLM 0.34) and "
                "would fail on its extra tensors", location=f"{cfg_file} key markov_head_type",
                expected=" | ".join(served_heads), found=spec.markov_head_type)
    # A config without the key is read by vLLM's native reader (the speculators reader reads speculators configs,
    # DSH113 below), whose default is true (vLLM 0.32 spec_decode/dspark/speculator.py): harmless for an
    # anchor-first drafter (DeepSpec, TorchSpec: their recipes fix the layout), wrong for a 1+N one.
    if spec.variant == "dspark" and "sample_from_anchor" not in cfg and spec.block_layout != ANCHOR_FIRST \
            and not (d.recipe.typed.served_through_speculators or d.recipe.typed.own_block_layout_reader):
        out.add("DSH106", f"sample_from_anchor is implicit; this {spec.block_layout} drafter would be read "
                "anchor-first by vLLM's native reader (default true)", location=cfg_file,
                expected="sample_from_anchor: false", found="absent",
                hint="`dsparkhub convert` writes it explicitly")
    # DSH107 (the folder's name) is a rule of the path, not of the files: dsparkhub.validate.settings
    check_layout_rules(d, out)
    expected, open_layers = expected_tensors(spec)
    shapes = {e.name: e.shape for e in expected}
    optional = {e.name for e in expected if e.optional}
    present = spec.tensors
    for name, shape in shapes.items():
        if name not in present:
            if name not in optional:
                layout_name = d.recipe.to_layout(name, num_layers=spec.num_layers)
                shipped_as = f" (`{layout_name}` in this checkpoint's layout)" if layout_name != name else ""
                out.add("DSH201", f"tensor {name!r} is missing{shipped_as}", location=f"tensor {name}",
                        expected=list(shape) if shape is not None else "present",
                        hint="vLLM 0.32 does not report missing DSpark tensors; the drafter would run on "
                             "uninitialised memory")
            continue
        found = present[name].shape
        if shape is not None and found != shape:
            if name == "fc.weight":
                A = len(spec.target_layer_ids)
                out.add("DSH204", f"tensor `fc.weight` has shape {list(found)}, expected {list(shape)} = "
                        f"[H, {A} target layers x target hidden {spec.target_hidden_size}]",
                        location="tensor fc.weight", expected=list(shape), found=list(found),
                        hint=f"the drafter's target_layer_ids has {A} entries: {spec.target_layer_ids}")
            else:
                out.add("DSH203", f"tensor {name!r} has shape {list(found)}, expected {list(shape)}",
                        location=f"tensor {name}", expected=list(shape), found=list(found))
    confidence = {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    if open_layers:
        check_stage_names(spec, out)
    for name in sorted(set(present) - set(shapes)):
        if open_layers and re.match(r"layers\.(\d+)\.", name) and int(name.split(".")[1]) < spec.num_layers:
            continue
        if name in confidence and not spec.confidence_head:
            out.add("DSH108", f"tensor {name!r} ships but enable_confidence_head is false; vLLM drops it",
                    location=f"tensor {name}", hint="set enable_confidence_head: true, or drop the tensor")
        else:
            out.add("DSH202", f"tensor {name!r} is not part of a {spec.family} {spec.variant} drafter with "
                    f"{spec.num_layers} layers", location=f"tensor {name}",
                    hint="vLLM 0.32 raises `There is no module or parameter named ...` on it")
    if spec.draft_vocab_size != spec.vocab_size and "d2t" in present and d.checkpoint.tensors:
        check_d2t(d, out)
    floats = {t.dtype for n, t in present.items() if t.dtype in ("F16", "BF16", "F32") and n != "d2t"
              and not n.startswith("confidence_head")}
    # DeepSeek-V4 stages mix BF16 / F32 (hyper-connection params, attn_sink) and FP8 by design
    if len(floats) > 1 and spec.family != "deepseek-v4":
        out.add("DSH206", f"weights mix floating dtypes {sorted(floats)}", found=sorted(floats),
                hint="vLLM casts to one dtype at load; make sure the lossy direction is intended")
    check_sidecar(d, out)


def check_layout_rules(d: OpenedDraft, out: Collector) -> None:
    """Rules specific to one layout: K3DSparkConfig's refusals, V4 stage counts, hidden-state id 0."""
    spec, cfg = d.spec, d.checkpoint.config
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    recipe = d.recipe.typed
    if recipe.k3_config_rules:
        # vLLM 0.32 transformers_utils/configs/k3_dspark.py K3DSparkConfig.__init__ (TorchSpec's K3DSparkMLAAttention
        # refuses mla_use_output_gate too: lightseekorg/TorchSpec 7f1e090 torchspec/models/draft/dspark.py)
        for key in ("mla_use_nope", "mla_use_output_gate", "mla_use_qk_norm", "dspark_bonus_anchor"):
            if cfg.get(key):
                out.add("DSH109", f"`{key}` is true; vLLM's MLA DSpark does not support it",
                        location=f"{cfg_file} key {key}", expected="false", found=cfg.get(key))
        if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None:
            out.add("DSH109", "`q_lora_rank` is null; vLLM's MLA DSpark needs the low-rank query path",
                    location=f"{cfg_file} key q_lora_rank", expected="an integer (1536 for Kimi K3)", found="null")
        if spec.draft_vocab_size != spec.vocab_size:
            out.add("DSH109", "MLA DSpark requires draft_vocab_size == vocab_size (it shares the target's LM head)",
                    location=f"{cfg_file} key draft_vocab_size", expected=spec.vocab_size,
                    found=spec.draft_vocab_size)
        n = cfg.get("num_target_layers")
        if n != len(spec.target_layer_ids):
            out.add("DSH109", "`num_target_layers` must equal len(target_layer_ids) in a K3 config (the target's "
                    "layer count is `target_num_hidden_layers`)", location=f"{cfg_file} key num_target_layers",
                    expected=len(spec.target_layer_ids), found=n)
    if recipe.minimax_config_rules:
        # vLLM 0.34 models/minimax_m3/common/dspark.py:286-287 (NotImplementedError unless dspark_use_dense_ffn) and
        # :247 (the MLP width); the loader would raise, or build an MLP the checkpoint does not fit
        if spec.extras.get("dspark_use_dense_ffn") is not True:
            out.add("DSH116", "`dspark_use_dense_ffn` is not true; vLLM 0.34's MiniMax DSpark supports dense FFN "
                    "drafts only (models/minimax_m3/common/dspark.py:286)", location=f"{cfg_file} key "
                    "dspark_use_dense_ffn", expected="true", found=spec.extras.get("dspark_use_dense_ffn"))
        width = spec.extras.get("dspark_ffn_hidden_size")
        if type(width) is not int or width <= 0:
            out.add("DSH116", "`dspark_ffn_hidden_size` (the dense MLP width, models/minimax_m3/common/dspark.py:247) "
                    "must be a positive integer", location=f"{cfg_file} key dspark_ffn_hidden_size",
                    expected="> 0", found=width)
    archs = cfg.get("architectures") or []
    # (a speculators config is exempt: vLLM 0.32 transformers_utils/configs/speculators/algos.py:175-186 keeps only
    # Qwen3DSparkModel / Qwen3OmniDSparkModel and writes Qwen3DSparkModel otherwise, so speculators 0.9.0's own
    # `DSparkDraftModel` is served as Qwen3)
    if "DSparkDraftModel" in archs and spec.family == "qwen3" and not recipe.served_through_speculators:
        # vLLM 0.32 config/speculative.py:1423-1430 renames DSparkDraftModel to Qwen3DSparkModel only for
        # model_type == "qwen3"; registry.py maps DSparkDraftModel to the DeepSeek-V4 class otherwise. SGLang 0.5.23
        # maps it to its Qwen3-style dense class (models/dspark.py:967, EntryClass :995).
        model_type = cfg.get("model_type")
        if model_type != "qwen3":
            out.add("DSH115", f"architectures {archs} with model_type {model_type!r}: vLLM 0.32 loads this Qwen3 "
                    "drafter as DeepSeek-V4 (it renames DSparkDraftModel to Qwen3DSparkModel only for model_type "
                    "exactly `qwen3`); SGLang 0.5.23 loads it as its Qwen3-style DSparkDraftModel",
                    location=f"{cfg_file} key architectures", expected='["Qwen3DSparkModel"]', found=archs,
                    hint="`dsparkhub convert` writes architectures [\"Qwen3DSparkModel\"] and model_type qwen3")
    if recipe.served_through_speculators and "sample_from_anchor" not in cfg:
        # vLLM 0.32 speculators/algos.py update_dspark / update_dflash: config_dict.get("sample_from_anchor", False);
        # speculators' DSparkSpeculatorConfig defaults it to True
        out.add("DSH113", f"sample_from_anchor is absent: vLLM serves this {spec.variant} drafter as 1+N "
                f"({spec.proposals_per_block} proposals per block), while speculators' own DSpark default is "
                "anchor-first; if it was trained anchor-first every slot is shifted by one",
                location=f"{cfg_file} key sample_from_anchor", expected="true or false, written explicitly",
                found="absent", hint="check how it was trained, then convert with --declare-block-layout "
                                     "anchor_first if needed (convert always writes the key)")
    if recipe.served_through_speculators and spec.variant == "dspark" and spec.causal is not None:
        # vLLM 0.32 transformers_utils/configs/speculators/algos.py: update_dflash writes dflash_config.causal from
        # sliding_window_non_causal, update_dspark does not, so qwen3_dflash.py:86 falls back to the layer types
        sliding = [i for i, t in enumerate(spec.decoder_config.get("layer_types") or []) if t == "sliding_attention"]
        wrong = [i for i in sliding if i < len(spec.causal) and not spec.causal[i]]
        if wrong:
            out.add("DSH114", f"draft layers {wrong} are bidirectional sliding layers (sliding_window_non_causal: "
                    "true), but vLLM 0.32 serves a speculators DSpark's sliding layers causally (algos.py "
                    "update_dspark sets no `causal`; qwen3_dflash.py:86 then follows layer_types)",
                    location=f"{cfg_file} key sliding_window_non_causal", expected="causal as trained",
                    found="causal in vLLM", hint="serve the output of `dsparkhub convert` (--to vllm writes "
                                                 "is_causal: false, which vLLM reads first)")
    if d.recipe.stages:
        # vLLM 0.32 DSparkDeepseekV4Model.__init__: `n_mtp_layers or 3` (deepseek_v4/nvidia/dspark.py:111); V4.1:
        # `n_mtp_layers or num_nextn_predict_layers or 3` (deepseek_v41/nvidia/dspark.py:89-93). Too few built stages
        # make the extra mtp.{i}.* a KeyError at load; too many leave stages uninitialised.
        v41 = cfg.get("model_type") == "deepseek_v41"
        n_mtp, nextn = cfg.get("n_mtp_layers"), cfg.get("num_nextn_predict_layers")
        key = "n_mtp_layers" if n_mtp else "num_nextn_predict_layers" if v41 and nextn else None
        built = cfg[key] if key else 3
        if built != spec.num_layers:
            source = f"from `{key}`" if key else "its default: n_mtp_layers is absent" + (
                "" if v41 else " and V4 does not read num_nextn_predict_layers")
            out.add("DSH111", f"vLLM 0.32 builds {built} DSpark stages ({source}) but the checkpoint holds "
                    f"{spec.num_layers} (mtp.0 .. mtp.{spec.num_layers - 1})",
                    location=f"{cfg_file} key {key or 'n_mtp_layers'}", expected=spec.num_layers, found=built,
                    hint=f"set n_mtp_layers: {spec.num_layers} (`dsparkhub convert` / `attach` write it)")
        if nextn is not None and nextn != spec.num_layers and key != "num_nextn_predict_layers":
            out.add("DSH110", f"`num_nextn_predict_layers` says {nextn} but the checkpoint holds {spec.num_layers} "
                    f"drafter stages (mtp.0 .. mtp.{spec.num_layers - 1}); vLLM's DSpark path does not read it here",
                    location=f"{cfg_file} key num_nextn_predict_layers", expected=spec.num_layers, found=nextn,
                    hint="vLLM's DSpark path counts stages from n_mtp_layers")
    numbering = d.recipe.data.get("target_layer_ids_numbering")
    keys = d.recipe.read_keys("target_layer_ids")
    if numbering == "hidden_state_index" and -1 in spec.target_layer_ids:
        out.add("DSH308", "hidden-state index 0 (the embedding output) is among the target layer ids; in this "
                "layout ids are layer index + 1", location=f"{cfg_file} key {keys[0] if keys else '?'}",
                found=[i + 1 for i in spec.target_layer_ids],
                hint=f"if the ids were copied from a layer-index config, add 1 to each: "
                     f"{[i + 2 for i in spec.target_layer_ids]}")
    elif -1 in spec.target_layer_ids:
        out.add("DSH308", "layer id -1 (the embedding output) is among the target layer ids: hidden-state indices "
                "converted to layer indices twice? (a one-layer shift keeps τ almost unchanged, so verify will not "
                "show it)", location=f"{cfg_file} key {keys[0] if keys else '?'}", found=spec.target_layer_ids,
                hint=f"if the drafter was trained on layer outputs, the ids are "
                     f"{[i + 1 for i in spec.target_layer_ids]}; DeepSpec allows -1 only for a drafter trained on "
                     "the embedding output")


def check_stage_names(spec: DraftSpec, out: Collector) -> None:
    """Every stage of an open-layer family (DeepSeek-V4) must hold the same parameter names."""
    per_stage: dict[int, set[str]] = {i: set() for i in range(spec.num_layers)}
    for name in spec.tensors:
        m = re.match(r"layers\.(\d+)\.(.+)", name)
        if m and int(m.group(1)) in per_stage:
            per_stage[int(m.group(1))].add(m.group(2))
    union = set().union(*per_stage.values()) if per_stage else set()
    for i, names in per_stage.items():
        missing = sorted(union - names)
        if missing:
            out.add("DSH112", f"stage {i} lacks {len(missing)} parameter(s) the other stages hold, e.g. "
                    f"{missing[:3]}", location=f"stage mtp.{i}",
                    expected=f"{len(union)} parameters per stage", found=len(names))


def check_d2t(d: OpenedDraft, out: Collector) -> None:
    spec = d.spec
    name = spec.source_names.get("d2t", "d2t")
    info = d.checkpoint.tensors[name]
    if info.dtype != "I64":
        out.add("DSH205", "d2t must be int64 offsets (target_id = draft_id + d2t[draft_id])",
                location="tensor d2t", expected="I64", found=info.dtype)
        return
    if d.checkpoint.remote:
        return
    import torch

    d2t = d.checkpoint.read_tensor(name)
    targets = torch.arange(d2t.numel()) + d2t.reshape(-1)
    bad = ((targets < 0) | (targets >= spec.vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        out.add("DSH205", f"d2t maps draft id {i} to target id {int(targets[i])}, outside the vocab",
                location="tensor d2t", expected=f"0 <= id < {spec.vocab_size}", found=int(targets[i]))
    elif torch.unique(targets).numel() != targets.numel():
        out.add("DSH205", "d2t maps two draft ids to the same target id", location="tensor d2t")
    else:
        check_head_rows_follow_d2t(d, d2t.reshape(-1), out)


def check_head_rows_follow_d2t(d: OpenedDraft, d2t, out: Collector) -> None:
    """DSH208: a reduced-vocab ``lm_head`` [Vd, H] whose rows were picked with the ``d2t`` *offsets* as row ids.

    ``d2t`` int64 [Vd] holds offsets (target id = k + d2t[k]; speculators, vLLM, TorchSpec's own
    ``process_token_dict_to_mappings``, deepinfra/TorchSpec 30189db torchspec/data/preprocessing.py:482), so draft
    ids kept from consecutive target ids share one offset. TorchSpec 30189db ``tools/convert_to_hf.py:313``
    trims a full-vocab head with ``lm_head[d2t]``: every draft id of such a run then gets the same target row
    ``d2t[k]``, byte-identical copies, where row ``k + d2t[k]`` belongs. Two distinct tokens never share a trained
    row, so identical rows over every run of equal offsets (and at least one run), in a head whose rows are not all
    one value (a zero-filled skeleton's are), are that defect; the right rows are gone from the file (only the full-vocab export or the training checkpoint holds them).
    """
    import torch

    name = d.spec.source_names.get("lm_head.weight", "lm_head.weight")
    info = d.checkpoint.tensors.get(name)
    if info is None or len(info.shape) != 2 or info.shape[0] != d2t.numel():
        return
    runs = (d2t[1:] == d2t[:-1]).nonzero().flatten()
    if not runs.numel():
        return
    head = d.checkpoint.read_tensor(name).contiguous()
    raw = head.view(-1).view(torch.uint8).reshape(head.shape[0], -1)  # bytes: a trained row equals no other
    if not bool((raw[runs] == raw[runs + 1]).all()):
        return
    if bool((raw == raw[0]).all()):  # one row value throughout (a zero-filled skeleton): says nothing of the picking
        return
    k = int(runs[0])
    out.add("DSH208", f"lm_head rows repeat over every run of equal d2t offsets ({runs.numel()} rows copy their "
            f"neighbour, e.g. draft ids {k} and {k + 1}, target ids {k + int(d2t[k])} and {k + 1 + int(d2t[k + 1])}): "
            "the head was trimmed with the d2t offsets as row ids, as TorchSpec 30189db tools/convert_to_hf.py:313 "
            "`lm_head[d2t]` does, so draft id k holds target row d2t[k], not k + d2t[k]",
            location=f"tensor {name}", expected="row k = the full head's row k + d2t[k]",
            found=f"row {k + 1} == row {k} (both the full head's row {int(d2t[k])})",
            hint="re-export without --prune-vocab (the full-vocab head is right) and reduce the vocab with "
                 "`dsparkhub convert --draft-vocab N --draft-vocab-from DATA`")
