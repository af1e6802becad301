"""Prompt datasets for ``dsparkhub verify`` (and ``convert --draft-vocab-from``, ``calibrate``): reading JSONL files,
the built-in smoke set, Hub dataset files, and tokenizing with the target's tokenizer.

Accepted JSONL records (one JSON object a line; blank lines are skipped):

- DeepSpec evaluation format ``{"turns": ["first user turn", ...], ...}``: only the first turn is used (DeepSpec
  ``eval/`` uses the first turn of each record, FORMATS.md §9);
- ``{"prompt": "text"}``;
- ``{"prompt_token_ids": [int, ...]}`` for targets without a tokenizer (used as-is, no chat template).

Dataset specs (``--datasets``, comma-separated or repeated): ``PATH`` (name = file stem), ``NAME=PATH``,
``builtin`` (the three smoke sets), ``builtin:math`` / ``builtin:code`` / ``builtin:chat`` (prompts written for this
project and shipped in ``dsparkhub/data/prompts``), and ``hub:owner/name[:path/in/repo.jsonl]`` (a dataset repo
file fetched with huggingface_hub; needs the network or a warm cache), and ``speed-bench:FILE.jsonl`` (SPEED-Bench
records, one dataset ``NAME/category`` per category: :mod:`dsparkhub.prompts.speed_bench`). Any spec may take a
``NAME=`` prefix.

Text prompts get the target tokenizer's chat template when it has one (a single user message, generation prompt
added, ``enable_thinking=False`` for templates that read it, as DeepSpec's evaluator does), then are encoded without
adding special tokens again. Without a chat template the text is encoded with the tokenizer's default special
tokens.

This module does not generate or time anything (``dsparkhub.verify.runner`` and the backends do). It sits below
``convert`` and ``verify`` (both read prompts); ``dsparkhub.verify.prompts`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dsparkhub.prompts.files import PromptFileError, PromptRecord, fetch_hub_file, jsonl_objects
from dsparkhub.prompts.speed_bench import read_categories

BUILTIN = ("math", "code", "chat")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class Dataset:
    """A named list of tokenized prompts.

    Attributes:
        name: dataset name shown in results and cards.
        source: where the prompts came from (a path, ``builtin:math``, ``hub:owner/name:file``).
        prompts: token ids per prompt, chat template applied where the tokenizer has one.
        texts: the prompt text per prompt (None for token-id records).
    """

    name: str
    source: str
    prompts: list[list[int]]
    texts: list[str | None] = field(default_factory=list)


# ---- reading ----------------------------------------------------------------------------------------------------


def read_jsonl(path: str | Path, *, source: str | None = None) -> list[PromptRecord]:
    """Read prompt records from a JSONL file (formats in the module docstring).

    Args:
        path: the file.
        source: name shown in errors instead of the path (for package data or Hub files).

    Raises:
        PromptFileError: the file does not exist, a line is not a JSON object, or an object has none of ``turns``
            / ``prompt`` / ``prompt_token_ids`` (or one of the wrong type); the message names the line number.
    """
    path = Path(path)
    shown = source or str(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file {shown} does not exist", path=None,
                              hint="pass an existing JSONL file, NAME=PATH, builtin[:math|code|chat] or hub:owner/name")
    records = []
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading BOM (some editors write one) is not JSON
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise PromptFileError(f"{shown} line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                              f"{exc.start})", hint="save the file as UTF-8 JSONL") from None
    for lineno, obj in jsonl_objects(text, shown):
        records.append(_record(obj, shown, lineno))
    if not records:
        raise PromptFileError(f"{shown} holds no prompts", hint="one JSON object per line")
    return records


def _record(obj: Any, shown: str, lineno: int) -> PromptRecord:
    where = f"{shown} line {lineno}"
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            raise PromptFileError(f"{where}: `prompt_token_ids` must be a non-empty list of non-negative integers")
        return PromptRecord(token_ids=list(ids), line=lineno)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise PromptFileError(f"{where}: `turns` must be a non-empty list whose first entry is a non-empty "
                                  f"string")
        return PromptRecord(text=turns[0], line=lineno)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise PromptFileError(f"{where}: `prompt` must be a non-empty string")
        return PromptRecord(text=obj["prompt"], line=lineno)
    keys = ", ".join(sorted(obj)) or "none"
    raise PromptFileError(f"{where}: no `turns`, `prompt` or `prompt_token_ids` key (found keys: {keys})",
                          hint='use {"turns": ["..."]}, {"prompt": "..."} or {"prompt_token_ids": [...]}')


def builtin_path(name: str) -> Path:
    """Path of a built-in smoke prompt file (``math``, ``code`` or ``chat``).

    Raises:
        PromptFileError: unknown name.
    """
    if name not in BUILTIN:
        raise PromptFileError(f"unknown built-in prompt set {name!r}; expected one of {', '.join(BUILTIN)}")
    return Path(str(resources.files("dsparkhub") / "data" / "prompts" / f"{name}.jsonl"))


# ---- specs ------------------------------------------------------------------------------------------------------


def parse_dataset_specs(specs: str | list[str] | tuple[str, ...] | None) -> list[tuple[str, str]]:
    """Split ``--datasets`` values into ``(name, spec)`` pairs, expanding ``builtin`` into its three sets.

    ``None`` or empty means the built-in smoke set.

    Raises:
        PromptFileError: an empty name, or two datasets with the same name.
    """
    if specs is None:
        specs = []
    if isinstance(specs, str):
        specs = [specs]
    items = [s.strip() for v in specs for s in v.split(",") if s.strip()] or ["builtin"]
    out: list[tuple[str, str]] = []
    for item in items:
        name, sep, spec = item.partition("=")
        if not sep:
            name, spec = "", item
        elif not name.strip():
            raise PromptFileError(f"dataset spec {item!r} has an empty name before '='")
        name = name.strip()
        if spec == "builtin":
            if name:
                raise PromptFileError(f"dataset spec {item!r}: `builtin` expands to {', '.join(BUILTIN)}; name "
                                      f"one set (NAME=builtin:math) or drop the name")
            out += [(b, f"builtin:{b}") for b in BUILTIN]
        elif spec.startswith("builtin:"):
            out.append((name or spec.split(":", 1)[1], spec))
        elif spec.startswith("speed-bench:"):  # expanded per category by load_datasets
            out.append((name or "speed-bench", spec))
        elif spec.startswith("hub:"):
            tail = spec[4:]
            default = Path(tail.split(":", 1)[1]).stem if ":" in tail else tail.split("/")[-1]
            out.append((name or default, spec))
        else:
            out.append((name or Path(spec).stem, spec))
    seen: set[str] = set()
    for name, spec in out:
        if name in seen:
            raise PromptFileError(f"two datasets are named {name!r}; give one a name with NAME=PATH")
        seen.add(name)
    return out


def read_spec(spec: str) -> tuple[list[PromptRecord], str]:
    """Read the records a spec points at; returns (records, source string for the results file: the spec for
    ``builtin:`` / ``hub:``, the file name and the first 16 hex digits of its sha256 for a local file)."""
    if spec.startswith("builtin:"):
        return read_jsonl(builtin_path(spec.split(":", 1)[1]), source=spec), spec
    if spec.startswith("hub:"):
        local, filename = fetch_hub_file(spec[4:])
        repo = spec[4:].split(":", 1)[0]
        source = f"hub:{repo}:{filename}"
        return read_jsonl(local, source=source), source
    from dsparkhub.io.hashing import sha256_file

    records = read_jsonl(spec)
    # a local file is recorded by its name and content hash: results and cards never publish local paths
    return records, f"{Path(spec).name} (sha256 {sha256_file(spec)[:16]})"


# ---- tokenizing -------------------------------------------------------------------------------------------------


def has_tokenizer(target: str | Path) -> bool:
    """True when the target folder holds tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...)."""
    folder = Path(target)
    return folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(target: str | Path):
    """The target's tokenizer (``transformers.AutoTokenizer``), or None when it has none.

    A local folder is read when it holds tokenizer files (a folder without them has no tokenizer: token-id
    prompts only). A Hub repo id (``owner/name``, not a local path) is loaded through the Hugging Face cache,
    which needs the network the first time. Anything else (a served model name) has no tokenizer here.

    Raises:
        PromptFileError: the tokenizer exists but transformers cannot load it, or a Hub target's tokenizer is
            neither cached nor reachable.
    """
    folder = Path(target)
    if folder.is_dir():
        if not has_tokenizer(folder):
            return None
    elif str(target).count("/") != 1 or str(target).startswith((".", "/")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(target))
    except (OSError, ValueError) as exc:
        hint = None if folder.is_dir() else ("download the target (huggingface-cli download) and pass its folder, "
                                             "or give prompts as prompt_token_ids")
        raise PromptFileError(f"cannot load the target's tokenizer from {target}: {exc}", hint=hint) from exc


def tokenize(record: PromptRecord, tokenizer) -> list[int]:
    """Token ids for one record (see the module docstring for the chat-template rule).

    Raises:
        PromptFileError: a text record but the target has no tokenizer.
    """
    if record.token_ids is not None:
        return list(record.token_ids)
    if tokenizer is None:
        raise PromptFileError(f"line {record.line} is a text prompt but the target has no tokenizer",
                              hint='give prompts as {"prompt_token_ids": [...]} for tokenizer-less targets')
    if getattr(tokenizer, "chat_template", None):
        chat = record.messages or [{"role": "user", "content": record.text}]
        text = tokenizer.apply_chat_template(chat, tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(record.text)["input_ids"])


def load_datasets(specs, target: str | Path | None, *, max_prompts: int | None = None,
                  tokenizer=None) -> list[Dataset]:
    """Read, cap and tokenize every dataset named by ``specs``.

    Args:
        specs: ``--datasets`` values (see :func:`parse_dataset_specs`); None = the built-in smoke set.
        target: the target folder whose tokenizer encodes text prompts (None or a non-folder: token-id prompts only).
        max_prompts: keep at most this many prompts per dataset (the first ones).
        tokenizer: use this tokenizer instead of loading one from ``target``.

    Raises:
        PromptFileError: a spec, file, line or prompt is unusable (see :func:`read_jsonl`, :func:`tokenize`);
            errors name the file and the line.
    """
    if max_prompts is not None and max_prompts < 1:
        raise PromptFileError(f"max_prompts must be at least 1, found {max_prompts}")
    if tokenizer is None and target is not None:
        tokenizer = load_tokenizer(target)
    out = []
    for name, spec, records, source in _read_all(parse_dataset_specs(specs)):
        records = records[:max_prompts] if max_prompts else records
        prompts = []
        for rec in records:
            try:
                prompts.append(tokenize(rec, tokenizer))
            except PromptFileError as exc:
                shown = source if spec.startswith(("builtin:", "hub:")) else spec  # errors name the local path
                raise PromptFileError(f"{shown}: {exc.message}", hint=exc.hint) from None
        out.append(Dataset(name=name, source=source, prompts=prompts, texts=[r.text for r in records]))
    return out


def _read_all(pairs: list[tuple[str, str]]):
    """``(name, spec, records, source)`` per dataset; a ``speed-bench:`` spec gives one per category."""
    for name, spec in pairs:
        if spec.startswith("speed-bench:"):
            for cat_name, records, source in read_categories(name, spec):
                yield cat_name, spec, records, source
        else:
            yield (name, spec, *read_spec(spec))
