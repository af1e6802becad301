"""Keep Hugging Face tokens out of everything dsparkhub prints or writes.

The token comes from ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN`` or the huggingface_hub login
(``huggingface_hub.get_token``). :func:`redact` replaces every known token value, and anything shaped like a Hub
token (``hf_`` followed by 20+ letters and digits), in a text before it is shown or stored.
"""

from __future__ import annotations

import os
import re

_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")


def known_tokens() -> list[str]:
    """Token values this process could send: from the environment and the huggingface_hub login (may be empty)."""
    values = [os.environ.get(v, "") for v in _ENV_VARS]
    try:
        from huggingface_hub import get_token

        values.append(get_token() or "")
    except Exception:  # a broken login file must not stop redaction
        pass
    return sorted({v for v in values if len(v) >= 8}, key=len, reverse=True)


def redact(text: str) -> str:
    """Return ``text`` with every token value and every Hub-token-shaped string replaced by ``***``."""
    for token in known_tokens():
        text = text.replace(token, "***")
    return _TOKEN_SHAPE.sub("hf_***", text)
