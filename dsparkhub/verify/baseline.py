"""``dsparkhub verify --baseline``: what every speedup is measured against, parsed and checked before anything loads.

- ``none`` (default): the target alone, no speculation (the engine's ``num_speculative_tokens=None`` run);
- ``mtp:N``: the target's own MTP layers (vLLM method ``mtp``, ``num_speculative_tokens=N``). vLLM 0.32 reads the
  number of MTP layers from the target config's ``num_nextn_predict_layers`` (DeepSeek-V3 / V4, Kimi, GLM, MiMo...)
  or ``mtp_num_hidden_layers`` (Qwen3-Next / Qwen3.5), top level or in ``text_config``
  (``vllm/config/speculative.py``, ``SpeculativeConfig.hf_config_override``); a target without either (or with 0)
  has no MTP layers to speculate with. dsparkhub's reference engine has no MTP implementation; ``--backend vllm``
  (one request at a time) runs it as one more engine configuration (:class:`MtpBaseline`), after its child read what
  the installed vLLM makes of the target (:mod:`dsparkhub.verify.vllm.mtp`: model_types without an MTP drafter in
  vLLM's registry, and N above the MTP layers where vLLM refuses it, are refused before any engine starts);
- ``RESULTS.json[@n]``: another results file of the same setup (:mod:`dsparkhub.verify.baseline_results`);
- ``PATH[@n]``: another drafter folder, at ``n`` draft tokens (default: the tokens one trained block proposes,
  else the largest n measured); the reference engine runs it on the same target, interleaved with the drafter.

The baseline's identity is recorded as :class:`~dsparkhub.verify.results.schema.BaselineRef` (schema ``/3``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.verify.settings import EngineOptionError, VerifyArgumentError

#: the target config keys vLLM 0.32 reads the number of MTP layers from (``vllm/config/speculative.py``)
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


@dataclass(frozen=True)
class BaselineChoice:
    """A parsed ``--baseline``: ``kind`` (``none`` | ``mtp`` | ``drafter`` | ``results``), the drafter folder's or
    results file's ``path``, and ``n`` (None: for a drafter, its block size or the largest n measured; for a results
    file, its best n per concurrency; 0: a results file's own baseline run)."""

    kind: str = "none"
    path: str | None = None
    n: int | None = None


def parse_baseline(text: str | None) -> BaselineChoice:
    """``none`` | ``mtp:N`` | ``PATH[@n]`` into a :class:`BaselineChoice`.

    Raises:
        VerifyArgumentError: ``mtp:`` without a positive integer, ``@n`` not a positive integer, or a path that is
            not a folder (a results file as baseline is not measured by this version: the message says so).
    """
    text = (text or "none").strip()
    if text == "none":
        return BaselineChoice()
    if text.startswith("mtp:") or text == "mtp":
        n = text.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            raise VerifyArgumentError(f"--baseline {text}: expected mtp:N with N the target's MTP draft tokens "
                                      "(a positive integer), e.g. mtp:1")
        return BaselineChoice(kind="mtp", n=int(n))
    path, at, n = text.rpartition("@") if "@" in text and not Path(text).exists() else (text, "", "")
    if path.endswith(".json") and Path(path).is_file():  # a results file: dsparkhub.verify.baseline_results
        if at and not n.isdigit():
            raise VerifyArgumentError(f"--baseline {text}: the part after @ must be the file's "
                                      f"num_speculative_tokens (0: its own baseline run), found {n!r}")
        return BaselineChoice(kind="results", path=path, n=int(n) if at else None)
    if at and (not n.isdigit() or int(n) < 1):
        raise VerifyArgumentError(f"--baseline {text}: the part after @ must be the baseline drafter's "
                                  f"num_speculative_tokens (a positive integer), found {n!r}")
    if not Path(path).is_dir():
        raise VerifyArgumentError(f"--baseline {text}: {path} is not a drafter folder; expected none, mtp:N or a "
                                  "drafter folder PATH[@n]",
                                  hint="a converted drafter folder (config.json + safetensors), e.g. "
                                       "--baseline ./dflash-drafter@7")
    return BaselineChoice(kind="drafter", path=path, n=int(n) if at else None)


def mtp_layers(target: str | Path) -> int:
    """Number of MTP layers a local target's ``config.json`` declares under :data:`MTP_KEYS` (0 when none; a
    target that is not a local folder is not read and gives 0)."""
    cfg_path = Path(target) / "config.json"
    if not cfg_path.is_file():
        return 0
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for scope in (cfg, cfg.get("text_config") or {}):
        for key in MTP_KEYS:
            if isinstance(scope.get(key), int) and scope[key] > 0:
                return scope[key]
    return 0


