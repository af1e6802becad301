"""Plan a conversion from headers only: tensors copied / dropped / derived, checks against the target, the
pre-conversion validation. Nothing is written (``dsparkhub convert --dry-run`` prints the plan)."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsparkhub.io.header import tensor_nbytes
from dsparkhub.draft_vocab import choose_draft_vocab
from dsparkhub.errors import CheckpointFormatError, ConversionRefusedError, ValidationFailedError
from dsparkhub.layouts.writing import DERIVED_TENSORS, write_config
from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.layouts.recipes import (Recipe, block_layout_of, can_hold, extra_key_map, load_recipes,
                                      resolve_output_recipe)
from dsparkhub.layouts.causality import causality_refusal
from dsparkhub.layouts.spec import ANCHOR_FIRST, ONE_PLUS_N
from dsparkhub.target import TargetSpec, open_target
from dsparkhub.validate import validate
from dsparkhub.validate.report import Finding, ValidationReport, validation_error

from dsparkhub.convert.target_fill import check_base_model, fill_from_target, reduce_vocab

SHARED_WITH_TARGET = {"embed_tokens.weight": "embed", "lm_head.weight": "lm_head"}
#: files beside the weights that vLLM 0.32 reads from the drafter folder: ``mask_embedding.pt``, a separately trained
#: mask embedding its DFlash loader substitutes for ``embed_tokens[mask_token_id]`` (qwen3_dflash.py:910-913 and
#: ``_read_mask_embedding`` 929-960, ``torch.load(weights_only=True)`` of the bytes: so they are copied as they are).
#: vLLM's DSpark never reads it (qwen3_dspark.py:338 "DSpark masks via the vocab row").
CARRIED_FILES = ("mask_embedding.pt",)



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
        computed: reduced-vocab tensors, ``{name: (dtype, shape, load)}``.
        carried: the :data:`CARRIED_FILES` the source folder holds, copied into OUT byte for byte.
    """

    draft: OpenedDraft
    target: TargetSpec | None
    recipe: Recipe
    config: dict
    decisions: list[TensorDecision]
    report: ValidationReport
    options: dict = field(default_factory=dict)
    computed: dict = field(default_factory=dict)  # name -> (dtype, shape, load) for action "reduce"
    carried: list[str] = field(default_factory=list)  # CARRIED_FILES present in the source, copied byte for byte

    @property
    def copies(self) -> list[TensorDecision]:
        """Tensors that will be written."""
        return [d for d in self.decisions if d.action == "copy"]

    @property
    def derived(self) -> list[TensorDecision]:
        """Tensors computed from others because the output layout ships them (speculators ``t2d``)."""
        return [d for d in self.decisions if d.action == "derive"]

    @property
    def reduced(self) -> list[TensorDecision]:
        """Tensors written for a reduced draft vocab (``--draft-vocab``): chosen rows, ``d2t`` (``t2d``)."""
        return [d for d in self.decisions if d.action == "reduce"]

    @property
    def out_bytes(self) -> int:
        """Bytes of tensor data that will be written."""
        spec = self.draft.spec
        derived = sum(derived_nbytes(spec, d.name) for d in self.derived)
        reduced = sum(tensor_nbytes(*self.computed[d.name][:2]) for d in self.reduced)
        return sum(spec.tensors[d.name].nbytes for d in self.copies) + derived + reduced

    def to_dict(self) -> dict:
        """JSON-friendly plan."""
        return {"source": str(self.draft.checkpoint.path), "source_layout": self.draft.recipe.name,
                "target": None if self.target is None else self.target.source, "to": self.recipe.name,
                "config": self.config, "tensors": [asdict(d) for d in self.decisions],
                "out_bytes": self.out_bytes, "validation": self.report.to_dict(), "options": self.options,
                "carried_files": self.carried}


@dataclass
class ConversionResult:
    """What :func:`convert` wrote."""

    out: Path
    plan: ConversionPlan
    files: list[str]
    provenance: dict
    #: the output's validation (``validation.json``, :mod:`dsparkhub.validate.record`), None when not written
    validation: object | None = None


def _same_bytes(d: OpenedDraft, name: str, t: TargetSpec, which: str) -> tuple[bool | None, str]:
    ref = getattr(t, which)
    mine = d.spec.tensors[name]
    if ref is None:
        return None, "the target's tensor was not found in its headers"
    if mine.shape != ref.shape or mine.dtype != ref.dtype:
        return False, f"differs from the target's {ref.name} ({ref.dtype} {list(ref.shape)})"
    if not t.local:
        return None, "the target is remote; bytes were not compared"
    at = _first_difference(d.checkpoint.file_path(mine), mine.start, t.checkpoint.file_path(ref), ref.start,
                           mine.nbytes)
    return at is None, ("byte-identical to the target's " + ref.name if at is None
                        else f"differs from the target's {ref.name} (first differing byte at offset {at} of "
                             f"{mine.nbytes})")


