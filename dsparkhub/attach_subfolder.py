"""Attach a drafter as a ``dspark/`` subfolder of the target — the layout SGLang 0.5.23 finds by itself.

SGLang's ``--speculative-algorithm DSPARK`` without ``--speculative-draft-model-path`` looks, after the bundled
``dspark_*`` keys (DeepSeek-V4 style, :mod:`dsparkhub.attach`), for ``<model_path>/dspark/config.json`` (a local
folder) or the Hub file ``dspark/config.json`` of the target repo, and loads that subfolder as the draft path
(``arg_groups/speculative_hook.py:622-663`` ``_target_checkpoint_dspark_subfolder``, used at ``:720-755``).

:func:`attach_subfolder` writes OUT = every file of the target, hard-linked (else symlinked, or copied when asked;
never rewritten), plus ``dspark/`` = the standalone output of ``dsparkhub convert`` (the ``vllm`` layout, which
SGLang reads unchanged). Unlike the V4 form this works for any target family (Qwen3, Gemma4, ...), and vLLM 0.32
serves the same drafter with ``"model": "OUT/dspark"`` in ``--speculative-config`` (vLLM does not look for the
subfolder itself). vLLM 0.34 does look for it, for MiniMax-M3 targets only (``model_type`` ``minimax_m3_text`` /
``minimax_m3_vl``: ``v1/worker/gpu/spec_decode/dspark/config.py:41-45`` ``DSparkSpeculatorConfig.default_model`` ->
``config/speculative.py:137-155`` ``_get_minimax_m3_dspark_draft``, same ``dspark/config.json`` test;
tests/test_vllm034.py runs it on OUT); a MiniMax-M3 DSpark drafter (``DSparkMiniMaxDraftModel``) is written there in
its own ``minimax-m3-dspark`` layout, what ``--to vllm`` means for that family (tests/conformance/test_minimax_m3_dspark.py
runs 0.34's lookup on a MiniMax-M3 target skeleton). ``detach`` is not needed: ``OUT/dspark`` already is the standalone drafter.

OUT also gets :data:`RECORD`, naming the target files placed there: the marker that lets ``--overwrite`` replace
OUT (and only when it holds nothing else: :mod:`dsparkhub.io.ownership`).

Does not: rewrite the target's ``config.json`` or index (the subfolder is found by its path alone).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub import __version__
from dsparkhub.attach import LINK_MODES, _place, _target_files
from dsparkhub.convert import convert
from dsparkhub.errors import ConversionRefusedError
from dsparkhub.io.output import atomic_output, refuse_overlap, write_json
from dsparkhub.io.ownership import claim_output

__all__ = ["SUBFOLDER", "SubfolderAttachResult", "attach_subfolder"]

#: sglang 0.5.23 arg_groups/speculative_hook.py:622 (_DSPARK_DRAFT_SUBFOLDER)
SUBFOLDER = "dspark"
#: what OUT holds besides the target's files and dspark/: which command wrote it and the target files it placed
RECORD = "dsparkhub_attach_subfolder.json"


@dataclass
class SubfolderAttachResult:
    """What :func:`attach_subfolder` wrote.

    Attributes:
        out: the target folder with the drafter under ``dspark/``. linked: target files placed in OUT,
            name -> ``"hardlink"`` | ``"symlink"`` | ``"copy"``. draft_files: files written under ``dspark/``.
        notes: conversion notes (from ``convert``).
    """

    out: Path
    linked: dict[str, str]
    draft_files: list[str]
    notes: list[str] = field(default_factory=list)


def attach_subfolder(draft: str | Path, target_dir: str | Path, out: str | Path, *, layout: str | None = None,
                     link: str = "auto", overwrite: bool = False, force: bool = False,
                     max_shard_bytes: int | None = None) -> SubfolderAttachResult:
    """Write OUT = the target in ``target_dir`` plus ``dspark/`` = ``draft`` converted to the standalone layout.

    Args:
        draft: drafter folder in any known layout.
        target_dir: a local target checkpoint folder (any family) without a ``dspark/`` subfolder.
        out: output folder; must not exist unless ``overwrite``.
        layout: force the drafter's layout instead of detecting it.
        link: ``"auto"`` (hard link, else symlink), ``"hardlink"``, ``"symlink"`` or ``"copy"``.
        overwrite: replace an existing ``out`` atomically, when dsparkhub wrote it and it holds nothing else.
        force: convert even when validation against the target reports errors.
        max_shard_bytes: cap of the drafter's shards.

    Returns:
        :class:`SubfolderAttachResult`.

    Raises:
        ConversionRefusedError: unknown link mode, the target already has a ``dspark/`` subfolder, or hard-linking
            was required and failed.
        ValidationFailedError, OutputExistsError, OutputNotWritableError, CheckpointNotFoundError, LayoutError: see
            :func:`convert`.
    """
    if link not in LINK_MODES:
        raise ConversionRefusedError(f"unknown link mode {link!r}; expected one of {LINK_MODES}")
    target_dir, out = Path(target_dir), Path(out)
    refuse_overlap(out, {"drafter": draft, "target": target_dir})
    claim_output(out, overwrite=overwrite)
    if (target_dir / SUBFOLDER).exists():
        raise ConversionRefusedError(f"the target already has a {SUBFOLDER}/ subfolder; attaching would mix two "
                                     "drafters", path=target_dir / SUBFOLDER,
                                     hint="attach into a target without one")
    linked: dict[str, str] = {}
    with atomic_output(out, overwrite=overwrite) as tmp:
        # the drafter first: a conversion refused against the target leaves nothing behind
        result = convert(draft, tmp / SUBFOLDER, target_dir, layout=layout, force=force,
                         max_shard_bytes=max_shard_bytes)
        for src in _target_files(target_dir):
            rel = src.relative_to(target_dir).as_posix()
            linked[rel] = _place(src, tmp / rel, link)
        write_json(tmp / RECORD, {"tool": "dsparkhub", "version": __version__,
                                  "command": "convert --attach-as dspark-subfolder",
                                  "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                                  "target": target_dir.resolve().name, "files": linked})
    files = sorted(p.relative_to(out / SUBFOLDER).as_posix() for p in (out / SUBFOLDER).rglob("*") if p.is_file())
    return SubfolderAttachResult(out, linked, files, list(result.plan.draft.spec.notes))
