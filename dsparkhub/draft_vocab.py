"""Reduced draft vocabularies: choose the N most frequent target tokens and shrink a full-vocab drafter's output.

A drafter's LM head ([V, H]) and Markov output projection (``markov_w2`` [V, r]) are the largest per-step costs of
drafting against a large vocabulary (Kimi-K2.x: V = 163840). Speculators and EAGLE-3 drafters keep only the Vd most
frequent tokens: ``lm_head`` [Vd, H], ``markov_w2`` [Vd, r], and ``d2t`` int64 [Vd] mapping a draft id to its target
id (``target_id = draft_id + d2t[draft_id]``, speculators ``DraftVocabMixin``; vLLM 0.32 ``qwen3_dspark.py`` requires
``lm_head`` and ``d2t`` when Vd < V). The input side (``embed_tokens``, ``markov_w1`` [V, r]) keeps the full vocab.

Lossless either way (the target verifies every token); τ drops where the target picks a token outside the draft
vocab, so choose N from text like what will be served, ideally the target's own outputs.

Flow: :func:`choose_draft_vocab` (counts tokens of ``--draft-vocab-from`` datasets with the target's tokenizer) ->
``dsparkhub.convert.plan_conversion(draft_vocab=...)`` writes the rows of the chosen ids and ``d2t``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import ConversionRefusedError


@dataclass
class DraftVocab:
    """A reduced draft vocabulary.

    Attributes:
        ids: target token ids in the draft vocab, ascending (draft id k is target id ``ids[k]``).
        vocab_size: the full (target) vocab V the ids index.
        source: the datasets counted (``--draft-vocab-from``).
        tokens_counted: tokens counted over all prompts.
        coverage: share of the counted tokens whose id is in the draft vocab (0..1).
        forced: ids included whatever their count (the target's EOS tokens).
    """

    ids: list[int]
    vocab_size: int
    source: str
    tokens_counted: int
    coverage: float
    forced: list[int]

    @property
    def size(self) -> int:
        """Vd."""
        return len(self.ids)

    def d2t(self):
        """``d2t`` int64 [Vd]: ``ids[k] - k`` (speculators convention: ``target_id = draft_id + d2t[draft_id]``)."""
        import torch

        ids = torch.tensor(self.ids, dtype=torch.int64)
        return ids - torch.arange(len(self.ids), dtype=torch.int64)

    def t2d(self):
        """``t2d`` bool [V]: true where a target token is in the draft vocab (speculators, training only)."""
        import torch

        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[torch.tensor(self.ids, dtype=torch.int64)] = True
        return mask

    def to_dict(self) -> dict:
        """Provenance record (the ids themselves live in ``d2t``)."""
        return {"size": self.size, "from": self.source, "tokens_counted": self.tokens_counted,
                "coverage": round(self.coverage, 6), "forced_ids": self.forced}


def _eos_ids(target: Path) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        p = target / name
        if p.is_file():
            try:
                v = json.loads(p.read_text()).get("eos_token_id")
            except (OSError, ValueError):
                continue
            ids += [v] if isinstance(v, int) else [i for i in v or [] if isinstance(i, int)]
    return sorted(set(ids))


def choose_draft_vocab(target: str | Path, datasets: list[str], size: int, *, vocab_size: int) -> DraftVocab:
    """The ``size`` most frequent target tokens of ``datasets``, plus the target's EOS tokens.

    Ties are broken by the lower token id, so the choice is deterministic.

    Args:
        target: local target folder (its tokenizer encodes the text; its ``eos_token_id`` is always kept).
        datasets: ``--datasets``-style specs (JSONL files with ``turns`` / ``prompt`` / ``prompt_token_ids``,
            ``builtin:...``), see ``dsparkhub.prompts.datasets``.
        size: Vd, 1 <= Vd < V.
        vocab_size: V, the drafter's (and target's) vocab size.

    Raises:
        ConversionRefusedError: ``size`` out of range, the target is not a local folder, or a token id is >= V.
        PromptFileError: a dataset cannot be read or tokenized.
    """
    import torch

    from dsparkhub.prompts.datasets import load_datasets

    if not 1 <= size < vocab_size:
        raise ConversionRefusedError(f"--draft-vocab {size}: a reduced draft vocab needs 1 <= N < {vocab_size} "
                                     "(the vocab size)")
    target = Path(target)
    if not target.is_dir():
        raise ConversionRefusedError("--draft-vocab needs a local target folder (its tokenizer counts the tokens)",
                                     path=target)
    data = load_datasets(datasets, target)
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    total = 0
    for ds in data:
        for prompt in ds.prompts:
            ids = torch.tensor(prompt, dtype=torch.int64)
            if ids.numel() and int(ids.max()) >= vocab_size:
                raise ConversionRefusedError(f"dataset {ds.source} holds token id {int(ids.max())}, outside the "
                                             f"vocab of {vocab_size}", path=target)
            counts += torch.bincount(ids, minlength=vocab_size)
            total += ids.numel()
    forced = [i for i in _eos_ids(target) if i < vocab_size][:size]
    # sort by count descending, then id ascending (stable sort on -count keeps id order among ties)
    order = torch.argsort(-counts, stable=True).tolist()
    chosen = list(forced)
    taken = set(forced)
    for i in order:
        if len(chosen) == size:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    ids = sorted(chosen)
    covered = int(counts[torch.tensor(ids)].sum())
    return DraftVocab(ids=ids, vocab_size=vocab_size, source=",".join(datasets), tokens_counted=total,
                      coverage=covered / total if total else 0.0, forced=forced)
