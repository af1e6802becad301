"""Speculative-config options of a verify run: adaptive verification arms, the rejection method, and the lossless
check at the drafter's block size.

This module owns the checks and derivations for three ``dsparkhub verify`` options; it runs nothing (``runner``
runs, ``vllm.backend`` merges :attr:`SpecOptions.speculative_config` into vLLM's ``speculative_config``):

- ``--adaptive-verification off|on|both``: vLLM 0.32's ``SpeculativeConfig.enable_adaptive_verification``
  (``vllm/config/speculative.py``): the GPU model runner sizes each step's verification budget from per-request
  confidence (``v1/worker/gpu/spec_decode/adaptive_verification.py`` admits the globally best draft slots), using
  the DSpark drafter's trained confidence head when ``config.json`` has ``enable_confidence_head: true``
  (``v1/worker/gpu/spec_decode/dspark/speculator.py``). It exists only in the V2 GPU runner, so it is refused for
  the reference engine, for a running server (whose speculative config was fixed at launch), on a machine without
  CUDA, for a non-DSpark drafter and for a DSpark drafter without a confidence head. With ``both`` every arm is its
  own run and its own results file (:func:`arm_paths`), so the arms never mix; an ``on`` arm records in its
  ``warnings`` that vLLM's spec-decode counters then count *admitted* drafts only (:data:`ADMITTED_NOTE`);
- ``--speculative-option KEY=VALUE`` (repeatable, VALUE as JSON, else a string): extra ``speculative_config`` keys
  for ``--backend vllm``. A lossy rejection method (vLLM 0.33 ``rejection_sample_method: fly``, 0.32 ``synthetic``)
  accepts drafts the target would not have produced, so it is refused for a lossless check (temperature 0);
- ``--lossless-at-block-size``: adds n = the drafter's ``block_size`` (``config.json``) to the measured n values
  when it is not among them: sglang#32038 saw greedy outputs corrupted only at n = block size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub.errors import DsparkhubError, EngineUnavailableError
from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.layouts.spec import DraftSpec
from dsparkhub.serving import ENGINES

ADAPTIVE_MODES = ("off", "on", "both")
ADAPTIVE_KEY = "enable_adaptive_verification"  # vLLM 0.32 SpeculativeConfig field
#: rejection methods that accept drafts the target would not have produced (vLLM 0.32 ``synthetic``, 0.33 ``fly``)
LOSSY_REJECTION = ("fly", "synthetic")
ADMITTED_NOTE = ("adaptive verification on (vLLM enable_adaptive_verification=true): vLLM's spec-decode counters "
                 "count admitted drafts only (the slots its cost model sent to verification), so τ, per-position "
                 "acceptance and draft tokens per step are over admitted drafts, not over n per step; compare the "
                 "arms by speedup")
BLOCK_SIZE_NOTE = ("n={n} added: the lossless check also runs at the drafter's block size {n} (sglang#32038 saw "
                   "greedy outputs corrupted only there)")


class SpecOptionError(DsparkhubError, ValueError):
    """A speculative-config option that contradicts the run (a usage error, exit 2)."""


class AdaptiveUnavailableError(EngineUnavailableError):
    """Adaptive verification asked for where vLLM cannot run it (no CUDA, the reference engine, no confidence
    head); exit 1 like any engine refusal."""


@dataclass(frozen=True)
class SpecOptions:
    """Speculative-config settings of one verify run (one arm).

    Attributes:
        speculative_config: extra keys merged into vLLM's ``speculative_config`` (``--speculative-option``, plus
            ``enable_adaptive_verification`` for an adaptive arm); empty for the default.
        lossless_at_block_size: add n = the drafter's block size to the measured n values.
        notes: lines recorded in the results' ``warnings`` (the admitted-drafts note of an adaptive arm).
    """

    speculative_config: dict = field(default_factory=dict)
    lossless_at_block_size: bool = False
    notes: tuple[str, ...] = ()


def parse_speculative_options(items: list[str] | tuple[str, ...]) -> dict:
    """``KEY=VALUE`` strings to a dict; VALUE is parsed as JSON (``true``, ``3``, ``"x"``), else kept as a string.

    Raises:
        SpecOptionError: an item without ``=`` or with an empty key, or a key given twice.
    """
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecOptionError(f"--speculative-option {item!r} is not KEY=VALUE",
                                  hint="e.g. --speculative-option rejection_sample_method=block")
        if key in out:
            raise SpecOptionError(f"--speculative-option {key} is given twice")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    if ADAPTIVE_KEY in out:
        raise SpecOptionError(f"{ADAPTIVE_KEY} is set with --adaptive-verification off|on|both, not "
                              "--speculative-option", hint="use --adaptive-verification on")
    return out


def refuse_lossy_rejection(speculative_config: dict, temperature: float) -> None:
    """Refuse a lossy rejection method for a lossless check (temperature 0).

    Raises:
        SpecOptionError: ``rejection_sample_method`` is one of :data:`LOSSY_REJECTION` and ``temperature`` is 0.
    """
    method = speculative_config.get("rejection_sample_method")
    if temperature == 0 and method in LOSSY_REJECTION:
        raise SpecOptionError(
            f"rejection_sample_method={method!r} is lossy: it accepts draft tokens by a rule other than the "
            "target's own choice, so greedy outputs with the drafter may differ from the target alone by design, "
            "and a lossless check (temperature 0) would either fail or prove nothing about the drafter",
            hint="drop the option for the lossless check (vLLM's default 'standard' and 'block' are lossless), or "
                 "measure the lossy method's speed with --temperature > 0, which skips the lossless check")


def adaptive_arms(mode: str) -> list[bool]:
    """The ``enable_adaptive_verification`` value of each run: off ``[False]``, on ``[True]``, both both.

    Raises:
        SpecOptionError: not one of :data:`ADAPTIVE_MODES`.
    """
    if mode not in ADAPTIVE_MODES:
        raise SpecOptionError(f"--adaptive-verification {mode!r}: expected one of {', '.join(ADAPTIVE_MODES)}")
    return {"off": [False], "on": [True], "both": [False, True]}[mode]


def arm_paths(out: str | Path | None, mode: str) -> list[str | None]:
    """Results path of each arm: ``out`` itself for off / on; for both ``NAME.adaptive-off.json`` and
    ``NAME.adaptive-on.json`` next to it (None stays None)."""
    if mode != "both" or out is None:
        return [None if out is None else str(out)] * len(adaptive_arms(mode))
    p = Path(out)
    return [str(p.with_name(f"{p.stem}.adaptive-{arm}{p.suffix or '.json'}")) for arm in ("off", "on")]


def _spec(draft: str | Path | OpenedDraft) -> DraftSpec | None:
    """The drafter's :class:`~dsparkhub.layouts.spec.DraftSpec` (the layout recipes' reading; an opened drafter's
    own), or None when no recipe reads the folder."""
    if isinstance(draft, OpenedDraft):
        return draft.spec
    try:
        return open_draft(draft).spec
    except DsparkhubError:
        return None


def has_confidence_head(draft: str | Path | OpenedDraft) -> bool:
    """True when the drafter declares a confidence head (its DraftSpec; written as ``enable_confidence_head``, which
    vLLM ``qwen3_dspark.py`` reads)."""
    spec = _spec(draft)
    return bool(spec and spec.confidence_head)


def _takes_speculative_config(backend: str) -> bool:
    """Whether the engine ``backend`` passes extra keys into vLLM's ``speculative_config`` (``dsparkhub.serving``)."""
    engine = ENGINES.get(backend)
    return engine is not None and "speculative_config" in engine.settings


