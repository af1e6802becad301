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
- training files (``train_config.py``, ``training_state.*.pt``) are never read or copied.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import __version__
from .errors import ConversionRefusedError, OutputExistsError, ValidationFailedError
from .hashing import sha256_file, sha256_files
from .recipes import OpenedDraft, Recipe, block_layout_of, get_recipe, open_draft, write_config
from .target import TargetSpec, open_target
from .validate import ValidationReport, validate
from .writer import atomic_output, write_json, write_shards

PROVENANCE_NAME = "dsparkhub_provenance.json"
SHARED_WITH_TARGET = {"embed_tokens.weight": "embed", "lm_head.weight": "lm_head"}


@dataclass
class TensorDecision:
    """What happens to one source tensor: ``copy`` under ``out_name``, or ``drop`` with a reason."""

    name: str
    action: str
    out_name: str | None
    reason: str = ""


@dataclass
class ConversionPlan:
    """Everything :func:`convert` will do, decided from headers (printable with ``--dry-run``).

    Attributes:
        draft: the opened source drafter.
        target: the target it was checked against (None when converting without one).
        recipe: output layout.
        config: the output ``config.json``.
        decisions: one per source tensor, in output order for copies.
        report: the pre-conversion validation.
        options: the options that shaped the plan (recorded in provenance).
    """

    draft: OpenedDraft
    target: TargetSpec | None
    recipe: Recipe
    config: dict
    decisions: list[TensorDecision]
    report: ValidationReport
    options: dict = field(default_factory=dict)

    @property
    def copies(self) -> list[TensorDecision]:
        """Tensors that will be written."""
        return [d for d in self.decisions if d.action == "copy"]

    @property
    def out_bytes(self) -> int:
        """Bytes of tensor data that will be written."""
        spec = self.draft.spec
        return sum(spec.tensors[d.name].nbytes for d in self.copies)

    def to_dict(self) -> dict:
        """JSON-friendly plan."""
        return {"source": str(self.draft.checkpoint.path), "source_layout": self.draft.recipe.name,
                "target": None if self.target is None else self.target.source, "to": self.recipe.name,
                "config": self.config, "tensors": [asdict(d) for d in self.decisions],
                "out_bytes": self.out_bytes, "validation": self.report.to_dict(), "options": self.options}


@dataclass
class ConversionResult:
    """What :func:`convert` wrote."""

    out: Path
    plan: ConversionPlan
    files: list[str]
    provenance: dict


def _same_bytes(d: OpenedDraft, name: str, t: TargetSpec, which: str) -> tuple[bool | None, str]:
    ref = getattr(t, which)
    mine = d.spec.tensors[name]
    if ref is None:
        return None, "the target's tensor was not found in its headers"
    if mine.shape != ref.shape or mine.dtype != ref.dtype:
        return False, f"differs from the target's {ref.name} ({ref.dtype} {list(ref.shape)})"
    if not t.local:
        return None, "the target is remote; bytes were not compared"
    own = d.checkpoint.tensor_sha256(d.spec.source_names[name])
    theirs = t.checkpoint.tensor_sha256(ref.name)
    return own == theirs, ("byte-identical to the target's " + ref.name if own == theirs
                           else f"differs from the target's {ref.name} (sha256 {own[:12]} vs {theirs[:12]})")


def plan_conversion(src: str | Path, target: str | Path | TargetSpec | None, *, to: str = "vllm",
                    layout: str | None = None, force: bool = False, keep_embeddings: bool = False) -> ConversionPlan:
    """Decide a conversion from headers (and the embedding / LM-head bytes), writing nothing.

    Args:
        src: drafter folder, DeepSpec step folder or run folder (``step_latest`` followed).
        target: the target (local folder / Hub repo id / opened); None skips target checks and keeps copies.
        to: output layout (a recipe name, default ``vllm``).
        layout: force the source layout instead of detecting it.
        force: convert even when validation reports errors.
        keep_embeddings: keep ``embed_tokens`` / ``lm_head`` even when identical to the target's.

    Raises:
        ValidationFailedError: validation against the target found errors and ``force`` is False.
        ConversionRefusedError: the output layout cannot express the drafter's block layout or family.
        DsparkhubError subclasses from reading the source or target.
    """
    d = open_draft(src, layout=layout)
    t = target if isinstance(target, TargetSpec) or target is None else open_target(target)
    recipe = get_recipe(to)
    report = validate(d, t)
    if not report.ok and not force:
        first = report.errors[0]
        raise ValidationFailedError(
            f"the drafter fails {len(report.errors)} check(s) against "
            f"{'its target ' + t.source if t else 'vLLM’s contract'}; first: [{first.code}] {first.message}"
            + (f" (expected {first.expected}, found {first.found})" if first.expected or first.found else ""),
            report=report, path=d.checkpoint.path,
            hint=(first.hint + "; " if first.hint else "") + "run `dsparkhub validate` for every finding, or pass "
                 "--force to convert anyway")
    spec = d.spec
    if spec.block_layout not in block_layout_of(recipe):
        raise ConversionRefusedError(
            f"the drafter is {spec.block_layout} (block size {spec.block_size}, {spec.proposals_per_block} proposals "
            f"per block) but layout {recipe.name!r} can only express {sorted(block_layout_of(recipe))}; writing it "
            "would shift every draft slot by one and acceptance would collapse to about 1", path=d.checkpoint.path)
    variants = (recipe.data.get("write") or {}).get("variants") or [spec.variant]
    if spec.variant not in variants:
        raise ConversionRefusedError(
            f"layout {recipe.name!r} holds {'/'.join(variants)} drafters, but this one is {spec.variant} "
            f"(markov rank {spec.markov_rank})", path=d.checkpoint.path,
            hint="choose an output layout for this variant with --to (dsparkhub inspect shows the variant)")
    config = write_config(spec, recipe)
    decisions: list[TensorDecision] = []
    for name in sorted(spec.tensors, key=_tensor_order):
        out_name = recipe.to_layout(name)
        which = SHARED_WITH_TARGET.get(name)
        if which and t is not None and not keep_embeddings and spec.vocab_size <= t.vocab_size \
                and not (name == "lm_head.weight" and spec.draft_vocab_size != t.vocab_size):
            same, why = _same_bytes(d, name, t, which)
            if same:
                decisions.append(TensorDecision(name, "drop", None, why + "; vLLM shares the target's"))
                continue
            decisions.append(TensorDecision(name, "copy", out_name, why + "; kept (vLLM uses the drafter's own)"))
            continue
        decisions.append(TensorDecision(name, "copy", out_name))
    options = {"to": to, "layout": d.recipe.name, "force": force, "keep_embeddings": keep_embeddings}
    return ConversionPlan(d, t, recipe, config, decisions, report, options)