def _frozen_copy_finding(d: OpenedDraft, name: str, t: TargetSpec, which: str, why: str) -> Finding:
    """DSH312 for a frozen copy (``frozen_copies`` of the source recipe) whose bytes differ from the target's."""
    ref, mine = getattr(t, which), d.spec.tensors[name]
    file = Path(d.checkpoint.path) / mine.file
    return Finding("DSH312", "error", f"{file}: the drafter's frozen copy {d.spec.source_names.get(name, name)} "
                   f"{why} (the target is {t.source})", f"tensor {name}",
                   expected=f"the bytes of {t.source}'s {ref.name} ({ref.dtype} {list(ref.shape)})",
                   found=f"other bytes ({mine.dtype} {list(mine.shape)})",
                   hint=f"{d.recipe.name} trains this tensor frozen as a copy of its target's (DeepSpec "
                        "deepspec/trainer/base_trainer.py build_models: initialize_embeddings_and_head(freeze=True)), "
                        "so the drafter was trained for another target; pass the target it was trained on, or "
                        "--allow-different-embeddings to convert it anyway (the copy is kept)")


def _first_difference(path_a: Path, start_a: int, path_b: Path, start_b: int, nbytes: int,
                      chunk: int = 1 << 20) -> int | None:
    """Offset of the first byte that differs between two equally long byte ranges, None when identical.

    Compares chunk by chunk and stops at the first difference: a retrained embedding is told apart after one
    chunk instead of two full sha256 passes over [V, H] tensors (GBs for large vocabularies).

    Raises:
        CheckpointFormatError: either range is cut short by the end of its file.
    """
    with open(path_a, "rb", buffering=0) as fa, open(path_b, "rb", buffering=0) as fb:
        done = 0
        while done < nbytes:
            n = min(chunk, nbytes - done)
            a, b = os.pread(fa.fileno(), n, start_a + done), os.pread(fb.fileno(), n, start_b + done)
            if len(a) != n or len(b) != n:
                raise CheckpointFormatError(f"tensor data is cut short by the end of the file at byte {done}",
                                            path=path_a if len(a) != n else path_b)
            if a != b:
                lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect with C-level compares
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if a[lo:mid] == b[lo:mid] else (lo, mid)
                return done + lo
            done += n
            chunk = min(chunk * 4, 16 << 20)
    return None


