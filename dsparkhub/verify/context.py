"""The context a verify run must fit in: ``--max-model-len``, else the local target's ``max_position_embeddings``.

A prompt plus ``--max-new-tokens`` beyond it is refused before any model loads, unless the caller asks for it
(``--allow-beyond-context``, then one warning per dataset): vLLM refuses such prompts, the reference engine runs
them for minutes, and past its trained positions a target's outputs (and so τ) mean little. Does not tokenize (the
runner hands the tokenized datasets in) or load anything but the target's ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from dsparkhub.verify.settings import VerifyArgumentError

ALLOW_FLAG = "--allow-beyond-context"


def context_limit(target: str | Path, max_model_len: int | None) -> tuple[int | None, str]:
    """``(tokens, where the number comes from)``; ``(None, "")`` when unknown (a Hub id, a served name, a config
    without ``max_position_embeddings``, in ``text_config`` for multimodal targets)."""
    if max_model_len is not None:
        return max_model_len, "--max-model-len"
    cfg = Path(target) / "config.json"
    if not cfg.is_file():
        return None, ""
    try:
        c = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(c, dict):
        return None, ""
    limit = c.get("max_position_embeddings") or (c.get("text_config") or {}).get("max_position_embeddings")
    return (limit, "max_position_embeddings in the target's config.json") if isinstance(limit, int) else (None, "")


def check_new_tokens(target: str | Path, max_model_len: int | None, max_new_tokens: int, allow: bool) -> None:
    """Refuse a ``max_new_tokens`` that leaves no room for even a one-token prompt, from the target's config alone
    (before validation, tokenizer or engine).

    Raises:
        VerifyArgumentError: ``max_new_tokens + 1`` exceeds the context and ``allow`` is False.
    """
    limit, source = context_limit(target, max_model_len)
    if limit is None or allow or max_new_tokens + 1 <= limit:
        return
    raise VerifyArgumentError(
        f"--max-new-tokens {max_new_tokens} plus the prompt exceeds the target's context of {limit} tokens "
        f"({source}); the run would generate past every position the target was trained on (vLLM refuses it, the "
        "reference engine would run for a long time on meaningless outputs)",
        hint=f"give --max-new-tokens below {limit} minus the longest prompt, or pass {ALLOW_FLAG} to measure anyway")


def check_prompts(data, target: str | Path, max_model_len: int | None, max_new_tokens: int, allow: bool,
                  warn: Callable[[str], None] | None) -> None:
    """Refuse (or, with ``allow``, warn about) prompts whose length plus ``max_new_tokens`` exceeds the context.

    Args:
        data: the tokenized datasets (``prompts.load_datasets``: ``.name`` and ``.prompts``, lists of token ids).
        target / max_model_len: where the context comes from (:func:`context_limit`).
        max_new_tokens: generation cap per prompt.
        allow: warn instead of refusing.
        warn: takes the warning lines.

    Raises:
        VerifyArgumentError: some prompt does not fit and ``allow`` is False (every dataset named, one paragraph).
    """
    limit, source = context_limit(target, max_model_len)
    if limit is None:
        return
    found = []
    for ds in data:
        over = [len(p) for p in ds.prompts if len(p) + max_new_tokens > limit]
        if over:
            found.append(f"{len(over)} prompt(s) of dataset {ds.name!r} (longest {max(over)} tokens)")
    if not found:
        return
    if not allow:
        longest = max(len(p) for ds in data for p in ds.prompts)
        raise VerifyArgumentError(
            f"{'; '.join(found)} plus --max-new-tokens {max_new_tokens} exceed the target's context of {limit} "
            f"tokens ({source}); vLLM refuses such prompts and the numbers past the context mean little",
            hint=f"give --max-new-tokens at most {max(limit - longest, 0)}, drop the long prompts, or pass "
                 f"{ALLOW_FLAG} to measure anyway")
    if warn is not None:
        for line in found:
            warn(f"warning: {line} plus {max_new_tokens} new tokens exceed the context of {limit} tokens; vLLM "
                 "refuses them and the numbers past the context mean little")
