"""Attach a drafter inside a DeepSeek-V4-style target checkpoint, and detach it again.

DeepSeek ships V4 DSpark drafters *inside* the target: ``mtp.{0..S-1}.*`` tensors in extra shard files, the
``dspark_*`` keys in the target's ``config.json`` and the shards listed in ``model.safetensors.index.json``
(FORMATS §6; fraserprice/dspark-vllm ``DSparkDraftModel.load_weights``). :func:`attach` builds that form from a
standalone drafter without rewriting the target:

- every file of the target folder is hard-linked into OUT (same filesystem), else symlinked, or copied when asked;
  ``config.json`` and the index are the only target files rewritten (new files, the originals are untouched);
- the drafter's tensors are written to new shards ``model-dspark-XXXXX-of-YYYYY.safetensors`` under the names of the
  ``deepseek-v4`` recipe (``layers.{i}.*`` -> ``mtp.{i}.*``; ``fc`` / ``hidden_norm`` / ``norm`` / heads on the last
  stage as ``main_proj`` / ``main_norm`` / ...);
- ``dsparkhub_attach.json`` records what was added, the drafter's original config and file layout, and what was left
  out because the target already holds it (embedding / LM-head copies byte-identical to the target's);
- the work is proportional to the drafter's bytes: target shards are read only for their headers, and the target's
  embedding / LM head only when the drafter carries copies to compare (counted in ``target_data_bytes_read``).

:func:`detach` is the inverse: with an attach record it restores the drafter exactly as it was (same config bytes,
same files, same tensor names and bytes); without one (a checkpoint DeepSeek shipped) it extracts the ``mtp.*``
tensors and the config into a standalone folder the ``deepseek-v4`` recipe reads.

Does not: convert the drafter's architecture (a Qwen3 drafter stays a Qwen3 drafter under ``mtp.*`` names; vLLM's V4
DSpark class expects V4 decoder stages) — it only places tensors and keys.
"""

from __future__ import annotations

import base64
import datetime as _dt
import os
import struct
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub import __version__
from dsparkhub.io.attach_record import ATTACH_RECORD, file_identity
from dsparkhub.io.checkpoint import INDEX_NAME, open_checkpoint, read_json
from dsparkhub.io.header import parse_header_bytes
from dsparkhub.errors import (CheckpointFormatError, ConversionRefusedError, LayoutError)
from dsparkhub.io.hashing import sha256_file
from dsparkhub.io.sharding import plan_shards
from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.layouts.recipes import get_recipe
from dsparkhub.target import target_from_checkpoint
from dsparkhub.validate import validate
from dsparkhub.validate.report import validation_error
from dsparkhub.io.writer import SourceBytes, background_flush, write_file, write_json, write_safetensors, write_shards
from dsparkhub.io.output import atomic_output, refuse_overlap
from dsparkhub.io.ownership import claim_output

DRAFT_SHARD = "model-dspark-{k:05d}-of-{n:05d}.safetensors"
#: what :func:`detach` writes beside the drafter's files: which command wrote the folder, from what, and its files
#: (the marker that lets ``--overwrite`` replace it: :mod:`dsparkhub.io.ownership`)
DETACH_RECORD = "dsparkhub_detach.json"
#: target model types whose config vLLM reads ``dspark_*`` keys from (V4 DSpark, vLLM 0.32 / dspark-vllm overlay)
V4_MODEL_TYPES = ("deepseek_v4", "deepseek_v41")
LINK_MODES = ("auto", "hardlink", "symlink", "copy")
DEFAULT_SHARD_BYTES = 4 << 30
_SHARED_WITH_TARGET = {"embed_tokens.weight": "embed", "lm_head.weight": "lm_head"}