def plan_conversion(src: str | Path, target: str | Path | TargetSpec | None, *, to: str = "vllm",
                    layout: str | None = None, force: bool = False, keep_embeddings: bool = False,
                    declare_block_layout: str | None = None, draft_vocab: int | None = None,
                    draft_vocab_from: list[str] | None = None,
                    allow_different_embeddings: bool = False, base_model: str | None = None) -> ConversionPlan:
    """Decide a conversion from headers (and the embedding / LM-head bytes), writing nothing.

    Args:
        src: drafter folder, DeepSpec step folder or run folder (``step_latest`` followed).
        target: the target (local folder / Hub repo id / opened); None skips target checks and keeps copies.
        to: output layout (a recipe name, default ``vllm``).
        layout: force the source layout instead of detecting it.
        force: convert even when validation reports errors.
        keep_embeddings: keep ``embed_tokens`` / ``lm_head`` even when identical to the target's.
        declare_block_layout: ``"anchor_first"`` | ``"one_plus_n"``: state the drafter's block layout instead of
            the one its config implies (the only way to write it in a layout that expresses the other one); the
            output then proposes a different number of tokens per block, which is recorded in provenance.
        draft_vocab: Vd: write a reduced draft vocab of the Vd most frequent target tokens of ``draft_vocab_from``
            (``dsparkhub.draft_vocab``): ``lm_head`` and ``markov_w2`` rows of those ids, and ``d2t``.
        draft_vocab_from: dataset specs counted for ``draft_vocab`` (as ``verify --datasets``).
        allow_different_embeddings: convert a drafter whose frozen embedding / LM-head copy (the source recipe's
            ``frozen_copies``: DeepSpec) differs from the target's; the copy is kept and DSH312 stays in the report.
        base_model: the target's Hub repo id, for config keys that name the target (speculators
            ``speculators_config.verifier.name_or_path``); default: found from the target
            (:func:`dsparkhub.convert.target_fill.verifier_hub_id`).

    Raises:
        ValidationFailedError: validation against the target found errors and ``force`` is False; or a frozen copy
            differs from the target's bytes (DSH312) and neither ``allow_different_embeddings`` nor ``force``.
        ConversionRefusedError: the output layout cannot express the drafter's block layout or family, or an
            extra it has no key for differs from the one value its engine runs (``write.requires.extras``: eagle3-hf
            ``norm_before_residual``), or it names the target and no Hub repo id of it is known (``base_model``).
        DsparkhubError subclasses from reading the source or target.
    """
    check_base_model(base_model, src)
    d = open_draft(src, layout=layout)
    t = target if isinstance(target, TargetSpec) or target is None else open_target(target)
    if declare_block_layout and declare_block_layout != d.spec.block_layout:
        if declare_block_layout not in (ANCHOR_FIRST, ONE_PLUS_N):
            raise ConversionRefusedError(f"unknown block layout {declare_block_layout!r}; expected "
                                         f"{ANCHOR_FIRST!r} or {ONE_PLUS_N!r}")
        before, implied = d.spec.proposals_per_block, d.spec.block_layout
        d.spec.block_layout = declare_block_layout
        d.spec.notes.append(f"block layout declared {declare_block_layout} (the source config implies {implied}); "
                            f"proposals per block change from {before} to {d.spec.proposals_per_block}")
    recipe = resolve_output_recipe(to, d.spec)
    report = validate(d, t)
    if not report.ok and not force:
        first = report.errors[0]
        raise validation_error(
            report, against=f"its target {t.source}" if t else "vLLM’s contract", refusing="nothing was converted",
            path=d.checkpoint.path,
            hint=(first.hint + "; " if first.hint else "") + "run `dsparkhub validate` for every finding, or pass "
                 "--force to convert anyway")
    spec = d.spec
    if spec.block_layout not in block_layout_of(recipe):
        raise ConversionRefusedError(
            f"the drafter is {spec.block_layout} (block size {spec.block_size}, {spec.proposals_per_block} proposals "
            f"per block) but layout {recipe.name!r} can only express {sorted(block_layout_of(recipe))}; writing it "
            "would shift every draft slot by one and acceptance would collapse to about 1", path=d.checkpoint.path,
            hint="if the source config is wrong about its own block layout, state the right one with "
                 "--declare-block-layout (recorded in provenance)")
    limits = recipe.data.get("write", {}).get("requires") or {}
    if limits.get("full_vocab") and spec.draft_vocab_size != spec.vocab_size:
        raise ConversionRefusedError(
            f"layout {recipe.name!r} requires draft vocab == vocab (it shares the target's LM head), but the drafter "
            f"has a reduced draft vocab ({spec.draft_vocab_size} of {spec.vocab_size}); the vocab cannot be mapped "
            "without retraining the head", path=d.checkpoint.path)
    for name, want in (limits.get("extras") or {}).items():
        if spec.extras.get(name, want) != want:
            raise ConversionRefusedError(
                f"layout {recipe.name!r} has no key for `{name}`: its engine always runs {name}={want} "
                f"({recipe.path.name} says where), but the drafter has {name}={spec.extras[name]}; writing it there "
                "would change what the drafter computes", path=d.checkpoint.path,
                hint="layouts that keep it: " + ", ".join(r.name for r in load_recipes() if can_hold(r, spec)
                                                          and name in extra_key_map(r)))
    lacking = [n for n in (recipe.data.get("write") or {}).get("keep_own") or [] if n not in spec.tensors]
    if lacking:
        raise ConversionRefusedError(
            f"layout {recipe.name!r} reads {', '.join(lacking)} from the drafter itself (its engine does not borrow "
            f"it from the target), but the drafter has no such tensor; the output would load with it unset",
            path=d.checkpoint.path, hint="convert to a layout whose engine borrows it from the target (--to vllm)")
    variants = (recipe.data.get("write") or {}).get("variants") or [spec.variant]
    if spec.variant not in variants:
        raise ConversionRefusedError(
            f"layout {recipe.name!r} holds {'/'.join(variants)} drafters, but this one is {spec.variant} "
            f"(markov rank {spec.markov_rank})", path=d.checkpoint.path,
            hint="choose an output layout for this variant with --to (dsparkhub inspect shows the variant)")
    if not can_hold(recipe, spec):
        raise ConversionRefusedError(
            f"layout {recipe.name!r} cannot hold a {spec.family} {spec.variant} drafter (read as {spec.layout!r}); "
            "writing it there would lose or reinterpret tensors", path=d.checkpoint.path,
            hint="layouts that can: " + ", ".join(r.name for r in load_recipes() if can_hold(r, spec)))
    why = causality_refusal(spec, recipe)
    if why:
        raise ConversionRefusedError(why + "; writing it there would change how the drafter attends",
                                     path=d.checkpoint.path,
                                     hint="convert to a layout that expresses it (zlab-dflash / vllm write `is_causal`)")
    fill_from_target(spec, t, recipe, d.checkpoint.path, base_model)
    computed = {}
    if draft_vocab is not None:
        if limits.get("full_vocab"):
            raise ConversionRefusedError(f"layout {recipe.name!r} shares the target's LM head, so it cannot hold a "
                                         "reduced draft vocab", path=d.checkpoint.path)
        dv = choose_draft_vocab(t.source if t is not None and t.local else "", list(draft_vocab_from or []),
                                draft_vocab, vocab_size=spec.vocab_size)
        computed = reduce_vocab(d, t, recipe, dv)
    config = write_config(spec, recipe)
    decisions: list[TensorDecision] = []
    frozen: list[Finding] = []
    for name, (dtype, shape, _) in computed.items():
        if name not in spec.tensors:  # d2t / t2d, or an lm_head taken from the target
            decisions.append(TensorDecision(name, "reduce", recipe.to_layout(name, num_layers=spec.num_layers),
                                            f"reduced draft vocab: {dtype} {list(shape)}"))
    for name in sorted(spec.tensors, key=tensor_order):
        if name in computed:
            decisions.append(TensorDecision(name, "reduce", recipe.to_layout(name, num_layers=spec.num_layers),
                                            f"reduced draft vocab: rows of {spec.draft_vocab_size} chosen tokens"))
            continue
        if any(re.fullmatch(p, name) for p in recipe.data.get("write", {}).get("omit") or []):
            decisions.append(TensorDecision(name, "drop", None, f"layout {recipe.name!r} does not carry it"))
            continue
        out_name = recipe.to_layout(name, num_layers=spec.num_layers)
        which = None if name in (recipe.data.get("write", {}).get("keep_own") or []) else SHARED_WITH_TARGET.get(name)
        is_frozen = name in (d.recipe.data.get("frozen_copies") or [])
        # a frozen copy is compared even with keep_embeddings: one that differs means another target (DSH312)
        if which and t is not None and (is_frozen or not keep_embeddings) and spec.vocab_size <= t.vocab_size \
                and not (name == "lm_head.weight" and spec.draft_vocab_size != t.vocab_size):
            same, why = _same_bytes(d, name, t, which)
            if same and not keep_embeddings:
                decisions.append(TensorDecision(name, "drop", None, why + "; vLLM shares the target's"))
                continue
            if same is False and is_frozen:
                frozen.append(_frozen_copy_finding(d, name, t, which, why))
            if not same:
                decisions.append(TensorDecision(name, "copy", out_name, why + "; kept (vLLM uses the drafter's own)"))
                continue
        decisions.append(TensorDecision(name, "copy", out_name))
    for name in recipe.data.get("write", {}).get("derive") or []:
        inputs = DERIVED_TENSORS[name][0]
        if name not in spec.tensors and all(i in spec.tensors for i in inputs):
            decisions.append(TensorDecision(name, "derive", recipe.to_layout(name, num_layers=spec.num_layers),
                                            f"computed from {', '.join(inputs)} (layout {recipe.name!r} ships it)"))
    if frozen:
        order = {"error": 0, "warning": 1, "info": 2}
        report.findings = sorted(report.findings + frozen, key=lambda f: (order[f.severity], f.code, f.location))
        if not (allow_different_embeddings or force):
            raise ValidationFailedError(f"[DSH312] {frozen[0].message}", report=report, path=d.checkpoint.path,
                                        hint=frozen[0].hint)
    options = {"to": recipe.name, "layout": d.recipe.name, "force": force, "keep_embeddings": keep_embeddings,
               "declare_block_layout": declare_block_layout}
    if allow_different_embeddings:
        options["allow_different_embeddings"] = True
    if draft_vocab is not None:
        options["draft_vocab"] = dv.to_dict()
    if base_model is not None:
        options["base_model"] = base_model
    carried = [f for f in CARRIED_FILES if (Path(d.checkpoint.path) / f).is_file()]
    if carried and spec.variant == "dspark":
        d.spec.notes.append("mask_embedding.pt is carried, but vLLM 0.32's DSpark never reads it: it masks via the "
                            "vocab row embed_tokens[mask_token_id] (qwen3_dspark.py:338)")
    return ConversionPlan(d, t, recipe, config, decisions, report, options, computed, carried)


def derived_nbytes(spec, name: str) -> int:
    dtype, shape = DERIVED_TENSORS[name][2](spec)
    return tensor_nbytes(dtype, shape)


def tensor_order(name: str):
    # layers in numeric order, then the rest alphabetically: stable, readable shard contents
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
        return (0, int(parts[1]), ".".join(parts[2:]))
    return (1, 0, name)
