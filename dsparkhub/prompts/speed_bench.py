"""SPEED-Bench prompt files (NVIDIA's speculative-decoding benchmark, ``nvidia/SPEED-Bench`` on the Hub) for
``dsparkhub verify --datasets speed-bench:FILE``: one dataset per category, so the results have per-category rows
(and the summary mean is unweighted over categories, as SPEED-Bench reports them).

Records (JSONL, one object a line; blank lines skipped). The published dataset card (``nvidia/SPEED-Bench``
README, configs ``qualitative`` and ``throughput_*``) lists the columns ``question_id``, ``category``,
``sub_category``, ``turns`` (list of user turns), ``source``, ``src_id``, ``difficulty``, ``multiturn``; chat-list
exports carry ``messages`` instead of ``turns``. Both are read:

- ``category`` (non-empty string, required): the dataset the record goes to, named ``NAME/category`` (NAME:
  ``speed-bench`` unless the spec gives one, ``NAME=speed-bench:FILE``); categories keep their order of first
  appearance;
- ``turns``: the first turn is the prompt (a single user message), as for DeepSpec records (multi-turn records
  are measured on their first turn, FORMATS.md §9);
- ``messages``: a chat list of ``{"role", "content"}``; the messages up to and including the first ``user``
  message are the prompt (a leading ``system`` message is kept), given to the target's chat template as they are.

The Hub publishes the dataset as parquet; this reader takes JSONL (dsparkhub does not depend on pyarrow). Export a
config once with ``datasets``: ``load_dataset("nvidia/SPEED-Bench", "qualitative", split="test")
.to_json("speed.jsonl")``. Specs: ``speed-bench:PATH.jsonl`` or ``speed-bench:hub:owner/name:file.jsonl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsparkhub.prompts.files import PromptFileError, PromptRecord, fetch_hub_file, jsonl_objects

PREFIX = "speed-bench:"
DEFAULT_NAME = "speed-bench"


def read_speed_bench(path: str | Path, *, source: str | None = None) -> list[tuple[str, list[PromptRecord]]]:
    """Records of a SPEED-Bench JSONL file grouped by category, in order of first appearance.

    Args:
        path: the JSONL file.
        source: name shown in errors instead of the path (a Hub file).

    Returns:
        ``[(category, records)]``; each record's ``text`` is the user prompt and ``messages`` the chat list given
        to the chat template.

    Raises:
        PromptFileError: the file is missing, parquet, not UTF-8, or a line is not JSON, has no non-empty
            ``category``, or has no usable ``turns`` / ``messages`` (the message names the line).
    """
    path = Path(path)
    shown = source or str(path)
    if path.suffix == ".parquet":
        raise PromptFileError(f"{shown} is parquet; dsparkhub reads SPEED-Bench as JSONL",
                              hint='export it once: datasets.load_dataset("nvidia/SPEED-Bench", "qualitative", '
                                   'split="test").to_json("speed.jsonl")')
    if not path.is_file():
        raise PromptFileError(f"SPEED-Bench file {shown} does not exist",
                              hint="pass speed-bench:PATH.jsonl (records with category and turns or messages)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise PromptFileError(f"{shown} is not UTF-8 text", hint="save the file as UTF-8 JSONL") from None
    groups: dict[str, list[PromptRecord]] = {}
    for lineno, obj in jsonl_objects(text, shown):
        category, record = _record(obj, f"{shown} line {lineno}", lineno)
        groups.setdefault(category, []).append(record)
    if not groups:
        raise PromptFileError(f"{shown} holds no prompts", hint="one JSON object per line")
    return list(groups.items())


def _record(obj: Any, where: str, lineno: int) -> tuple[str, PromptRecord]:
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    category = obj.get("category")
    if not isinstance(category, str) or not category.strip():
        raise PromptFileError(f"{where}: SPEED-Bench records need a non-empty string `category` (found "
                              f"{category!r})", hint="each record is one prompt of one category")
    category = category.strip()
    if "messages" in obj:
        msgs = obj["messages"]
        ok = isinstance(msgs, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                            and isinstance(m.get("content"), str) for m in msgs)
        first = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), None) if ok else None
        if first is None or not msgs[first]["content"].strip():
            raise PromptFileError(f"{where}: `messages` must be a list of {{role, content}} strings with a "
                                  "non-empty user message")
        chat = [{"role": m["role"], "content": m["content"]} for m in msgs[:first + 1]]
        return category, PromptRecord(text=msgs[first]["content"], line=lineno, messages=chat)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise PromptFileError(f"{where}: `turns` must be a non-empty list whose first entry is a non-empty "
                                  "string")
        return category, PromptRecord(text=turns[0], line=lineno)
    keys = ", ".join(sorted(obj)) or "none"
    raise PromptFileError(f"{where}: no `turns` or `messages` key (found keys: {keys})",
                          hint='SPEED-Bench records: {"category": "...", "turns": ["..."]} or '
                               '{"category": "...", "messages": [{"role": "user", "content": "..."}]}')


def read_categories(name: str, spec: str) -> list[tuple[str, list[PromptRecord], str]]:
    """``(dataset name, records, source)`` per category of a ``speed-bench:`` spec (``prompts.load_datasets``
    calls this): names ``NAME/category``, sources ``speed-bench:FILE (sha256 ..) category X`` for a local file
    (never its path) or ``speed-bench:hub:owner/name:file category X``.

    Raises:
        PromptFileError: see :func:`read_speed_bench`; a Hub file that cannot be fetched.
    """
    rest = spec[len(PREFIX):]
    if rest.startswith("hub:"):
        local, filename = fetch_hub_file(rest[4:])
        base = f"{PREFIX}hub:{rest[4:].split(':', 1)[0]}:{filename}"
        groups = read_speed_bench(local, source=base)
    else:
        from dsparkhub.io.hashing import sha256_file

        groups = read_speed_bench(rest)
        base = f"{PREFIX}{Path(rest).name} (sha256 {sha256_file(rest)[:16]})"
    return [(f"{name or DEFAULT_NAME}/{cat}", records, f"{base} category {cat}") for cat, records in groups]
