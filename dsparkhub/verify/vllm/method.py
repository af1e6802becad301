"""The speculative method to pass to vLLM for a drafter, taken from its :class:`~dsparkhub.layouts.spec.DraftSpec`.

The drafter is read once, by the recipes (:func:`dsparkhub.layouts.reading.open_draft`: config and safetensors
headers, no weights); its ``variant`` names the method. vLLM's own guess sniffs substrings of the path (FORMATS §1
"Method detection"); we never rely on it, and keep no architecture list of our own: a drafter the recipes cannot
read is refused here as everywhere else.
"""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.layouts.reading import open_draft
from dsparkhub.layouts.spec import DraftSpec
from dsparkhub.serving import METHODS

#: DraftSpec.variant -> the vLLM 0.32 speculative method that serves it (``config/speculative.py``; vLLM loads
#: DFlash-2 drafters, ``DFlash2DraftModel``, with method ``dflash``): ``dsparkhub.serving.METHODS``' variants.
VLLM_METHODS = {variant: m.name for m in METHODS.values() for variant in m.variants}


def method_for_spec(spec: DraftSpec) -> str:
    """The vLLM speculative method of a drafter read into ``spec``.

    Returns:
        ``"dspark"`` | ``"dflash"`` | ``"eagle3"``.

    Raises:
        LayoutError: ``spec.variant`` is not one vLLM 0.32 serves.
    """
    if spec.variant not in VLLM_METHODS:
        raise LayoutError(f"a {spec.variant} drafter (layout {spec.layout}, {spec.architecture}) has no speculative "
                          f"method vLLM 0.32 serves (expected one of {sorted(VLLM_METHODS)}).",
                          hint="Pass the method explicitly (--method) if you know vLLM supports it.")
    return VLLM_METHODS[spec.variant]


def method_for_drafter(drafter: str | Path) -> str:
    """:func:`method_for_spec` for a local drafter folder, read with the recipes (a DeepSpec run folder's
    ``step_latest`` is followed).

    Raises:
        LayoutError: the folder has no ``config.json`` (a Hub id is not read here: the network lives in
            ``dsparkhub.hub``), no known layout matches it, or its variant is not one vLLM serves.
        CheckpointNotFoundError / CheckpointFormatError / UnsafeCheckpointError: its weights cannot be read (see
            ``dsparkhub.io.checkpoint.open_checkpoint``).
    """
    folder = resolve_step_dir(drafter) if Path(drafter).is_dir() else Path(drafter)
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise LayoutError(
            f"cannot derive the speculative method: {path} does not exist (a Hub id is not read here).",
            path=path, hint="Pass the method explicitly (dspark, dflash or eagle3), or download the drafter first.",
        )
    return method_for_spec(open_draft(folder).spec)
