"""The speculative method to pass to vLLM for a drafter.

vLLM's own guess sniffs substrings of the path (FORMATS §1 "Method detection"); we never rely on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from dsparkhub.errors import LayoutError


# ------------------------------------------------------------------------------------------------------ method

# Architectures vLLM 0.32 serves with method "dspark" (model_executor/models/registry.py; config/speculative.py).
_DSPARK_ARCHS = {"Qwen3DSparkModel", "Qwen3OmniDSparkModel", "Gemma4DSparkModel", "K3DSparkModel",
                 "DSparkDraftModel", "DSparkV41DraftModel"}
_DFLASH_ARCHS = {"DFlashDraftModel", "DFlash2DraftModel", "MuseGlimmerAssistantModel"}
# speculators_model_type -> vLLM method (vLLM 0.32 transformers_utils/configs/speculators/algos.py).
_SPECULATORS_METHODS = {"dspark": "dspark", "dflash": "dflash", "dflash2": "dflash", "eagle3": "eagle3",
                        "peagle": "eagle3", "eagle": "eagle"}


def method_for_config(config: dict, *, source: str = "config.json") -> str:
    """The vLLM speculative method for a drafter (or a target with an attached drafter) from its config dict.

    Rules, first match wins: a speculators-format ``speculators_model_type``; DSpark architectures
    (``Qwen3DSparkModel``, ``K3DSparkModel``, ...), ``model_type: k3_dspark``, or ``dspark_*`` keys (a DeepSeek-V4
    target carrying its drafter) -> ``dspark``; ``DFlashDraftModel`` or a ``dflash_config`` -> ``dflash``; an
    architecture containing ``Eagle3`` -> ``eagle3``.

    Args:
        config: the parsed ``config.json``.
        source: where it came from, for the error message.

    Returns:
        ``"dspark"`` | ``"dflash"`` | ``"eagle3"`` | ``"eagle"``.

    Raises:
        LayoutError: nothing identifies the method.
    """
    spec_type = config.get("speculators_model_type")
    if spec_type is not None:
        if spec_type not in _SPECULATORS_METHODS:
            raise LayoutError(
                f"{source}: speculators_model_type {spec_type!r} is not one vLLM 0.32 serves "
                f"(expected one of {sorted(_SPECULATORS_METHODS)}).",
                hint="Pass the method explicitly (--method) if you know vLLM supports it.",
            )
        return _SPECULATORS_METHODS[spec_type]
    archs = set(config.get("architectures") or [])
    if archs & _DSPARK_ARCHS or config.get("model_type") == "k3_dspark" \
            or any(k.startswith("dspark_") for k in config):
        return "dspark"
    if archs & _DFLASH_ARCHS or "dflash_config" in config:
        return "dflash"
    if any("eagle3" in a.lower() for a in archs):
        return "eagle3"
    if any("eagle" in a.lower() for a in archs):
        return "eagle"
    raise LayoutError(
        f"{source}: cannot tell which speculative method serves this drafter: architectures "
        f"{sorted(archs) or 'missing'}, no speculators_model_type, no dflash_config, no dspark_* keys.",
        hint="Pass the method explicitly (dspark, dflash or eagle3).",
    )


def method_for_drafter(drafter: str | Path) -> str:
    """:func:`method_for_config` for a local drafter folder (its ``config.json``).

    Raises:
        LayoutError: the folder has no readable ``config.json`` (a Hub id is not read here: the network lives in
            ``dsparkhub.hub.push``), or nothing in it identifies the method.
    """
    path = Path(drafter) / "config.json"
    if not path.is_file():
        raise LayoutError(
            f"cannot derive the speculative method: {path} does not exist (a Hub id is not read here).",
            path=path, hint="Pass the method explicitly (dspark, dflash or eagle3), or download the drafter first.",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LayoutError(f"cannot read {path}: {exc}", path=path) from exc
    return method_for_config(config, source=str(path))
