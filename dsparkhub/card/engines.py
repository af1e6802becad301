"""The card's engine facts beyond vLLM: the SGLang 0.5.23 launch command, and which engines' own checks passed.

:func:`sglang_launch` spells SGLang's flags for the n the card recommends to vLLM. The two engines count draft
tokens differently, which is why the card spells both out:

- DSpark: vLLM's ``num_speculative_tokens`` is γ (the tokens one step proposes); SGLang takes
  ``--speculative-dspark-block-size`` = γ and sets ``--speculative-num-draft-tokens`` to γ + 1 (the verify window:
  anchor + γ) itself — giving it γ + 1 by hand with another block size is refused
  (sglang 0.5.23 ``arg_groups/speculative_hook.py:806-838``).
- DFlash (1+N): vLLM's n is the N proposals; SGLang's ``--speculative-dflash-block-size`` is the whole block
  including the anchor, N + 1, and equals ``--speculative-num-draft-tokens`` (``speculative_hook.py:368-386``).

:func:`engine_checks` reads the ``--json`` reports of ``dsparkhub vllm-check`` / ``dsparkhub sglang-check`` for the
card's "Engine checks" lines (engine, version, each stage's status). It does not run any engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsparkhub.errors import CardError
from dsparkhub.validate.sidecar import STS_FILE


__all__ = ["engine_checks", "sglang_launch"]


def sglang_launch(method: str, n: int, *, target: str, model: str, tensor_parallel_size: int = 1,
                  max_model_len: int | None = None, sts_positions: int | None = None) -> dict[str, Any] | None:
    """SGLang 0.5.23's ``launch_server`` command for serving ``model`` with ``target`` at vLLM's n.

    Args:
        method: ``"dspark"`` or ``"dflash"`` (other methods: None, no SGLang command is given).
        n: vLLM's ``num_speculative_tokens`` the card recommends.
        target, model: target and drafter (paths or Hub ids).
        tensor_parallel_size: ``--tp-size``. max_model_len: ``--context-length`` (None: not passed).
        sts_positions: how many temperatures the drafter's ``dspark_sts.json`` holds (None: no sidecar). DSpark
            only: when it equals γ = ``n`` the command passes the sidecar with
            ``--speculative-dspark-confidence-sts-path``, a local file for SGLang (``load_sts_calibration_from_path``),
            fetched with ``hf download``; SGLang refuses a table fitted for another γ (sglang 0.5.23
            ``speculative/dspark_components/dspark_planner.py:106-113``), so then the note says so instead.

    Returns:
        ``{"cli": str, "algorithm": "DSPARK" | "DFLASH", "block_size_flag": str, "block_size": int,
        "num_draft_tokens": int, "note": str}`` or None.
    """
    if method == "dspark":
        algorithm, flag, block, window = "DSPARK", "--speculative-dspark-block-size", n, n + 1
        note = (f"SGLang's `--speculative-dspark-block-size` is γ = vLLM's `num_speculative_tokens` ({n}); SGLang "
                "sets `--speculative-num-draft-tokens` to γ + 1 (the anchor plus γ drafted tokens) itself.")
    elif method == "dflash":
        algorithm, flag, block, window = "DFLASH", "--speculative-dflash-block-size", n + 1, n + 1
        note = (f"SGLang's `--speculative-dflash-block-size` is the whole 1+N block (the bonus anchor plus vLLM's "
                f"`num_speculative_tokens` = {n} proposals), and SGLang uses it as `--speculative-num-draft-tokens`.")
    else:
        return None
    cli = [f"python -m sglang.launch_server --model-path {target}", f"--speculative-algorithm {algorithm}",
           f"--speculative-draft-model-path {model}", f"{flag} {block}"]
    if method == "dspark" and sts_positions is not None:
        if sts_positions == n:
            cli.append(f'--speculative-dspark-confidence-sts-path "$(hf download {model} {STS_FILE})"')
            note += (f" `{STS_FILE}` (the confidence head's calibration, see below) is a local file for SGLang: "
                     "`hf download` fetches it and prints its path.")
        else:
            note += (f" `{STS_FILE}` was fitted for γ = {sts_positions} and SGLang refuses it at γ = {n}, so the "
                     f"command leaves it out; serve with `{flag} {sts_positions}` to use it.")
    if tensor_parallel_size != 1:
        cli.append(f"--tp-size {tensor_parallel_size}")
    if max_model_len is not None:
        cli.append(f"--context-length {max_model_len}")
    return {"cli": " \\\n  ".join(cli), "algorithm": algorithm, "block_size_flag": flag, "block_size": block,
            "num_draft_tokens": window, "note": note}


def engine_checks(paths: list[str | Path]) -> list[dict[str, Any]]:
    """The engine-check lines of the card from ``vllm-check --json`` / ``sglang-check --json`` reports.

    Returns:
        One ``{"engine": "vLLM" | "SGLang", "version": str, "ok": bool, "stages": "config passed, ...", "command",
        "contract": str | None}`` per file, in the given order; ``contract`` says which vLLM version's facts judged the
        check when they are not the checking vLLM's own confirmed ones (``vllm-check --vllm-version``, a vLLM newer
        than dsparkhub's contract).

    Raises:
        CardError: a file is missing, not JSON, or not such a report.
    """
    out = []
    for p in paths:
        path = Path(p)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CardError(f"engine check report {path} is unreadable: {exc}", path=path) from None
        if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
            raise CardError(f"{path} is not a `dsparkhub vllm-check --json` / `sglang-check --json` report "
                            "(no stages list)", path=path)
        if "sglang_version" in data:
            engine, version = "SGLang", data.get("sglang_version")
        elif "vllm_version" in data:
            engine, version = "vLLM", data.get("vllm_version")
        else:
            raise CardError(f"{path} names no engine version (vllm_version / sglang_version)", path=path)
        stages = ", ".join(f"{s.get('name')} {s.get('status')}" for s in data["stages"])
        out.append({"engine": engine, "version": version, "ok": bool(data.get("ok")), "stages": stages,
                    "command": "sglang-check" if engine == "SGLang" else "vllm-check",
                    "contract": _contract_note(data.get("contract"), version)})
    return out


def _contract_note(contract: Any, version: Any) -> str | None:
    """A few words on the vLLM contract a ``vllm-check`` report was judged with, or None when it is the checking
    vLLM's own, confirmed (or the report predates contracts)."""
    if not isinstance(contract, dict):
        return None
    judged, line = contract.get("vllm_version"), contract.get("contract_line")
    if not contract.get("confirmed", True):
        return f"judged with vLLM {line}'s facts, not confirmed for vLLM {judged}"
    if judged != version:
        return f"judged as vLLM {judged} (its sharing rules and loader guards)"
    return None