def _tensor_order(name: str):
    # layers in numeric order, then the rest alphabetically: stable, readable shard contents
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
        return (0, int(parts[1]), ".".join(parts[2:]))
    return (1, 0, name)


def _source_files(d: OpenedDraft) -> list[Path]:
    folder = Path(d.checkpoint.path)
    files = [folder / "config.json"] + [folder / f for f in d.checkpoint.files]
    if d.checkpoint.index is not None:
        files.append(folder / "model.safetensors.index.json")
    return [p for p in files if p.exists()]


def convert(src: str | Path, out: str | Path, target: str | Path | TargetSpec | None, *, to: str = "vllm",
            layout: str | None = None, overwrite: bool = False, force: bool = False, keep_embeddings: bool = False,
            max_shard_bytes: int | None = None, plan: ConversionPlan | None = None) -> ConversionResult:
    """Convert ``src`` into ``out`` (see the module docstring for the rules).

    Args:
        src, target, to, layout, force, keep_embeddings: as in :func:`plan_conversion`.
        out: output folder; must not exist unless ``overwrite``.
        overwrite: replace an existing ``out`` (atomically: the old one is removed only after the new one is in
            place).
        max_shard_bytes: output shard cap (default: the largest tensor + 256 MiB).
        plan: a plan already made by :func:`plan_conversion` (skips planning).

    Returns:
        :class:`ConversionResult`.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False (checked before any work).
        everything :func:`plan_conversion` raises.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError("output folder already exists", path=out, hint="pass --overwrite to replace it")
    plan = plan or plan_conversion(src, target, to=to, layout=layout, force=force, keep_embeddings=keep_embeddings)
    d = plan.draft
    src_hashes = sha256_files(_source_files(d))
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

    items = [(c.out_name, d.spec.tensors[c.name].nbytes, loader(d.spec.tensors[c.name])) for c in plan.copies]
    with atomic_output(out, overwrite=overwrite) as tmp:
        files = write_shards(tmp, items, max_shard_bytes=max_shard_bytes)
        readers.clear()
        write_json(tmp / "config.json", plan.config)
        out_hashes = sha256_files([tmp / f for f in ["config.json", *files]])
        provenance = {
            "tool": "dsparkhub", "version": __version__, "command": "convert",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "source": {"path": str(Path(d.checkpoint.path).resolve()), "layout": d.recipe.name,
                       "files": {Path(p).name: h for p, h in src_hashes.items()}},
            "target": None if plan.target is None else {
                "source": plan.target.source,
                "path": str(Path(plan.target.source).resolve()) if plan.target.local else None,
                "config_sha256": sha256_file(Path(plan.target.source) / "config.json") if plan.target.local
                else None},
            "layout": plan.recipe.name,
            "options": plan.options,
            "tensors": {"written": len(plan.copies),
                        "dropped": [{"name": x.name, "reason": x.reason} for x in plan.decisions
                                    if x.action == "drop"],
                        "kept_with_note": [{"name": x.name, "reason": x.reason} for x in plan.copies if x.reason]},
            "validation": {"ok": plan.report.ok, "errors": len(plan.report.errors),
                           "warnings": len(plan.report.warnings)},
            "files": {Path(p).name: h for p, h in out_hashes.items()},
        }
        write_json(tmp / PROVENANCE_NAME, provenance)
    return ConversionResult(out, plan, files, provenance)