def check_adaptive(mode: str, *, backend: str, method: str | None, draft: str | Path | OpenedDraft,
                   cuda: bool | None = None) -> None:
    """Refuse adaptive verification where vLLM 0.32 cannot run it, before anything loads (``off`` always passes).

    Args:
        mode: ``off`` | ``on`` | ``both``.
        backend: the verify backend name.
        method: the drafter's method.
        draft: the drafter folder (its ``config.json`` is read for the confidence head).
        cuda: whether a CUDA device is usable (None: ask torch).

    Raises:
        SpecOptionError: unknown mode, a backend other than ``vllm`` (usage error).
        AdaptiveUnavailableError: not a DSpark drafter, no confidence head, or no CUDA device.
    """
    if not any(adaptive_arms(mode)):
        return
    engine = ENGINES.get(backend)
    if not _takes_speculative_config(backend):
        where = (f"the {engine.label if engine else backend} has no verification cost model"
                 if engine is None or not engine.server else
                 "a running server's speculative config was fixed when it started (start it with "
                 f"--speculative-config '{{..., \"{ADAPTIVE_KEY}\": true}}' and measure it as any other server)")
        raise SpecOptionError(f"--adaptive-verification {mode} needs --backend vllm: {where}",
                              hint="use --backend vllm on a GPU node, or drop --adaptive-verification")
    if method != "dspark":
        raise AdaptiveUnavailableError(
            f"--adaptive-verification {mode}: the drafter is a {method} drafter; vLLM 0.32 sizes the verification "
            "budget from a DSpark drafter's confidence head, and dsparkhub measures it for DSpark drafters only",
            hint="drop --adaptive-verification for this drafter")
    if not has_confidence_head(draft):
        raise AdaptiveUnavailableError(
            f"--adaptive-verification {mode}: the drafter's config.json has no enable_confidence_head: true, so "
            "it has no trained confidence head to size the verification budget from",
            path=Path(draft.checkpoint.path if isinstance(draft, OpenedDraft) else draft) / "config.json",
            hint="use a DSpark drafter trained with a confidence head, or drop --adaptive-verification")
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        raise AdaptiveUnavailableError(
            f"--adaptive-verification {mode}: adaptive verification runs only in vLLM 0.32's V2 GPU model runner "
            "and this machine has no CUDA device (the CPU build runs the V1 runner, which refuses DSpark)",
            hint="run it on a GPU node with vLLM 0.32, or drop --adaptive-verification")