def check_baseline(choice: BaselineChoice, *, backend: str, target: str | Path, interleaves: bool,
                   runs_mtp: bool = False, serve_sweep: bool = False) -> None:
    """Refuse a baseline this run cannot measure, in one paragraph, before any model loads.

    Args:
        choice: the parsed ``--baseline``.
        backend: the backend's name (``reference``, ``vllm``...).
        target: the target folder (or what the backend accepts).
        interleaves: whether the backend runs configurations interleaved in one process (the reference engine).
        runs_mtp: whether the backend starts an MTP configuration itself (``Engine.mtp_baseline``: vLLM offline).
        serve_sweep: the run measures concurrency above 1 through ``vllm serve`` + ``vllm bench serve``
            (``--load-driver bench-serve``), which starts no MTP configuration; the closed loop over vLLM's engine
            (``engine-loop``, the vllm default) does.

    Raises:
        EngineOptionError: ``mtp:N`` on the reference engine (it has no MTP implementation) or on a target whose
            config declares no MTP layers (vLLM 0.32's rule, :data:`MTP_KEYS`), on a backend that does not start
            an MTP configuration, or through the serve sweep; the installed vLLM's own rules (model_type, N above the
            MTP layers) are checked by ``VllmBackend.check_mtp``; a drafter baseline on a backend that starts one
            engine per configuration (vLLM: not wired in this version).
    """
    if choice.kind == "mtp":
        if backend == "reference":
            raise EngineOptionError(
                f"--baseline mtp:{choice.n} needs the target's own MTP layers run by vLLM (speculative method "
                "`mtp`); dsparkhub's reference engine has no MTP implementation, so it cannot measure that "
                "baseline. Nothing was loaded.", hint="use --backend vllm, or --baseline none / a drafter folder")
        if not mtp_layers(target):
            raise EngineOptionError(
                f"--baseline mtp:{choice.n}: the target {target} declares no MTP layers. vLLM 0.32 reads them from "
                f"the target config's {' or '.join(MTP_KEYS)} (top level or text_config; vllm/config/"
                "speculative.py), and this config.json has neither (or 0), so there is nothing to speculate with. "
                "Nothing was loaded.", hint="--baseline none, or a drafter folder as baseline")
        if not runs_mtp:
            raise EngineOptionError(
                f"--baseline mtp:{choice.n} on --backend {backend}: this backend measures engines it did not start "
                "(or has no MTP configuration), so it cannot run the target's MTP layers; --backend vllm starts "
                "them (vLLM method `mtp`). Nothing was loaded.", hint="use --backend vllm, or --baseline none")
        if serve_sweep:
            raise EngineOptionError(
                f"--baseline mtp:{choice.n} with --load-driver bench-serve: that driver measures concurrency above 1 "
                "with `vllm serve` + `vllm bench serve`, which does not start an MTP configuration in this version; "
                "the closed loop over vLLM's engine (--load-driver engine-loop, the default of --backend vllm) does. "
                "Nothing was loaded.", hint="drop --load-driver, or --baseline none")
    if choice.kind == "drafter" and not interleaves:
        raise EngineOptionError(
            f"--baseline {choice.path}: a drafter baseline is measured by the reference engine (interleaved with "
            f"the drafter on one loaded target); --backend {backend} starts one engine per configuration and does "
            "not run a second drafter in this version. Nothing was loaded.", hint="use --backend reference")


def baseline_n(choice: BaselineChoice, ns: list[int]) -> int:
    """The baseline drafter's n: the given ``@n``, else the tokens one trained block of it proposes
    (``DraftSpec.proposals_per_block``: block size - 1 for DFlash's 1+N layout, the block size for DSpark's
    anchor-first one; larger n gets DSH401), else the largest n measured (no layout recipe reads the folder)."""
    if choice.n is not None:
        return choice.n
    from dsparkhub.errors import DsparkhubError
    from dsparkhub.layouts.reading import open_draft

    try:
        return open_draft(choice.path).spec.proposals_per_block
    except DsparkhubError:
        return max(ns)


def baseline_engine(engine, choice: BaselineChoice):
    """A shallow copy of a reference ``engine`` drafting with the baseline drafter on the same loaded target.

    Raises:
        VerifyError: the baseline drafter cannot be loaded on this target (``load_drafter``'s message).
    """
    from dsparkhub.verify.reference.loading import load_drafter

    other = copy.copy(engine)
    other.drafter = load_drafter(choice.path, engine.target, dtype=next(engine.target.parameters()).dtype,
                                 device=engine._device)
    other.confidence_threshold = None
    return other


class MtpBaseline:
    """A vLLM backend drafting with the target's own MTP layers (``speculative_config={"method": "mtp",
    "num_speculative_tokens": n}``, no drafter model): the baseline configuration of ``--baseline mtp:N``, run as
    the runner runs a drafter baseline (timed; untimed target-alone pass for the lossless check)."""

    def __init__(self, engine, n: int):
        self.engine, self.n = engine, n
        self.name, self.version, self.device = engine.name, engine.version, engine.device

    def run(self, prompts, *, num_speculative_tokens, **kwargs):
        """``engine.run`` at ``num_speculative_tokens`` with the method ``mtp`` (see ``VllmBackend.run``)."""
        return self.engine.run(prompts, num_speculative_tokens=num_speculative_tokens, method="mtp", **kwargs)


def mtp_baseline(engine, choice: BaselineChoice) -> MtpBaseline:
    """The :class:`MtpBaseline` of ``engine`` at ``choice.n``, after ``engine.check_mtp`` (no engine starts).

    Raises:
        EngineUnavailableError: the installed vLLM cannot draft with the target's MTP layers at that n (one
            paragraph), or the engine cannot check it (no ``check_mtp``).
    """
    if not hasattr(engine, "check_mtp"):
        from dsparkhub.errors import EngineUnavailableError

        raise EngineUnavailableError(f"--baseline mtp:{choice.n}: backend {engine.name} has no MTP configuration",
                                     hint="use --backend vllm")
    engine.check_mtp(choice.n)
    return MtpBaseline(engine, choice.n)
