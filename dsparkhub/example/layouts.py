"""The real layouts the example is saved in: DeepSpec DSpark / z-lab DFlash configs, DeepSpec step folders, and
random tiny checkpoints with the same real tensor names for tests.

Each writer follows its upstream (cited per function); nothing here trains or measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsparkhub.verify.reference.loading import drafter_config_of
from dsparkhub.verify.reference.modeling import Drafter

__all__ = ["deepspec_draft_config", "dspark_config_dict", "dflash_config_dict", "link_step_latest", "save_deepspec_step",
           "save_safetensors", "make_tiny_target", "make_tiny_drafter"]


def deepspec_draft_config(target_config: dict, *, num_hidden_layers: int, target_layer_ids: list[int],
                          block_size: int, mask_token_id: int, markov_rank: int, confidence: bool = True,
                          with_markov: bool = True, num_anchors: int = 512) -> dict:
    """A DeepSpec Qwen3 DSpark ``config.json``: a copy of ``target_config`` (every key kept, in order) plus the DSpark
    keys — the one builder of the embedded example (:func:`dspark_config_dict`) and the test factories
    (``dsparkhub.testing.factories.qwen3.make_deepspec_drafter``).

    DeepSpec ``deepspec/modeling/dspark/qwen3/config.py`` ``build_draft_config`` (FORMATS §2): architectures
    ``["Qwen3DSparkModel"]``, ``model_type`` kept, ``num_hidden_layers`` = draft layers, ``num_target_layers`` = the
    target's layer count, top-level ``block_size`` / ``mask_token_id`` / ``target_layer_ids`` (layer-index numbering),
    ``num_anchors``, ``tie_word_embeddings`` false, ``layer_types``, ``_attn_implementation``,
    ``enable_confidence_head``; with ``markov_rank`` > 0 also ``markov_rank`` / ``markov_head_type`` and, with a
    confidence head, ``confidence_head_with_markov`` (a rank-0 DeepSpec-DFlash config leaves them out).
    """
    cfg = dict(target_config)
    cfg.update({"architectures": ["Qwen3DSparkModel"], "num_hidden_layers": num_hidden_layers,
                "num_target_layers": int(target_config["num_hidden_layers"]), "block_size": block_size,
                "mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids), "num_anchors": num_anchors,
                "tie_word_embeddings": False, "layer_types": ["full_attention"] * num_hidden_layers,
                "_attn_implementation": "flex_attention", "enable_confidence_head": confidence})
    if markov_rank:
        cfg.update({"markov_rank": markov_rank, "markov_head_type": "vanilla"})
        if confidence:
            cfg["confidence_head_with_markov"] = with_markov
    return cfg


def dspark_config_dict(target_config: dict, *, num_hidden_layers: int, target_layer_ids: list[int], block_size: int,
                       mask_token_id: int, markov_rank: int, intermediate_size: int | None = None,
                       enable_confidence_head: bool = True, confidence_head_with_markov: bool = True,
                       num_anchors: int = 512) -> dict:
    """The example's DeepSpec ``config.json``: :func:`deepspec_draft_config` of ``target_config`` without the keys
    ``save_pretrained`` writes for the target's own weights (``transformers_version``, ``dtype``, ``torch_dtype``),
    and the draft layers' ``intermediate_size`` when given."""
    cfg = deepspec_draft_config({k: v for k, v in json.loads(json.dumps(target_config)).items()
                                 if k not in ("transformers_version", "dtype", "torch_dtype")},
                                num_hidden_layers=num_hidden_layers, target_layer_ids=target_layer_ids,
                                block_size=block_size, mask_token_id=mask_token_id, markov_rank=markov_rank,
                                confidence=enable_confidence_head, with_markov=confidence_head_with_markov,
                                num_anchors=num_anchors)
    if intermediate_size is not None:
        cfg["intermediate_size"] = intermediate_size
    return cfg


