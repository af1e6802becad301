"""What every prompt-file reader shares (:mod:`dsparkhub.prompts.datasets`, :mod:`dsparkhub.prompts.speed_bench`):
the record read from a file, the error naming the file and line, and fetching a file from a Hub dataset repo."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import DsparkhubError
from dsparkhub.io.hub_datasets import fetch_dataset_jsonl


class PromptFileError(DsparkhubError, ValueError):
    """A prompt file or dataset spec is malformed, missing, or cannot be tokenized for this target."""


@dataclass
class PromptRecord:
    """One prompt as read from a file: text (to be tokenized) or token ids (used as-is)."""

    text: str | None = None
    token_ids: list[int] | None = None
    line: int = 0
    messages: list[dict] | None = None  # a chat list for the chat template (SPEED-Bench ``messages``)


def fetch_hub_file(spec: str) -> tuple[Path, str]:
    """Download ``owner/name[:path/in/repo.jsonl]`` from a Hub dataset repo; returns (local path, file name).

    Without a file, the repo's single ``*.jsonl`` file is used; a cached file is read without a request (see
    :func:`dsparkhub.hub.datasets.fetch_dataset_jsonl`, which does the fetching).

    Raises:
        PromptFileError: the spec is not ``owner/name[:file]``, no network / offline mode and nothing cached, the repo
            holds no or several JSONL files, or the file does not exist (huggingface_hub's own error is chained).
    """
    repo, _, filename = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise PromptFileError(f"hub dataset spec {spec!r}: expected hub:owner/name[:path/in/repo.jsonl]")
    return fetch_dataset_jsonl(repo, filename, error=PromptFileError)


def jsonl_objects(text: str, shown: str) -> Iterator[tuple[int, object]]:
    """``(line number, parsed JSON value)`` per non-blank line of a JSONL file's text (numbered from 1).

    Raises:
        PromptFileError: a line is not valid JSON (``shown``, the line and the column named).
    """
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{shown} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})",
                                  hint="one JSON object per line") from None
        yield lineno, obj
