"""The example's corpus and tokenizer: the Python standard library's top-level module sources (a code workload), a
byte-level BPE trained on them, and the evaluation prompts cut from the held-out modules.

Owns the special tokens (their ids are fixed: 0 end of text, 1 padding, 2 mask) and the chat template the target's
tokenizer is saved with. Does not train a model, build training batches (:mod:`dsparkhub.example.batches`) or save
anything (:mod:`dsparkhub.example.train`, :mod:`dsparkhub.example.layouts`). Nothing here touches the network.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from dsparkhub.errors import DsparkhubError

__all__ = ["CHAT_TEMPLATE", "EOS_ID", "MASK_ID", "PAD_ID", "SPECIAL_TOKENS", "heldout_prompts", "read_source",
           "stdlib_modules", "train_tokenizer"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]  # ids 0, 1, 2
EOS_ID, PAD_ID, MASK_ID = 0, 1, 2
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def stdlib_modules() -> list[Path]:
    """The standard library's public top-level ``*.py`` files, sorted by name.

    Raises:
        DsparkhubError: fewer than 40 are found (an install without the library sources).
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file() and not p.name.startswith("_"))
    if len(files) < 40:
        raise DsparkhubError(f"found only {len(files)} top-level modules in {stdlib}; the example needs the "
                             "Python standard library sources", path=stdlib)
    return files


def read_source(path: Path) -> str:
    """``path`` as text with ``\\n`` line ends (undecodable bytes replaced)."""
    return path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` ids trained on ``texts``, :data:`SPECIAL_TOKENS`
    first (ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def heldout_prompts(held: list[Path], r: dict) -> list[str]:
    """Code snippets from held-out modules: each starts at a ``def`` line and is cut at a line end."""
    prompts: list[str] = []
    for m in held:
        text = read_source(m)
        idx = text.find("\ndef ", len(text) // 3)
        if idx < 0:
            idx = text.find("\n    def ")
        if idx < 0:
            continue
        snippet = text[idx + 1: idx + 1 + r["prompt_chars"]]
        snippet = snippet[: snippet.rfind("\n") + 1] if "\n" in snippet else snippet
        if len(snippet) >= 60:
            prompts.append(snippet)
        if len(prompts) >= r["num_prompts"]:
            break
    return prompts
