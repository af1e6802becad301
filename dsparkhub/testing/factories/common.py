"""What every tiny-checkpoint factory shares: writing a folder (:func:`write_checkpoint`), seeded random values
(:func:`random_tensors`) and a decoder layer's dense MLP with its norms (:func:`dense_mlp`). No layout knowledge.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_checkpoint(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` (indent 2) and ``model.safetensors`` (``{"format": "pt"}`` metadata) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def random_tensors(g, dtype):
    """``r(*shape)``: N(0, 0.05²) values from generator ``g`` in ``dtype``, drawn in call order."""
    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    return r


#: RMSNorm weights of a Qwen3 decoder layer (:func:`dense_mlp`'s default).
QWEN3_NORMS = ("input_layernorm", "post_attention_layernorm")


def dense_mlp(p: str, r, hidden: int, inter: int, dtype, norms: tuple[str, ...] = QWEN3_NORMS) -> dict:
    """One decoder layer's SwiGLU MLP (``mlp.{gate,up,down}_proj.weight``, random from ``r`` in that order) and its
    RMSNorm weights (ones, [hidden]), under prefix ``p``."""
    return {p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
            p + "mlp.down_proj.weight": r(hidden, inter),
            **{p + n + ".weight": torch.ones(hidden, dtype=dtype) for n in norms}}
