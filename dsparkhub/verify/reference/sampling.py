"""Speculative rejection sampling for the reference engine (batch 1 and batched share it)."""

from __future__ import annotations

import torch


def rejection_step(p_target: torch.Tensor, q_draft: torch.Tensor, draft_token: int,
                   generator: torch.Generator | None) -> tuple[bool, int | None]:
    """One step of speculative rejection sampling (Leviathan et al. 2023; vLLM ``rejection_sampler``).

    Args:
        p_target: [V] target probabilities at this position (temperature applied).
        q_draft: [V] draft probabilities the token was sampled from (target vocab).
        draft_token: the drafted token id.
        generator: torch generator for reproducibility.

    Returns:
        ``(True, None)`` when accepted, else ``(False, resampled_token)`` drawn from ``norm(max(p - q, 0))``.
    """
    p = float(p_target[draft_token])
    q = float(q_draft[draft_token])
    u = float(torch.rand((), generator=generator, device=p_target.device))
    if q > 0 and u < min(1.0, p / q):
        return True, None
    residual = (p_target - q_draft).clamp_min(0)
    total = residual.sum()
    if float(total) <= 0:  # p == q everywhere up to rounding: any draw from p is exact
        residual, total = p_target, p_target.sum()
    return False, int(torch.multinomial(residual / total, 1, generator=generator))
