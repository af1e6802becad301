"""The rules that depend on how a drafter is used rather than on its files, and the pass that does not.

A validation is split in two (issue 14: it runs once per pipeline and its outcome is handed on):

- :class:`BasePass`, the settings-independent pass (:func:`dsparkhub.validate.validate_base`): every rule on the
  drafter's config, headers, ``d2t`` and sidecar, and against the target, that gives the same findings whatever n,
  engine or folder name. It is what ``validation.json`` stores (:mod:`dsparkhub.validate.record`).
- :func:`settings_findings`, a pure function of a few facts the pass keeps (:class:`SettingsFacts`) and of the
  settings: DSH401 / DSH402 (``num_speculative_tokens`` vs the trained block), DSH304 / DSH313 (the target's last
  layer among the ids: which engine reads it how) and DSH107 (the folder's name, which vLLM sniffs for the method).

``BasePass.report(path, num_speculative_tokens=n, engine=e)`` is exactly what ``validate(path, target, n, engine=e)``
returns: :func:`dsparkhub.validate.validate` is built that way.

Does not: read files (the pass is made by :func:`dsparkhub.validate.validate_base`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub.serving import ENGINES

from dsparkhub.validate.report import DEEP_CODES, SEVERITY_ORDER, Collector, Finding, ValidationReport

#: where each engine reads a target layer's state (``dsparkhub.serving.Engine.final_layer_state``): ``raw`` = the
#: decoder layer's output before the final norm (vLLM 0.32 model_executor/models/qwen2.py:430-445
#: ``_maybe_add_hidden_state`` before ``self.norm``, which Qwen3 inherits; deepseek_v4/nvidia/model.py:1482-1495),
#: ``normed`` = HF ``output_hidden_states``, whose last entry is the final norm's output (the reference engine;
#: DeepSpec eval/base_evaluator.py:100-112). A view of the table, so an engine added there is known here.


class _FinalLayerStates(Mapping):
    """``{engine name: "raw" | "normed"}``, read from :data:`dsparkhub.serving.ENGINES` at each lookup."""

    def __getitem__(self, name: str) -> str:
        return ENGINES[name].final_layer_state

    def __iter__(self):
        return iter(ENGINES)

    def __len__(self) -> int:
        return len(ENGINES)


ENGINE_FINAL_LAYER_STATE: Mapping[str, str] = _FinalLayerStates()
#: substrings of a drafter's path from which vLLM 0.32 guesses another method when ``method`` is not passed (the
#: sniffs applied when no :class:`VllmFacts` is given).
METHOD_SNIFFS = ("eagle-", "eagle3", "dflash")


@dataclass(frozen=True)
class VllmFacts:
    """The facts of one vLLM contract the settings rules apply, and the stamp a report carries of them. Made by
    :meth:`dsparkhub.verify.vllm.contract.VllmContract.validate_facts` (validate sits below ``verify`` in the flow, so
    the contract comes in as these values).

    Attributes:
        version: the vLLM version judged for (``"0.34.0"``; ``"none installed"`` when none was installed).
        line: the contract line whose facts apply (``"0.34"``).
        confirmed: False when ``version`` is newer than every line (facts of the last line, unread for it).
        unconfirmed: the fact kinds not read from ``version``'s sources.
        method_sniffs: substrings of a drafter path from which that vLLM picks a method when none is passed.
        method_sniffs_source: ``"vLLM <line> <file:line>"`` of the sniffs.
        served_by: every drafter architecture some contract line serves -> the lines that do (DSH403).
        served_source: ``"vLLM <line> <file:line>"`` of this line's drafter classes.
    """

    version: str
    line: str
    confirmed: bool
    unconfirmed: tuple[str, ...]
    method_sniffs: tuple[str, ...]
    method_sniffs_source: str
    served_by: dict[str, tuple[str, ...]] = field(default_factory=dict)
    served_source: str = ""

    def stamp(self) -> dict:
        """``{"vllm_version", "contract_line", "confirmed", "unconfirmed"}``: what the report records."""
        return {"vllm_version": self.version, "contract_line": self.line, "confirmed": self.confirmed,
                "unconfirmed": list(self.unconfirmed)}


@dataclass
class FinalLayer:
    """Facts of the final-layer rule, kept when the ids include the target's last layer (and none lies outside).

    Attributes:
        target_layers: L, the target's decoder layers (the id concerned is L - 1).
        trained: how the layout's trainer read that layer's state, ``raw`` | ``normed`` (recipe
            ``final_layer_state``, default ``raw``).
        sources: where that is documented (recipe ``final_layer_state_source``); empty: not documented.
    """

    target_layers: int
    trained: str
    sources: str = ""


@dataclass
class SettingsFacts:
    """What the settings rules read, taken from the drafter's DraftSpec and recipe and from the target.

    Attributes:
        variant: ``dspark`` | ``dflash`` | ``eagle3`` (DSH107 applies to DSpark only).
        layout: the recipe the drafter was read with.
        block_size / block_layout / proposals_per_block: the trained block (DSH401 / DSH402).
        target_layer_ids: layer-index numbering.
        final_layer: the final-layer facts, or None when that rule does not apply.
    """

    variant: str
    layout: str
    block_size: int
    block_layout: str
    proposals_per_block: int
    target_layer_ids: list[int]
    final_layer: FinalLayer | None = None


def check_engine(engine: str) -> None:
    """Raise ValueError when ``engine`` is not a key of :data:`ENGINE_FINAL_LAYER_STATE`."""
    if engine not in ENGINE_FINAL_LAYER_STATE:
        raise ValueError(f"engine {engine!r}: expected one of {sorted(ENGINE_FINAL_LAYER_STATE)}")


def settings_findings(draft: str, facts: SettingsFacts, num_speculative_tokens: int | None,
                      engine: str = "vllm", vllm: VllmFacts | None = None,
                      architecture: str | None = None) -> list[Finding]:
    """The findings of the settings rules for a drafter at path ``draft`` served with n and ``engine``.

    Args:
        draft: the drafter's path as the report names it (``str(checkpoint.path)``).
        facts: from the settings-independent pass.
        num_speculative_tokens: the n to serve with (None: DSH401 / DSH402 not checked).
        engine: a key of :data:`ENGINE_FINAL_LAYER_STATE`.
        vllm: the vLLM contract facts to judge with (DSH107's sniffs, the version the messages name, DSH403's
            served classes); None: vLLM 0.32's sniffs, no DSH403.
        architecture: the drafter's ``architectures[0]`` (DSH403).

    Returns:
        DSH107, DSH401 / DSH402 and DSH304 / DSH313 findings, each where it applies.

    Raises:
        ValueError: unknown engine.
    """
    check_engine(engine)
    out = Collector()
    cfg_file = str(Path(draft) / "config.json")
    sniffs, named = (vllm.method_sniffs, f"vLLM {vllm.line}") if vllm else (METHOD_SNIFFS, "vLLM 0.32")
    sniff = next((s for s in sniffs if s in draft.lower()), None)
    if sniff and facts.variant == "dspark":
        out.add("DSH107", f"the drafter path contains {sniff!r}: if `method` is not passed, {named} loads it as "
                f"that method, not DSpark" + (f" ({vllm.method_sniffs_source})" if vllm else ""), location=draft,
                hint='always pass "method": "dspark" in --speculative-config, or rename the folder')
    lines = (vllm.served_by.get(architecture) or ()) if vllm is not None and engine.startswith("vllm") else ()
    if lines and vllm.line not in lines:
        out.add("DSH403", f"vLLM {vllm.line} does not serve {architecture} (vLLM {', '.join(lines)} does): "
                "it would not load this drafter", location=cfg_file, expected=f"vLLM {' / '.join(lines)}",
                found=f"vLLM {vllm.version}", hint=f"serve it with vLLM {lines[-1]} or newer ({vllm.served_source})")
    n = num_speculative_tokens
    if n is not None:
        p = facts.proposals_per_block
        if n > p:
            out.add("DSH401", f"num_speculative_tokens {n} exceeds the {p} tokens one trained block proposes "
                    f"({facts.block_layout}, block size {facts.block_size}); the extra positions were never trained",
                    expected=f"<= {p}", found=n)
        elif n < p:
            out.add("DSH402", f"num_speculative_tokens {n} is below the {p} tokens a block was trained to "
                    f"propose (allowed by {named})", expected=p, found=n)
    if facts.final_layer is not None:
        _final_layer(out, facts, cfg_file, engine)
    return out.items


def _final_layer(out: Collector, facts: SettingsFacts, cfg_file: str, engine: str) -> None:
    """The target's last layer among the ids: DSH304 where the engine reads its state otherwise than the layout's
    trainer saw it (recipe key ``final_layer_state``, default ``raw``), else DSH313."""
    fl, ids = facts.final_layer, facts.target_layer_ids
    L, trained, served = fl.target_layers, fl.trained, ENGINE_FINAL_LAYER_STATE[engine]
    sources = fl.sources or "the layout's trainer is assumed to read decoder-layer outputs, as vLLM does"
    shifted = "; if these are hidden-state indices, subtract 1 from each" if min(ids) >= 1 else ""
    if trained != served:
        out.add("DSH304", f"target layer id {L - 1} is the target's last layer: the {engine} engine reads its state "
                f"{'after' if served == 'normed' else 'before'} the final norm "
                f"({ENGINES[engine].final_layer_source}), while this "
                f"{facts.layout} drafter was trained on it {'after' if trained == 'normed' else 'before'}",
                location=f"{cfg_file} key target_layer_ids", expected=f"<= {L - 2}", found=ids,
                hint=f"{sources}; DeepSpec's evaluator refuses these ids for the same reason "
                     f"(eval/base_evaluator.py:100-112 assert_no_final_target_layer){shifted}")
    else:
        out.add("DSH313", f"target layer id {L - 1} is the target's last layer: {engine} reads its state as the "
                f"{facts.layout} trainer did ({served}), but HF output_hidden_states returns it normed, so the "
                "reference engine (`verify --backend reference`) and DeepSpec's evaluator refuse this drafter",
                location=f"{cfg_file} key target_layer_ids", expected=f"<= {L - 2} for every engine",
                found=ids, hint=f"{sources}; verify it with --backend vllm{shifted}")


@dataclass
class BasePass:
    """The settings-independent findings of one drafter (at one path) against one target (or none).

    Attributes:
        target: the target's source as given (None: validated without one).
        layout: the drafter's detected layout.
        findings: every settings-independent finding (DSH207 only when ``deep``).
        spec: the drafter's ``DraftSpec.summary()``.
        facts: what the settings rules read.
        deep: whether the NaN / Inf scan ran.
    """

    target: str | None
    layout: str
    findings: list[Finding] = field(default_factory=list)
    spec: dict = field(default_factory=dict)
    facts: SettingsFacts | None = None
    deep: bool = False

    def report(self, draft: str, *, num_speculative_tokens: int | None = None, engine: str = "vllm",
               deep: bool | None = None, vllm: VllmFacts | None = None) -> ValidationReport:
        """The :class:`ValidationReport` ``validate(draft, target, num_speculative_tokens=n, engine=engine,
        deep=deep)`` gives.

        Args:
            draft: the drafter's path as the report names it.
            num_speculative_tokens / engine: as in :func:`dsparkhub.validate.validate`.
            deep: None: as the pass ran; False: without the NaN / Inf findings of a deep pass.
            vllm: the vLLM contract facts to judge with; stamped on the report for a vLLM engine (``vllm``,
                ``vllm-serve``).

        Raises:
            ValueError: unknown engine, or ``deep=True`` asked of a pass that did not scan the data.
        """
        if deep and not self.deep:
            raise ValueError("deep findings asked of a validation that did not read the tensor data (deep=False)")
        keep = self.findings if deep or (deep is None and self.deep) else \
            [f for f in self.findings if f.code not in DEEP_CODES]
        found = [copy.copy(f) for f in keep] + settings_findings(draft, self.facts, num_speculative_tokens, engine,
                                                                 vllm, self.spec.get("architecture"))
        found.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.location))
        stamp = vllm.stamp() if vllm is not None and engine.startswith("vllm") else None
        return ValidationReport(draft, self.target, self.layout, found, copy.deepcopy(self.spec), stamp)
