"""Convert a drafter from any known layout into another, by default the standalone layout vLLM 0.32 loads.

Flow (one way): source headers -> recipe detected -> :class:`DraftSpec` -> :func:`plan_conversion` (headers only,
plus hashing of the embedding / LM-head bytes to decide whether the copies can be dropped; nothing written) ->
:func:`convert` streams tensors one by one into a temporary folder next to OUT, writes ``config.json`` and
``dsparkhub_provenance.json``, and renames the folder into place.

Rules:
- the pre-conversion ``validate`` against the target must pass (``force`` overrides, and is recorded);
- the block layout never changes silently: an anchor-first drafter cannot be written in a layout that only
  expresses 1+N (and vice versa) -> :class:`ConversionRefusedError`;
- ``embed_tokens`` / ``lm_head`` copies are dropped when byte-identical to the target's (vLLM 0.32
  ``load_dspark_model`` then shares the target's), kept and reported when they differ or cannot be compared;
- training files (``train_config.py``, ``training_state.*.pt``) are never copied or executed; a few literal
  values of ``train_config.py`` and the step are parsed into the provenance's ``training`` (``training_facts``);
- the side files vLLM reads from a drafter folder (:data:`CARRIED_FILES`) are copied byte for byte, never loaded.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import threading
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from dsparkhub import __version__
from dsparkhub.io.header import tensor_nbytes
from dsparkhub.io.pickle_weights import pickle_weight_files
from dsparkhub.layouts.deepspec_run import resolve_step_dir, training_facts
from dsparkhub.io.hashing import sha256_file, sha256_files, target_fingerprint
from dsparkhub.layouts.writing import DERIVED_TENSORS
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.target import TargetSpec, target_repo_id
from dsparkhub.io.writer import SourceBytes, write_json, write_shards
from dsparkhub.io.output import atomic_output, refuse_overlap
from dsparkhub.io.ownership import claim_output
from dsparkhub.convert.plan import CARRIED_FILES, ConversionPlan, ConversionResult, derived_nbytes, plan_conversion

#: the provenance file a conversion writes beside the weights (read by ``dsparkhub.card`` and ``dsparkhub.hub.push``).
PROVENANCE_FILE = "dsparkhub_provenance.json"


def _source_files(d: OpenedDraft) -> list[Path]:
    folder = Path(d.checkpoint.path)
    files = [folder / "config.json"] + [folder / f for f in d.checkpoint.files] + [folder / f for f in CARRIED_FILES]
    if d.checkpoint.index is not None:
        files.append(folder / "model.safetensors.index.json")
    return [p for p in files if p.exists()]


def _pickle_origin_files(folder: Path) -> list[Path]:
    """What provenance hashes for an ``--allow-pickle`` source: its ``config.json`` and its pickle weights."""
    return [p for p in [folder / "config.json", *(folder / n for n in pickle_weight_files(folder))] if p.exists()]


@contextmanager
def _watch_bytes(folder: Path, total: int, progress: Callable[[str, int, int], None] | None, every_s: float = 0.2):
    """While the body runs, report ``progress("write", bytes of *.safetensors in folder, total)`` from a thread (the
    writer streams file to file and has no hook); a last call reports ``total`` when the body succeeded."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def poll():
        last = -1
        while not stop.wait(every_s):
            done = min(total, sum(p.stat().st_size for p in folder.glob("*.safetensors") if p.is_file()))
            if done > last:
                progress("write", done, total)
                last = done

    thread = threading.Thread(target=poll, name="dsparkhub-convert-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    progress("write", total, total)


def check_output(out: str | Path, plan: ConversionPlan, *, src: str | Path, overwrite: bool = False,
                 pickle_origin: str | Path | None = None) -> None:
    """The output checks :func:`convert` makes before writing, for ``--dry-run`` to make too (a dry run that passes
    is a run the real command accepts).

    Raises:
        OutputExistsError / OutputNotWritableError: ``out`` cannot be claimed
            (:func:`dsparkhub.io.ownership.claim_output`: it exists without ``overwrite``, or is not dsparkhub's to
            replace; it lies under a file, is the current folder, or its folder is read-only), or ``out`` is, holds
            or lies in the source or target folder (:func:`dsparkhub.io.output.refuse_overlap`).
    """
    out = Path(out)
    refuse_overlap(out, {"drafter": src, "drafter step": plan.draft.checkpoint.path, "pickle source": pickle_origin,
                         "target": plan.target.source if plan.target is not None and plan.target.local else None})
    claim_output(out, overwrite=overwrite)


def _target_record(t: TargetSpec, base_model: str | None) -> dict:
    """Provenance of the target: Hub id (``base_model``, else :func:`dsparkhub.target.target_repo_id`), and for a
    local folder its ``config.json`` sha256 and header fingerprint; the folder's own name only when no Hub id is
    known (never a local path: this file is published)."""
    repo, how = (base_model, "--base-model") if base_model else target_repo_id(t)
    folder = Path(t.checkpoint.path) if t.local else None  # a Hub id read from the HF cache is local too
    name = folder.resolve().name if folder is not None and not repo else None
    return {"source": repo or name or t.source, "repo_id": repo,
            "repo_id_from": how if repo else None, "name": name,
            "config_sha256": sha256_file(folder / "config.json") if folder is not None else None,
            "header_fingerprint": target_fingerprint(folder) if folder is not None else None}


def convert(src: str | Path, out: str | Path, target: str | Path | TargetSpec | None, *, to: str = "vllm",
            layout: str | None = None, overwrite: bool = False, force: bool = False, keep_embeddings: bool = False,
            max_shard_bytes: int | None = None, plan: ConversionPlan | None = None,
            pickle_origin: str | Path | None = None, allow_different_embeddings: bool = False,
            base_model: str | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> ConversionResult:
    """Convert ``src`` into ``out`` (see the module docstring for the rules).

    Args:
        src, target, to, layout, force, keep_embeddings, allow_different_embeddings: as in :func:`plan_conversion`.
        out: output folder; must not exist unless ``overwrite``.
        overwrite: replace an existing ``out`` that dsparkhub wrote and that holds nothing else (atomically: the old
            one is removed only after the new one is in place).
        max_shard_bytes: output shard cap (default: the largest tensor + 256 MiB).
        plan: a plan already made by :func:`plan_conversion` (skips planning).
        pickle_origin: the folder the user named when ``src`` is the temporary safetensors copy of its pickle
            weights (``--allow-pickle``, :func:`dsparkhub.io.pickle_weights.pickle_as_safetensors`): provenance then
            records that folder and the sha256 of its own pickle files, not the temporary copy.
        base_model: the target's Hub repo id, recorded in provenance (``target.repo_id``) and ``validation.json``,
            written into config keys that name the target (speculators) and used by the card; default: the plan's
            (``options["base_model"]``), else found by :func:`dsparkhub.target.target_repo_id` (config
            ``_name_or_path``, manifests).
        progress: called as ``progress(phase, done, total)``: ``"write"`` with bytes on disk of the planned total
            (polled every 0.2 s while the shards are written), then ``"hash"`` with source files hashed (the
            provenance hash, which runs beside the copy). The CLI draws bars on stderr from it.

    Returns:
        :class:`ConversionResult`.

    Raises:
        OutputExistsError / OutputNotWritableError: see :func:`check_output` (checked before any work, and again
            before the output is moved into place).
        everything :func:`plan_conversion` raises.
    """
    out = Path(out)
    refuse_overlap(out, {"drafter": src, "pickle source": pickle_origin})  # before planning: refusals cost nothing
    claim_output(out, overwrite=overwrite)
    plan = plan or plan_conversion(src, target, to=to, layout=layout, force=force, keep_embeddings=keep_embeddings,
                                   allow_different_embeddings=allow_different_embeddings, base_model=base_model)
    base_model = base_model or plan.options.get("base_model")
    d = plan.draft
    check_output(out, plan, src=src, overwrite=overwrite, pickle_origin=pickle_origin)
    # the source files are hashed (for provenance) on a second core while the tensors are copied
    hasher = ThreadPoolExecutor(max_workers=1)
    origin = resolve_step_dir(pickle_origin) if pickle_origin is not None else None
    src_future = hasher.submit(sha256_files, _source_files(d) if origin is None else _pickle_origin_files(origin))
    readers: dict[str, object] = {}

    def loader(info):
        def load():
            from safetensors import safe_open

            # keep only the current source shard open (tensors are sorted so shards are mostly sequential)
            if info.file not in readers:
                readers.clear()
                readers[info.file] = safe_open(str(d.checkpoint.file_path(info)), framework="pt")
            return readers[info.file].get_tensor(info.name)
        return load

    def raw(info):  # plain copies stream file to file (writer.SourceBytes): no tensor enters memory
        return lambda: SourceBytes.of(d.checkpoint.file_path(info), info)

    # in the order the tensors lie in the source files, so that the output shards follow the sources front to back
    # (read once from the disk, by whichever of the copy and the provenance hash is ahead)
    copies = sorted(plan.copies, key=lambda c: (str(d.checkpoint.file_path(d.spec.tensors[c.name])),
                                                d.spec.tensors[c.name].start))
    items = [(c.out_name, d.spec.tensors[c.name].nbytes, raw(d.spec.tensors[c.name])) for c in copies]

    def derive(name):
        inputs, fn, _ = DERIVED_TENSORS[name]
        return lambda: fn(d.spec, lambda n: loader(d.spec.tensors[n])())

    items += [(x.out_name, derived_nbytes(d.spec, x.name), derive(x.name)) for x in plan.derived]
    items += [(x.out_name, tensor_nbytes(*plan.computed[x.name][:2]), plan.computed[x.name][2])
              for x in plan.reduced]
    with atomic_output(out, overwrite=overwrite) as tmp:
        with _watch_bytes(tmp, plan.out_bytes, progress):
            files = write_shards(tmp, items, max_shard_bytes=max_shard_bytes)
        readers.clear()
        for name in plan.carried:
            shutil.copyfile(Path(d.checkpoint.path) / name, tmp / name)
        files += plan.carried
        write_json(tmp / "config.json", plan.config)
        target = None if plan.target is None else _target_record(plan.target, base_model)
        record = _validate_output(tmp, plan, None if target is None else target["repo_id"])
        if progress is not None:
            progress("hash", 0, 1)
        src_hashes = src_future.result()
        if progress is not None:
            progress("hash", 1, 1)
        hasher.shutdown()
        provenance = {
            "tool": "dsparkhub", "version": __version__, "command": "convert",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            # a release is pushed with this file: local folders are named by their own name plus hashes (and the
            # target by its Hub id), never by an absolute path on this machine
            "source": {"name": (origin or Path(d.checkpoint.path)).resolve().name, "layout": d.recipe.name,
                       "files": {Path(p).name: h for p, h in src_hashes.items()},
                       **({"read_with": "torch.load(weights_only=True)"} if origin else {})},
            "target": target,
            "training": training_facts(origin or Path(d.checkpoint.path)),
            "layout": plan.recipe.name,
            "options": plan.options,
            "tensors": {"written": len(plan.copies),
                        "dropped": [{"name": x.name, "reason": x.reason} for x in plan.decisions
                                    if x.action == "drop"],
                        "kept_with_note": [{"name": x.name, "reason": x.reason} for x in plan.copies if x.reason]},
            "validation": {"ok": plan.report.ok, "errors": len(plan.report.errors),
                           "warnings": len(plan.report.warnings)},
            # the output's own hashes are not recorded: they can be recomputed from OUT at any time
            # (`checkpoint_fingerprint`, push), and a second sha256 pass would cost as much as the copy on 2 cores
            "written_bytes": {name: (tmp / name).stat().st_size for name in ["config.json", *files]},
        }
        write_json(tmp / PROVENANCE_FILE, provenance)
    return ConversionResult(out, plan, files, provenance, record)


def _validate_output(tmp: Path, plan: ConversionPlan, target_repo: str | None):
    """Validate what was written (headers only, in the temporary folder before the rename) and write its record,
    ``validation.json`` (:mod:`dsparkhub.validate.record`): the one settings-independent validation of the output
    that ``verify``, ``push`` and ``card`` then read instead of validating again. ``target_repo``: the target's Hub
    id, the name the record gives it (else :func:`dsparkhub.target.public_name`).

    Raises:
        ValidationFailedError: the output has errors the source did not (a conversion that breaks the drafter),
            unless the conversion was forced.
    """
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.validate import validate_base
    from dsparkhub.validate.record import make_record, write_record
    from dsparkhub.validate.report import validation_error

    d = open_draft(tmp, layout=plan.recipe.name)
    base = validate_base(d, plan.target)
    record = make_record(base, d, plan.target, target_name=target_repo)
    if not record.summary.ok and not plan.options.get("force"):
        report = base.report(str(tmp))
        raise validation_error(report, against=f"its target {plan.target.source}" if plan.target else "vLLM's contract",
                               refusing="the converted output was not moved into place", path=tmp,
                               hint="the source passed but its conversion does not: please report this as a bug")
    write_record(tmp, record)
    return record