def arm_config(base: dict, adaptive: bool, mode: str) -> dict:
    """The ``speculative_config`` extras of one arm: ``base`` plus ``enable_adaptive_verification`` when the mode
    is not ``off`` (the off arm of ``both`` passes ``false`` explicitly, so the two arms differ in that key only)."""
    return {**base, ADAPTIVE_KEY: adaptive} if mode != "off" else dict(base)


def block_size_of(draft: str | Path | OpenedDraft) -> int | None:
    """The drafter's block size (its DraftSpec; DSpark / DFlash), or None (EAGLE-3, or no recipe reads it)."""
    spec = _spec(draft)
    return spec.block_size if spec is not None and spec.variant != "eagle3" and spec.block_size > 0 else None


def with_block_size(ns: list[int], draft: str | Path | OpenedDraft, temperature: float) -> tuple[list[int], str | None]:
    """``ns`` plus n = the drafter's block size when the lossless check runs (temperature 0) and it is missing;
    returns the sorted n values and the note to record (None when nothing was added)."""
    block = block_size_of(draft)
    if temperature != 0 or block is None or block in ns:
        return sorted(ns), None
    return sorted([*ns, block]), BLOCK_SIZE_NOTE.format(n=block)


def prepare(options: "SpecOptions", ns: list[int], *, draft: str | Path | OpenedDraft, temperature: float,
            backend) -> tuple[list[int], list[str]]:
    """What ``run_verify`` does with the options before anything loads: refuse a lossy rejection method for a
    lossless check and speculative-config keys for a backend that takes none; add n = block size when asked.

    Returns:
        (the n values to measure, the notes to record in the results' ``warnings``).

    Raises:
        SpecOptionError: see :func:`refuse_lossy_rejection`; extra keys for a backend other than ``vllm``.
    """
    refuse_lossy_rejection(options.speculative_config, temperature)
    name = backend if isinstance(backend, str) else getattr(backend, "name", "")
    if options.speculative_config and not _takes_speculative_config(name):
        keys = ", ".join(sorted(options.speculative_config))
        raise SpecOptionError(f"speculative-config keys ({keys}) are passed to vLLM's speculative_config by "
                              f"--backend vllm only; backend {name} does not take them",
                              hint="use --backend vllm, or start the server with them in --speculative-config")
    notes = list(options.notes)
    if options.lossless_at_block_size:
        ns, added = with_block_size(ns, draft, temperature)
        notes += [added] if added else []
    return ns, notes


def run_verify_arms(run, *, mode: str = "off", out: str | Path | None, speculative_config: dict | None = None,
                    lossless_at_block_size: bool = False, cuda: bool | None = None, **kwargs) -> list:
    """Run ``run`` (``runner.run_verify``) once per adaptive-verification arm; returns ``[(path, results)]``.

    Args:
        run: ``dsparkhub.verify.runner.run_verify`` (a parameter, so tests pass a fake and this module imports no
            runner).
        mode: ``off`` | ``on`` | ``both`` (:func:`check_adaptive` refuses it where vLLM cannot run it first).
        out: the results path; with ``both`` the arms go to :func:`arm_paths`.
        speculative_config: ``--speculative-option`` extras; lossless_at_block_size: as in :class:`SpecOptions`.
        cuda: whether CUDA is usable (None: ask torch); kwargs: the rest of ``run_verify``'s arguments.

    Raises:
        SpecOptionError / AdaptiveUnavailableError: see :func:`check_adaptive`; whatever ``run`` raises.
    """
    arms = adaptive_arms(mode)
    if any(arms):
        from dsparkhub.layouts.deepspec_run import resolve_step_dir
        from dsparkhub.verify.engines import detect_method

        draft = kwargs["draft"]
        if isinstance(draft, OpenedDraft):  # opened once by the caller (dsparkhub.verify.runner.open_inputs)
            folder = draft
        else:  # a DeepSpec run: its step_latest
            folder = resolve_step_dir(draft) if Path(draft).is_dir() else draft
        method = getattr(kwargs.get("settings"), "method", None) or detect_method(folder)
        check_adaptive(mode, backend=kwargs.get("backend", "reference"), method=method, draft=folder, cuda=cuda)
    done = []
    for arm, path in zip(arms, arm_paths(out, mode)):
        opts = SpecOptions(speculative_config=arm_config(dict(speculative_config or {}), arm, mode),
                           lossless_at_block_size=lossless_at_block_size, notes=(ADMITTED_NOTE,) if arm else ())
        done.append((path, run(out=path, spec_options=opts, **kwargs)))
    return done