def dflash_config_dict(target_config: dict, *, num_hidden_layers: int, target_layer_ids: list[int], block_size: int,
                       mask_token_id: int, intermediate_size: int | None = None) -> dict:
    """A z-lab DFlash ``config.json`` as vLLM 0.32 loads it (``DFlashDraftModel``; ``qwen3_dflash.py``).

    Keys read by vLLM: Qwen3 geometry, ``dflash_config.{target_layer_ids, mask_token_id}`` (layer-index numbering,
    vLLM adds 1), ``block_size`` (default ``num_speculative_tokens``), ``layer_types`` all full attention
    (non-causal). ``num_target_layers`` is the target's layer count (z-lab ``dflash/model.py``).
    """
    cfg = json.loads(json.dumps(target_config))
    for key in ("transformers_version", "dtype", "torch_dtype", "mask_token_id", "target_layer_ids"):
        cfg.pop(key, None)
    cfg.update({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_target_layers": int(target_config["num_hidden_layers"]),
        "num_hidden_layers": num_hidden_layers,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(target_layer_ids), "mask_token_id": mask_token_id},
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_hidden_layers,
    })
    if intermediate_size is not None:
        cfg["intermediate_size"] = intermediate_size
    return cfg


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file`` of contiguous CPU copies, with ``{"format": "pt"}`` metadata as HF writes."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def save_deepspec_step(run_dir: Path, step: int, config: dict, tensors: dict[str, torch.Tensor], *,
                       train_config: str, optimizer_state: dict | None) -> Path:
    """Write ``run_dir/step_<step>/`` exactly as DeepSpec's checkpoint manager does and point ``step_latest`` at it.

    Files: ``config.json``, ``model.safetensors`` (DeepSpec names, including frozen embed / lm_head copies),
    ``train_config.py``, ``training_state.rank0.pt`` (``torch.save`` of the optimizer state; nothing in dsparkhub
    loads it) and the relative symlink ``step_latest -> step_<step>``.
    """
    step_dir = run_dir / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_safetensors(tensors, step_dir / "model.safetensors")
    (step_dir / "train_config.py").write_text(train_config)
    torch.save({"optimizer": optimizer_state or {}, "next_micro_step": step, "world_size": 1},
               step_dir / "training_state.rank0.pt")
    link_step_latest(step_dir)
    return step_dir


def link_step_latest(step_dir: Path) -> None:
    """Point ``step_latest`` beside ``step_dir`` at it (relative, replacing an older link), as DeepSpec's checkpoint
    manager does last, after the step's files (``deepspec/utils/io.py`` ``safe_symlink``; DeepSpec's own link is
    absolute, ``dsparkhub.layouts.deepspec_run`` reads both)."""
    latest = step_dir.parent / "step_latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(step_dir.name)


# ---- tiny factories for tests --------------------------------------------------------------------------------


def make_tiny_target(folder: str | Path, *, vocab_size: int = 96, hidden_size: int = 48, num_hidden_layers: int = 3,
                     seed: int = 0, eos_token_id: int = 0, mask_token_id: int | None = None):
    """Save a random tiny ``Qwen3ForCausalLM`` (untied embed / lm_head) to ``folder``; returns the model.

    ``mask_token_id`` is stored in the config for the drafter factories to read (default: last id).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                      intermediate_size=hidden_size * 2, max_position_embeddings=1024, tie_word_embeddings=False,
                      eos_token_id=eos_token_id, architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper random distributions than the default init, so drafts can disagree
        model.lm_head.weight.mul_(8.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    return model


def make_tiny_drafter(folder: str | Path | None, target_model, *, kind: str = "dspark",
                      target_layer_ids: list[int] | tuple[int, ...] = (0, 1), num_hidden_layers: int = 1,
                      block_size: int | None = None, markov_rank: int = 8, confidence: bool = True,
                      include_embed_head: bool = True, mask_token_id: int | None = None, seed: int = 1,
                      layout: str = "deepspec") -> Drafter:
    """A random drafter for ``target_model`` (embed / lm_head copied from it), optionally saved to ``folder``.

    Args:
        kind: ``"dspark"`` (DeepSpec config) or ``"dflash"`` (z-lab config, 1+N).
        layout: for dspark, ``"deepspec"`` (``folder`` is a run dir with ``step_1`` + ``step_latest``) or
            ``"flat"`` (config.json + model.safetensors directly in ``folder``).
        include_embed_head: save ``embed_tokens`` / ``lm_head`` (DeepSpec) or drop them (converted / z-lab).
    """
    tcfg = target_model.config.to_dict()
    mask = mask_token_id if mask_token_id is not None else tcfg["vocab_size"] - 1
    if kind == "dspark":
        cfg = dspark_config_dict(tcfg, num_hidden_layers=num_hidden_layers, target_layer_ids=list(target_layer_ids),
                                 block_size=block_size or 4, mask_token_id=mask, markov_rank=markov_rank,
                                 enable_confidence_head=confidence)
    elif kind == "dflash":
        cfg = dflash_config_dict(tcfg, num_hidden_layers=num_hidden_layers, target_layer_ids=list(target_layer_ids),
                                 block_size=block_size or 5, mask_token_id=mask)
    else:
        raise ValueError(f"kind must be 'dspark' or 'dflash', found {kind!r}")
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config_of(cfg)).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target_model.get_input_embeddings().weight)
        drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight)
    if folder is not None:
        folder = Path(folder)
        tensors = dict(drafter.state_dict())
        if not include_embed_head or kind == "dflash":
            tensors.pop("embed_tokens.weight")
            tensors.pop("lm_head.weight")
        if kind == "dspark" and layout == "deepspec":
            save_deepspec_step(folder, 1, cfg, tensors, train_config="# tiny random drafter\n", optimizer_state=None)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            save_safetensors(tensors, folder / "model.safetensors")
    return drafter
