"""The findings of one validation: codes and severities, :class:`Finding`, :class:`ValidationReport`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from dsparkhub.errors import ValidationFailedError

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

#: every finding code, its severity and what it means.
CODES: dict[str, tuple[str, str]] = {
    "DSH101": (ERROR, "Markov head tensors ship but the config has no markov_rank"),
    "DSH102": (ERROR, "mask token missing or outside the drafter's input vocab"),
    "DSH103": (ERROR, "target layer ids not strictly increasing / duplicated"),
    "DSH104": (ERROR, "block size not a positive integer"),
    "DSH105": (ERROR, "a Markov head type vLLM does not serve for the family (vanilla; rnn: Mistral Large 4 on 0.34)"),
    "DSH106": (WARNING, "sample_from_anchor absent from a 1+N drafter's config (vLLM's native default: anchor-first)"),
    "DSH107": (WARNING, "drafter path contains a substring vLLM uses to guess another method"),
    "DSH108": (WARNING, "confidence head tensors shipped but the config does not enable the head (vLLM drops them)"),
    "DSH201": (ERROR, "a tensor the drafter needs is missing (vLLM would leave it uninitialised, silently)"),
    "DSH202": (ERROR, "a tensor vLLM does not know (vLLM raises on load)"),
    "DSH203": (ERROR, "a tensor's shape disagrees with the drafter's config"),
    "DSH204": (ERROR, "fc input width is not (number of target layers) x (target hidden size)"),
    "DSH205": (ERROR, "reduced draft vocab without lm_head / d2t, or d2t values out of range"),
    "DSH206": (WARNING, "mixed floating dtypes across the drafter's weights"),
    "DSH207": (ERROR, "a tensor holds NaN or Inf values (validate --deep; vLLM loads them and drafts garbage)"),
    "DSH208": (ERROR, "a reduced-vocab lm_head trimmed with the d2t offsets as row ids (TorchSpec 30189db "
                      "convert_to_hf.py --prune-vocab): rows repeat, draft ids hold the wrong tokens"),
    "DSH301": (ERROR, "hidden size differs from the target's"),
    "DSH302": (ERROR, "vocab size differs from the target's"),
    "DSH303": (ERROR, "target layer id outside the target's layers"),
    "DSH304": (ERROR, "target layer ids include the target's last layer, whose state the engine (or the layout's "
                      "trainer) reads after the final norm while the other side read it before"),
    "DSH305": (ERROR, "embedding / LM-head copy has another shape or dtype than the target's"),
    "DSH306": (ERROR, "the drafter records a different number of target layers than the target has"),
    "DSH307": (WARNING, "the target's embedding or LM head could not be found in its headers"),
    "DSH311": (ERROR, "a DSpark drafter of one backbone family checked against a target of another family"),
    "DSH313": (WARNING, "target layer ids include the target's last layer: fine for vLLM (pre-norm, as trained), "
                        "but HF output_hidden_states (the reference engine, DeepSpec's evaluator) returns it normed"),
    "DSH401": (WARNING, "num_speculative_tokens larger than what one block was trained to propose"),
    "DSH402": (INFO, "num_speculative_tokens smaller than what one block proposes"),
    "DSH403": (ERROR, "(`--engine vllm`) the drafter's class is served by other vLLM versions than the one judged for "
                      "(`--vllm-version`, else the installed one)"),
    "DSH501": (ERROR, "dspark_sts.json holds another number of temperatures than the block size (SGLang's γ)"),
    "DSH502": (ERROR, "dspark_sts.json does not load in SGLang's reader"),
}


#: finding codes of the layouts beyond Qwen3 (Kimi K3, DeepSeek-V4 stages, hidden-state numbering); kept apart from
#: :data:`CODES` until each has a case in tests/test_validate.py (they are exercised in tests/test_layouts.py).
LAYOUT_CODES: dict[str, tuple[str, str]] = {
    "DSH109": (ERROR, "a Kimi K3 MLA DSpark config vLLM 0.32's K3DSparkConfig refuses"),
    "DSH116": (ERROR, "a MiniMax-M3 DSpark config vLLM 0.34's MiniMaxM3DSparkForCausalLM cannot build (dense FFN only, "
                      "sized by dspark_ffn_hidden_size)"),
    "DSH110": (INFO, "num_nextn_predict_layers differs from the mtp.* stages (the stages are trusted)"),
    "DSH111": (ERROR, "the DSpark stage count vLLM 0.32 builds (n_mtp_layers, else 3; V4.1: else "
                      "num_nextn_predict_layers) differs from the mtp.* stages in the checkpoint"),
    "DSH112": (ERROR, "the drafter's stages do not hold the same parameters"),
    "DSH113": (WARNING, "a speculators DSpark / DFlash config without sample_from_anchor (vLLM reads 1+N, speculators "
                        "trains anchor-first by default)"),
    "DSH114": (WARNING, "a speculators DSpark with bidirectional sliding layers, which vLLM 0.32 runs causally when "
                        "served in this layout"),
    "DSH115": (ERROR, "legacy `DSparkDraftModel` architecture on a Qwen3 drafter: vLLM loads it as DeepSeek-V4 "
                      "unless model_type is exactly `qwen3`"),
    "DSH308": (WARNING, "the embedding output (layer id -1 / hidden-state index 0) among the ids: a numbering mix-up?"),
    "DSH309": (WARNING, "target layer ids are the target's usual ids shifted by one (a numbering mix-up)"),
    "DSH310": (WARNING, "the drafter names another target (speculators verifier) than the one it is checked against"),
    # found by `convert`, which compares the copies' bytes (validate reads headers only); tests/conformance
    "DSH312": (ERROR, "a frozen embedding / LM-head copy differs from the target's bytes (trained for another "
                      "target)"),
}
ALL_CODES = {**CODES, **LAYOUT_CODES}
#: codes only the opt-in scan of the tensor data (``deep=True``) finds.
DEEP_CODES = frozenset({"DSH207"})


@dataclass
class Finding:
    """One problem (or fact) found by :func:`validate`.

    Attributes:
        code: stable code, see :data:`CODES`.
        severity: ``"error"`` | ``"warning"`` | ``"info"``.
        message: one sentence naming the object.
        location: file, ``tensor NAME`` or ``key NAME``.
        expected: expected value, as text (may be empty).
        found: found value, as text (may be empty).
        hint: how to fix it.
    """

    code: str
    severity: str
    message: str
    location: str = ""
    expected: str = ""
    found: str = ""
    hint: str = ""


@dataclass
class ValidationReport:
    """All findings of one ``validate`` run, sorted by severity then code.

    Attributes:
        draft: drafter path.
        target: target source (None when validated without one).
        layout: detected layout name.
        findings: every finding.
        spec: the drafter's description (JSON summary).
        vllm_contract: the vLLM contract the engine rules were judged with (``VllmFacts.stamp()``: version, line,
            confirmed, unconfirmed fact kinds), or None when none was given or the engine is not vLLM.
    """

    draft: str
    target: str | None
    layout: str
    findings: list[Finding] = field(default_factory=list)
    spec: dict = field(default_factory=dict)
    vllm_contract: dict | None = None

    @property
    def errors(self) -> list[Finding]:
        """Findings of severity error."""
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        """Findings of severity warning."""
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.errors

    @property
    def codes(self) -> set[str]:
        """Codes of all findings."""
        return {f.code for f in self.findings}

    def to_dict(self) -> dict:
        """JSON-friendly report (what ``validate --json`` prints)."""
        return {"draft": self.draft, "target": self.target, "layout": self.layout, "ok": self.ok,
                "errors": len(self.errors), "warnings": len(self.warnings),
                "findings": [asdict(f) for f in self.findings],
                **({"vllm_contract": self.vllm_contract} if self.vllm_contract is not None else {})}


class Collector:
    """Gathers :class:`Finding`\\ s during one :func:`dsparkhub.validate.validate` run (severity from :data:`ALL_CODES`)."""

    def __init__(self):
        self.items: list[Finding] = []

    def add(self, code: str, message: str, *, location="", expected="", found="", hint=""):
        self.items.append(Finding(code, ALL_CODES[code][0], message, location, str(expected), str(found), hint))


def validation_error(report: ValidationReport, *, against: str, refusing: str, path: str | Path | None,
                     hint: str, redact: Callable[[str], str] | None = None) -> ValidationFailedError:
    """The one error every command raises when a validation it relies on found errors (convert, attach, verify,
    calibrate, push): every error listed, one per line, as ``[CODE] location: message (expected E, found F)``.

    Args:
        report: the report (only ``errors`` is read: objects with ``code`` / ``message`` and optionally
            ``location`` / ``expected`` / ``found``).
        against: what the drafter was checked against, e.g. ``"its target Qwen/Qwen3-8B"``.
        refusing: what is not done, e.g. ``"nothing was converted"``.
        path: the drafter folder.
        hint: how to fix it or go on anyway (``--force``).
        redact: applied to the message (push hides the token).

    Returns:
        A :class:`~dsparkhub.errors.ValidationFailedError` whose ``report`` is ``report`` (the caller raises it).
    """
    lines = []
    for f in report.errors:
        where = f"{f.location}: " if getattr(f, "location", None) else ""
        expected, found = getattr(f, "expected", ""), getattr(f, "found", "")
        detail = f" (expected {expected}, found {found})" if expected or found else ""
        lines.append(f"  - [{f.code}] {where}{f.message}{detail}")
    message = (f"the drafter does not pass validation against {against} ({len(report.errors)} error(s)); "
               f"{refusing}:\n" + "\n".join(lines))
    return ValidationFailedError(redact(message) if redact else message, report=report, path=path, hint=hint)
