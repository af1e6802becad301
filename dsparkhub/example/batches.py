"""The drafters' training data: the target's own greedy continuations of training windows, the target hidden states
the drafters read, and DeepSpec-style anchor blocks sampled from them (:func:`anchor_blocks`).

Owns the block geometry of training: anchor-first (DSpark) queries ``[anchor, mask x (B-1)]`` whose slot k predicts
position a + k + 1; 1+N (DFlash) queries whose slots 1..B-1 predict their own positions; either way a block sees the
context before its anchor and itself (DeepSpec ``create_dspark_attention_mask``). Does not compute a loss or step an
optimizer (:mod:`dsparkhub.example.train`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dsparkhub.verify.reference.modeling import target_features

__all__ = ["AnchorBlocks", "anchor_blocks", "regenerate", "sample_anchors", "target_states"]


@torch.no_grad()
def regenerate(model, stream: torch.Tensor, r: dict, gen: torch.Generator) -> torch.Tensor:
    """The target's own greedy continuations of random training windows: [N, prompt_len + new_tokens] int64."""
    from transformers import DynamicCache

    n, plen, new, bs = r["num_prompts"], r["prompt_len"], r["new_tokens"], r["batch_size"]
    starts = torch.randint(0, stream.numel() - plen - 1, (n,), generator=gen)
    prompts = torch.stack([stream[s:s + plen] for s in starts.tolist()])
    rows = []
    for i in range(0, n, bs):
        ids = prompts[i:i + bs]
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        seqs = [ids]
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new):
            seqs.append(nxt)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        rows.append(torch.cat(seqs, dim=1))
    return torch.cat(rows)


@torch.no_grad()
def target_states(model, seqs: torch.Tensor, layer_ids: list[int], bs: int = 64):
    """The drafters' inputs from the target, over ``seqs`` [N, T] int64 in batches of ``bs``.

    Returns:
        ``(features [N, T, A·Ht], last [N, T, Ht])``: the concatenated hidden states of ``layer_ids`` (layer-index
        numbering, :func:`~dsparkhub.verify.reference.modeling.target_features`) and the last layer's states.
    """
    feats, last = [], []
    for i in range(0, seqs.shape[0], bs):
        out = model(input_ids=seqs[i:i + bs], output_hidden_states=True)
        feats.append(target_features(out.hidden_states, tuple(layer_ids)))
        last.append(out.hidden_states[-1])
    return torch.cat(feats), torch.cat(last)


def sample_anchors(valid: torch.Tensor, num: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSpec ``sample_anchor_positions``: ``num`` sorted random valid anchors per row, and a keep mask."""
    bsz, n_cand = valid.shape
    rand = torch.rand(bsz, n_cand, generator=gen)
    rand = torch.where(valid, rand, torch.full_like(rand, 2.0))
    order = rand.argsort(dim=1)[:, :num]
    keep = torch.gather(valid, 1, order)
    anchors = torch.where(keep, order, torch.zeros_like(order))
    anchors, idx = anchors.sort(dim=1)
    return anchors, torch.gather(keep, 1, idx)


class AnchorBlocks(NamedTuple):
    """One batch of anchor blocks (see :func:`anchor_blocks`); B rows, na anchors, block size b, npred predictions."""

    anchors: torch.Tensor  # [B, na] int64 anchor positions, sorted
    keep: torch.Tensor  # [B, na] bool: a real anchor (False: padding where a row has fewer valid ones)
    block_ids: torch.Tensor  # [B, na * b] int64: the anchor token then mask tokens
    positions: torch.Tensor  # [B, na * b] int64 positions of the block slots
    context_positions: torch.Tensor  # [B, T] int64
    mask: torch.Tensor  # [B, 1, na * b, T + na * b] bool, True = attend
    labels: torch.Tensor  # [B, na, npred] int64 tokens each predicting slot must produce
    label_positions: torch.Tensor  # [B, na, npred] int64, clamped to T - 1
    eval_mask: torch.Tensor  # [B, na, npred] bool: in range and every earlier slot too
    prev: torch.Tensor  # [B, na, npred] int64: the token before each label (Markov / confidence input)


def anchor_blocks(ids: torch.Tensor, valid_row: torch.Tensor, num_anchors: int, block: int, npred: int,
                  mask_token_id: int, gen: torch.Generator) -> AnchorBlocks:
    """Sample ``num_anchors`` anchors per row of ``ids`` [B, T] among ``valid_row`` [T - 1] and build their blocks.

    A block attends to context positions before its anchor and to its own slots; a dropped (padding) block sees its
    own slots only, so every query has one visible key. Slot offsets of the predicting slots: 0.. (anchor-first,
    ``npred == block``) or 1.. (1+N, ``npred == block - 1``); the labels are positions a + 1 .. a + npred either way.
    """
    bsz, seq_len = ids.shape
    offs = torch.arange(block)
    anchors, keep = sample_anchors(valid_row.unsqueeze(0).expand(bsz, -1), num_anchors, gen)
    na = anchors.shape[1]
    qpos = (anchors.unsqueeze(-1) + offs).view(bsz, na * block)  # [B, na*block]
    block_ids = torch.full((bsz, na, block), mask_token_id, dtype=torch.int64)
    block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    ctx_pos = torch.arange(seq_len).unsqueeze(0).expand(bsz, -1)
    q_block = torch.arange(na * block) // block
    anchor_of_q = anchors[:, q_block]  # [B, Q]
    ctx_ok = torch.arange(seq_len).view(1, 1, -1) < anchor_of_q.unsqueeze(-1)
    blk_ok = (q_block.view(-1, 1) == q_block.view(1, -1)).unsqueeze(0).expand(bsz, -1, -1)
    mask = torch.cat([ctx_ok, blk_ok], dim=-1) & keep[:, q_block].unsqueeze(-1)
    mask[..., seq_len:] |= ~keep[:, q_block].unsqueeze(-1)  # dropped blocks still need one visible key
    label_pos = anchors.unsqueeze(-1) + torch.arange(1, npred + 1)  # [B, na, npred]
    in_range = label_pos < seq_len
    safe = label_pos.clamp(max=seq_len - 1)
    labels = torch.gather(ids.unsqueeze(1).expand(-1, na, -1), 2, safe)
    eval_mask = (in_range & keep.unsqueeze(-1)).to(torch.int64).cumprod(-1).bool()
    prev = torch.cat([torch.gather(ids, 1, anchors).unsqueeze(-1), labels[..., :-1]], dim=-1)
    return AnchorBlocks(anchors, keep, block_ids.view(bsz, -1), qpos, ctx_pos, mask.unsqueeze(1), labels, safe,
                        eval_mask, prev)
