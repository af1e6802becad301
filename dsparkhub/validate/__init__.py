"""Static checks of a drafter against its target and vLLM 0.32's contract, from configs and safetensors headers.

Every check adds :class:`Finding`\\ s to one :class:`ValidationReport`; nothing stops at the first problem. Each
finding has a stable code (the table :data:`CODES`), a severity, the file / tensor / key it is about, what was
expected and what was found, and a hint. Sources of the rules: FORMATS.md §1, reference/vllm_dspark_contract.md
(vLLM 0.32 ``qwen3_dspark.py`` load_weights, ``config/speculative.py``, ``spec_decode/utils.py``), DeepSpec
``validate_target_layer_ids`` / ``assert_no_final_target_layer``.

Does not: read tensor data (the exceptions: ``d2t``, a [Vd] int64 table, whose values must be checked; and, opt-in
with ``deep=True``, every floating tensor, scanned for NaN / Inf), or run any model (``dsparkhub.verify``).

Rules live per area: :mod:`~dsparkhub.validate.drafter`, :mod:`~dsparkhub.validate.target_rules`,
:mod:`~dsparkhub.validate.sidecar`, :mod:`~dsparkhub.validate.values`; the report types in
:mod:`~dsparkhub.validate.report`.
"""

from __future__ import annotations

from pathlib import Path

from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.target import TargetSpec, open_target
from dsparkhub.validate.drafter import check_intrinsic
from dsparkhub.validate.report import Collector, ValidationReport
from dsparkhub.validate.settings import ENGINE_FINAL_LAYER_STATE, BasePass, SettingsFacts, VllmFacts, check_engine
from dsparkhub.validate.target_rules import check_target
from dsparkhub.validate.values import check_values

__all__ = ["ENGINE_FINAL_LAYER_STATE", "BasePass", "ValidationReport", "VllmFacts", "validate", "validate_base"]


def validate(draft: str | Path | OpenedDraft, target: str | Path | TargetSpec | None = None, *,
             num_speculative_tokens: int | None = None, layout: str | None = None,
             deep: bool = False, engine: str = "vllm", vllm: VllmFacts | None = None) -> ValidationReport:
    """Check a drafter against a vLLM contract and, when given, its target — headers and configs only.

    Args:
        draft: drafter folder in any known layout (or an already opened one).
        target: local HF folder, Hub repo id, or an opened :class:`TargetSpec`; None skips the target checks.
        num_speculative_tokens: the n you intend to serve with, checked against the block size.
        layout: force the drafter's layout instead of detecting it.
        deep: also read every floating tensor of the drafter and report NaN / Inf values (DSH207); reads all of
            the drafter's bytes, in 16 MiB chunks.
        engine: the engine that will read the target's hidden states, a key of :data:`ENGINE_FINAL_LAYER_STATE`
            (``"vllm"``, default; ``"reference"``): decides whether the target's last layer among the ids is an
            error (DSH304) or a warning (DSH313).
        vllm: the facts of the vLLM contract to judge with (``VllmContract.validate_facts()`` of the installed or
            a named vLLM version: the method sniffs of DSH107, the version the messages name), stamped on the
            report as ``vllm_contract`` for a vLLM engine; None: vLLM 0.32's facts, no stamp.

    Returns:
        :class:`ValidationReport` with every finding; ``report.ok`` is False when any finding is an error. It is
        :func:`validate_base`'s pass with the settings rules applied (:meth:`BasePass.report`).

    Raises:
        ValueError: unknown engine.
        dsparkhub.errors.DsparkhubError subclasses when the drafter or target cannot be read at all
        (missing folder, malformed safetensors or config, unknown layout).
    """
    check_engine(engine)
    d = draft if isinstance(draft, OpenedDraft) else open_draft(draft, layout=layout)
    t = target if isinstance(target, TargetSpec) or target is None else open_target(target)
    return validate_base(d, t, deep=deep).report(str(d.checkpoint.path), num_speculative_tokens=num_speculative_tokens,
                                                 engine=engine, vllm=vllm)


def validate_base(d: OpenedDraft, t: TargetSpec | None, *, deep: bool = False) -> BasePass:
    """The settings-independent pass: every rule but those of n, the engine and the folder's name
    (:mod:`dsparkhub.validate.settings`). What ``validation.json`` stores (:mod:`dsparkhub.validate.record`).

    Args:
        d: the opened drafter.
        t: the opened target, or None.
        deep: also scan the floating tensors for NaN / Inf (DSH207).

    Returns:
        :class:`BasePass`.

    Raises:
        dsparkhub.errors.DsparkhubError subclasses when a tensor the rules read (``d2t``, the data with ``deep``)
        cannot be read.
    """
    out = Collector()
    check_intrinsic(d, out)
    if deep:
        check_values(d, out)
    final = check_target(d, t, out) if t is not None else None
    spec = d.spec
    facts = SettingsFacts(spec.variant, d.recipe.name, spec.block_size, spec.block_layout, spec.proposals_per_block,
                          list(spec.target_layer_ids), final)
    return BasePass(None if t is None else t.source, d.recipe.name, out.items, spec.summary(), facts, deep)