@dataclass
class AttachResult:
    """What :func:`attach` wrote.

    Attributes:
        out: the attached checkpoint folder.
        linked: target files placed in OUT, name -> ``"hardlink"`` | ``"symlink"`` | ``"copy"``.
        added_files: new drafter shard files.
        tensors: layout name in OUT -> the drafter's own tensor name.
        dropped: drafter tensors not written, with the reason.
        config_keys: keys added to (or replaced in) the target's config.json.
        target_data_bytes_read: bytes of target tensor data read (0 unless embedding copies were compared).
        drafter_bytes_written: bytes of drafter tensor data written.
    """

    out: Path
    linked: dict[str, str]
    added_files: list[str]
    tensors: dict[str, str]
    dropped: list[dict]
    config_keys: dict
    target_data_bytes_read: int
    drafter_bytes_written: int
    notes: list[str] = field(default_factory=list)


def _place(src: Path, dst: Path, mode: str) -> str:
    """Link (or copy) one target file into the output; returns how it was placed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if mode in ("auto", "hardlink"):
        try:
            os.link(src, dst)
            return "hardlink"
        except OSError as exc:
            if mode == "hardlink":
                raise ConversionRefusedError(f"cannot hard-link {src} into the output ({exc.strerror}); the output "
                                             "must be on the target's filesystem", path=dst,
                                             hint="pass --symlink or --copy, or put --out on the same filesystem")
    if mode in ("auto", "symlink"):
        os.symlink(src.resolve(), dst)
        return "symlink"
    shutil.copy2(src, dst)
    return "copy"


def _target_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if (p.is_file() or p.is_symlink()) and not p.is_dir())


def dspark_config_keys(spec, model_type: str) -> dict:
    """The ``dspark_*`` keys (and ``n_mtp_layers``) that describe ``spec`` in a V4 target config.

    Key names come from the ``deepseek-v4`` recipe's ``fields``; ``dspark_target_layer_ids`` is written in
    hidden-state numbering for ``deepseek_v4`` (vLLM subtracts 1) and as layer indices for ``deepseek_v41``.
    """
    recipe = get_recipe("deepseek-v4")
    numbering = recipe.data["target_layer_ids_numbering"]["values"].get(model_type, "hidden_state_index")
    values = {"block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
              "target_layer_ids": [i + 1 if numbering == "hidden_state_index" else i for i in spec.target_layer_ids],
              "markov_rank": spec.markov_rank, "confidence_head": spec.confidence_head,
              "confidence_head_with_markov": spec.confidence_head_with_markov or None}
    out = {recipe.write_key(k): v for k, v in values.items() if recipe.write_key(k) and v is not None}
    out["n_mtp_layers"] = spec.num_layers
    return out


def _drafter_layout(d: OpenedDraft) -> dict:
    """How the drafter's files are laid out, to restore them byte for byte: per file its safetensors header (base64
    of the exact bytes) and its tensors in data order; the index as parsed."""
    ck = d.checkpoint
    by_file: dict[str, list] = {}
    for name, info in ck.tensors.items():
        by_file.setdefault(info.file, []).append(info)
    files = {}
    for f in ck.files:
        with open(ck.file_path(f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = fh.read(n)
        files[f] = {"header_b64": base64.b64encode(header).decode(),
                    "tensors": [i.name for i in sorted(by_file.get(f, []), key=lambda i: i.start)]}
    return {"files": files, "index": ck.index}


def attach(draft: str | Path, target_dir: str | Path, out: str | Path, *, layout: str | None = None,
           link: str = "auto", overwrite: bool = False, force: bool = False,
           max_shard_bytes: int | None = None) -> AttachResult:
    """Write OUT = the target in ``target_dir`` with ``draft`` attached as a DeepSeek-V4-style DSpark drafter.

    Args:
        draft: drafter folder in any known layout (DeepSpec run / step folder, vLLM, speculators, ...).
        target_dir: a local DeepSeek-V4 / V4.1 checkpoint folder (``model_type`` ``deepseek_v4`` / ``deepseek_v41``)
            without a drafter.
        out: output folder; must not exist unless ``overwrite``.
        layout: force the drafter's layout instead of detecting it.
        link: ``"auto"`` (hard link, else symlink), ``"hardlink"``, ``"symlink"`` or ``"copy"``.
        overwrite: replace an existing ``out`` atomically, when dsparkhub wrote it and it holds nothing else.
        force: attach even when validation against the target reports errors.
        max_shard_bytes: cap of the new drafter shards (default 4 GiB).

    Returns:
        :class:`AttachResult`.

    Raises:
        ConversionRefusedError: the target is not a V4-style checkpoint, already holds ``mtp.*`` tensors, the
            drafter has a reduced draft vocab or an embedding / LM-head copy that differs from the target's, or
            hard-linking was required and failed.
        ValidationFailedError: the drafter fails validation against the target (unless ``force``); among others a
            drafter whose family is not DeepSeek-V4 (DSH311): vLLM 0.32 serves an attached drafter with
            ``DSparkDeepseekV4ForCausalLM``, whose stages are V4 decoder layers with a bias-less [1, H + r]
            confidence head and ``hc_head_*`` (vllm/models/deepseek_v4/nvidia/dspark.py), so a Qwen3 / Gemma4
            drafter attached with ``force`` is written but cannot be loaded there.
        OutputExistsError / OutputNotWritableError: see :func:`dsparkhub.io.ownership.claim_output` (checked first).
        CheckpointNotFoundError, CheckpointFormatError, LayoutError: see the readers / writer.
    """
    if link not in LINK_MODES:
        raise ConversionRefusedError(f"unknown link mode {link!r}; expected one of {LINK_MODES}")
    target_dir = Path(target_dir)
    out = Path(out)
    refuse_overlap(out, {"drafter": draft, "target": target_dir})
    claim_output(out, overwrite=overwrite)
    d = open_draft(draft, layout=layout)
    refuse_overlap(out, {"drafter step": d.checkpoint.path})
    spec = d.spec
    # lazy: a 160 GB target's shard headers are parsed only where needed (embedding / LM head); names come from
    # its index
    tck = open_checkpoint(target_dir, lazy=True)
    model_type = tck.config.get("model_type")
    if model_type not in V4_MODEL_TYPES:
        raise ConversionRefusedError(
            f"attaching writes a DeepSeek-V4-style checkpoint, but the target's model_type is {model_type!r}; vLLM "
            f"reads attached `mtp.*` drafters and `dspark_*` keys only for {', '.join(V4_MODEL_TYPES)}",
            path=target_dir / "config.json", hint="convert the drafter to a standalone layout instead (--to vllm)")
    existing = sorted(n for n in tck.tensors if n.startswith("mtp."))
    if existing:
        raise ConversionRefusedError(
            f"the target already holds {len(existing)} `mtp.*` tensors (e.g. {existing[0]!r}); attaching would mix "
            "two drafters", path=target_dir, hint="detach the existing one first (`dsparkhub detach`) and attach "
                                                  "into a target without mtp.* tensors")
    if spec.draft_vocab_size != spec.vocab_size or "d2t" in spec.tensors:
        raise ConversionRefusedError(
            f"the drafter has a reduced draft vocab ({spec.draft_vocab_size} of {spec.vocab_size}); an attached V4 "
            "drafter shares the target's LM head and has no d2t table", path=d.checkpoint.path)
    tspec = target_from_checkpoint(tck, str(target_dir))
    report = validate(d, tspec)
    if not report.ok and not force:
        raise validation_error(report, against=str(target_dir), refusing="nothing was attached", path=d.checkpoint.path,
                               hint="run `dsparkhub validate DRAFT --target TARGET`, or pass --force")
    v4 = get_recipe("deepseek-v4")
    target_read = 0
    dropped: list[dict] = []
    plan: list[tuple[str, str]] = []  # (name in OUT, canonical)
    for canon in sorted(spec.tensors):
        which = _SHARED_WITH_TARGET.get(canon)
        if which:
            ref = getattr(tspec, which)
            mine = spec.tensors[canon]
            if ref is None or ref.shape != mine.shape or ref.dtype != mine.dtype:
                raise ConversionRefusedError(
                    f"the drafter carries its own {canon} ({mine.dtype} {list(mine.shape)}) but the target's "
                    f"{'is missing' if ref is None else f'{ref.name} is {ref.dtype} {list(ref.shape)}'}; an attached "
                    "drafter uses the target's", path=d.checkpoint.path)
            own = d.checkpoint.tensor_sha256(spec.source_names[canon])
            theirs = tck.tensor_sha256(ref.name)
            target_read += ref.nbytes
            if own != theirs:
                raise ConversionRefusedError(
                    f"the drafter's {canon} differs from the target's {ref.name} (sha256 {own[:12]} vs "
                    f"{theirs[:12]}); an attached drafter uses the target's, so attaching would change it",
                    path=d.checkpoint.path)
            dropped.append({"name": spec.source_names[canon], "canonical": canon, "target_tensor": ref.name,
                            "reason": f"byte-identical to the target's {ref.name}"})
            continue
        try:
            plan.append((v4.to_layout(canon, num_layers=spec.num_layers), canon))
        except LayoutError as exc:
            raise ConversionRefusedError(f"the drafter's tensor {spec.source_names[canon]!r} has no place in an "
                                         f"attached V4 drafter: {exc.message}", path=d.checkpoint.path) from None
    clash = sorted({n for n, _ in plan} & set(tck.tensors))
    if clash:
        raise ConversionRefusedError(f"drafter tensors would overwrite target tensors: {clash[:3]}", path=target_dir)

    cap = max_shard_bytes or DEFAULT_SHARD_BYTES
    by_name = {item[0]: item for item in plan}
    groups = [[by_name[n] for n in shard]
              for shard in plan_shards([(n, spec.tensors[src].nbytes) for n, src in plan], cap)]
    names = [DRAFT_SHARD.format(k=k + 1, n=len(groups)) for k in range(len(groups))]
    taken = sorted(set(names) & {p.name for p in target_dir.iterdir()})
    if taken:
        raise ConversionRefusedError(f"the target already has files named like drafter shards: {taken}",
                                     path=target_dir)

    linked: dict[str, str] = {}
    written = 0
    keys = dspark_config_keys(spec, model_type)
    with atomic_output(out, overwrite=overwrite) as tmp, background_flush() as flush:
        for src in _target_files(target_dir):
            rel = src.relative_to(target_dir).as_posix()
            if rel in ("config.json", INDEX_NAME, ATTACH_RECORD):
                continue
            linked[rel] = _place(src, tmp / rel, link)
        for fname, group in zip(names, groups):
            # streamed file to file (writer.SourceBytes): the drafter's bytes never enter memory, torch not needed
            payloads = []
            for out_name, canon in group:
                info = spec.tensors[canon]
                payloads.append((out_name, SourceBytes.of(d.checkpoint.file_path(info), info)))
                written += info.nbytes
            write_safetensors(tmp / fname, payloads, {"format": "pt", "dsparkhub": "attached drafter"})
            flush(tmp / fname)  # on disk while the index and configs are written
        weight_map = dict(tck.index["weight_map"]) if tck.index else {n: i.file for n, i in tck.tensors.items()}
        for fname, group in zip(names, groups):
            weight_map.update({n: fname for n, _ in group})
        old_meta = (tck.index or {}).get("metadata") or {}
        # the index's own total when it has one: summing every header would parse all of a 160 GB target's shards
        total = old_meta.get("total_size") if type(old_meta.get("total_size")) is int else tck.total_bytes
        index = {"metadata": {**old_meta, "total_size": total + written}, "weight_map": weight_map}
        write_json(tmp / INDEX_NAME, index, indent=None)  # the target's ~70k entries: C encoder
        config = dict(tck.config)
        config.update(keys)
        write_json(tmp / "config.json", config)
        record = {
            "tool": "dsparkhub", "version": __version__, "command": "attach",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "target": {"path": str(target_dir.resolve()), "model_type": model_type,
                       "config_sha256": sha256_file(target_dir / "config.json"), "files": linked,
                       # identity of each symlinked file: dsparkhub's readers follow a link out of OUT only to the
                       # very file (device, inode, size) attach linked, which a folder made elsewhere cannot name
                       "links": {rel: file_identity(target_dir / rel) for rel, how in linked.items()
                                 if how == "symlink"},
                       "index_sha256": sha256_file(target_dir / INDEX_NAME) if tck.index else None},
            "drafter": {"path": str(Path(d.checkpoint.path).resolve()), "layout": d.recipe.name,
                        "config": d.checkpoint.config,
                        # verbatim, so that detach gives back the same bytes
                        "config_text": (Path(d.checkpoint.path) / "config.json").read_text(),
                        "config_sha256": sha256_file(Path(d.checkpoint.path) / "config.json"),
                        "files": _drafter_layout(d)},
            "added": {"files": names, "config_keys": keys,
                      "tensors": {n: spec.source_names[c] for n, c in plan}},
            "dropped": dropped,
            "target_data_bytes_read": target_read, "drafter_bytes_written": written,
        }
        write_json(tmp / ATTACH_RECORD, record)
    notes = []
    if spec.family != "deepseek-v4":
        notes.append(f"the drafter is a {spec.family} drafter placed under mtp.* names; vLLM's V4 DSpark class "
                     "expects V4 decoder stages, so this checkpoint is for storage / transport, not V4 serving")
    return AttachResult(out, linked, names, {n: spec.source_names[c] for n, c in plan}, dropped, keys, target_read,
                        written, notes)


@dataclass
class DetachResult:
    """What :func:`detach` wrote: the folder, its files, and whether it restored a recorded drafter exactly."""

    out: Path
    files: list[str]
    restored: bool
    layout: str
    drafter_bytes_read: int


def detach(attached: str | Path, out: str | Path, *, overwrite: bool = False) -> DetachResult:
    """Extract the drafter of an attached checkpoint into a standalone folder, reading only the drafter's bytes.

    With ``dsparkhub_attach.json`` (written by :func:`attach`) the drafter comes back exactly as it was: its original
    ``config.json`` bytes, files, tensor names and tensor bytes (embedding / LM-head copies that were left out are
    read back from the target's, which were byte-identical). Without it (a checkpoint DeepSeek shipped), OUT holds the
    attached ``config.json`` and the ``mtp.*`` tensors under their own names (the ``deepseek-v4`` recipe reads it).
    Either way OUT also holds :data:`DETACH_RECORD` (which names the files written; ``--overwrite`` replaces only a
    folder with such a marker and nothing else).

    Args:
        attached: the attached checkpoint folder.
        out: output folder (must not exist unless ``overwrite``).
        overwrite: replace an existing ``out`` atomically, when dsparkhub wrote it and it holds nothing else.

    Returns:
        :class:`DetachResult`.

    Raises:
        CheckpointFormatError: the attach record names tensors the checkpoint lacks.
        LayoutError: no ``mtp.*`` tensors and no record.
        OutputExistsError / OutputNotWritableError: ``out`` exists (without ``overwrite``), is not dsparkhub's to
            replace or cannot be written (:func:`dsparkhub.io.ownership.claim_output`), or is, holds or lies in
            ``attached``.
        CheckpointNotFoundError: see the reader.
    """
    attached = Path(attached)
    refuse_overlap(out, {"attached checkpoint": attached})
    claim_output(out, overwrite=overwrite)
    ck = open_checkpoint(attached)
    record_path = attached / ATTACH_RECORD
    bytes_read = 0
    if not record_path.exists():
        d = open_draft(attached, layout="deepseek-v4")

        def raw(info):  # streamed file to file by the kernel: no tensor enters memory
            return lambda: SourceBytes.of(ck.file_path(info), info)

        # in the order the tensors lie in the target's shards: the copies then coalesce into a few long ranges
        tensors = sorted(d.spec.tensors.items(), key=lambda kv: (str(ck.file_path(kv[1])), kv[1].start))
        items = [(d.spec.source_names[c], i.nbytes, raw(i)) for c, i in tensors]
        with atomic_output(out, overwrite=overwrite) as tmp:
            files = write_shards(tmp, items, max_shard_bytes=DEFAULT_SHARD_BYTES)
            shutil.copyfile(attached / "config.json", tmp / "config.json")
            _write_detach_record(tmp, attached, [*files, "config.json"], restored=False)
        return DetachResult(Path(out), files + ["config.json"], False, "deepseek-v4", sum(n for _, n, _ in items))

    rec = read_json(record_path, ATTACH_RECORD)
    drafter = rec["drafter"]
    source_to_layout = {src: lay for lay, src in rec["added"]["tensors"].items()}
    from_target = {x["name"]: x["target_tensor"] for x in rec.get("dropped", [])}
    missing = sorted(n for n in source_to_layout.values() if n not in ck.tensors)
    if missing:
        raise CheckpointFormatError(f"{ATTACH_RECORD} lists drafter tensors the checkpoint lacks: {missing[:3]}",
                                    path=attached)
    files = drafter["files"]["files"]
    with atomic_output(out, overwrite=overwrite) as tmp:
        for fname, entry in files.items():
            header = base64.b64decode(entry["header_b64"])
            infos, _ = parse_header_bytes(header, file=fname, data_size=None)
            copies = []
            for name in entry["tensors"]:  # data order of the original file
                where = source_to_layout.get(name) or from_target.get(name)
                if where is None:
                    raise CheckpointFormatError(f"{ATTACH_RECORD}: drafter tensor {name!r} is neither attached "
                                                "nor taken from the target", path=attached)
                info, orig = ck.tensors[where], infos[name]
                if (info.dtype, info.shape) != (orig.dtype, orig.shape):
                    raise CheckpointFormatError(
                        f"attached tensor {where!r} is {info.dtype} {list(info.shape)} but the drafter's "
                        f"{name!r} was {orig.dtype} {list(orig.shape)}", path=attached)
                copies.append((SourceBytes.of(ck.file_path(info), info), orig.start, name))
                bytes_read += info.nbytes
            (tmp / fname).parent.mkdir(parents=True, exist_ok=True)
            write_file(tmp / fname, struct.pack("<Q", len(header)) + header, copies)
        if drafter["files"].get("index") is not None:
            write_json(tmp / INDEX_NAME, drafter["files"]["index"])
        if isinstance(drafter.get("config_text"), str):
            (tmp / "config.json").write_text(drafter["config_text"])
        else:
            write_json(tmp / "config.json", drafter["config"])
        written = [*files, *([INDEX_NAME] if drafter["files"].get("index") is not None else []), "config.json"]
        _write_detach_record(tmp, attached, written, restored=True)
    return DetachResult(Path(out), sorted(files) + ["config.json"], True, drafter["layout"], bytes_read)


def _write_detach_record(tmp: Path, attached: Path, files: list[str], *, restored: bool) -> None:
    """:data:`DETACH_RECORD`: the attached checkpoint by folder name (no local path: the drafter may be pushed), the
    files written and whether they are the recorded drafter restored; readers of the drafter ignore it."""
    write_json(tmp / DETACH_RECORD, {
        "tool": "dsparkhub", "version": __version__, "command": "detach",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "attached": attached.resolve().name, "restored": restored, "files": sorted(files)})
