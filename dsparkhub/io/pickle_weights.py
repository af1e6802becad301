"""Pickle weights (``.bin`` / ``.pt`` / ...), read only on request and only through PyTorch's restricted unpickler.

Owns: finding pickle weight files (training state excluded) and copying them into a temporary safetensors folder
(``--allow-pickle``). Nothing here runs at import time; torch is imported only when a file is actually converted.
"""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError
from dsparkhub.io.safety import PICKLE_SUFFIXES, TRAINING_STATE_PREFIXES


def pickle_weight_files(folder: Path) -> list[str]:
    """Names of the pickle weights files in ``folder`` (``.bin`` / ``.pt`` / ... ; training state excluded), sorted."""
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and p.suffix in PICKLE_SUFFIXES and not p.name.startswith(TRAINING_STATE_PREFIXES))


def _state_dict_of(obj, source: Path) -> dict:
    """The ``{name: tensor}`` inside what ``torch.load`` returned (plain, or under state_dict / model / module)."""
    import torch

    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and set(obj) == {key} and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                       for k, v in obj.items()):
        kinds = sorted({type(v).__name__ for v in obj.values()}) if isinstance(obj, dict) else [type(obj).__name__]
        raise CheckpointFormatError(f"pickle file holds {kinds[:5]}, not a state dict of named tensors",
                                    path=source, hint="save the model's state_dict() to safetensors yourself")
    return obj


def pickle_as_safetensors(folder: str | Path) -> Path:
    """Copy a checkpoint whose weights are pickle files into a temporary safetensors folder (``--allow-pickle``).

    Each weights file (``.bin`` / ``.pt`` / ``.pth`` / ``.pkl`` / ``.ckpt``, training state excluded) is read with
    ``torch.load(weights_only=True, map_location="cpu")`` — PyTorch's restricted unpickler, which refuses anything
    but tensors and plain containers — and all tensors are written to one ``model.safetensors`` next to copies of
    the folder's ``*.json`` files, in a temporary folder removed when the process exits. The source folder is never
    modified.

    Returns:
        the temporary folder (named like the source folder).

    Raises:
        CheckpointNotFoundError: the folder holds no pickle weights.
        UnsafeCheckpointError: ``weights_only=True`` refused a file (it asks to build arbitrary objects).
        CheckpointFormatError: a file is not a state dict of tensors, or two files hold the same tensor name.
    """
    import atexit
    import pickle
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    names = pickle_weight_files(folder)
    if not names:
        raise CheckpointNotFoundError("no pickle weights (.bin / .pt / .pth) to convert", path=folder)
    tensors: dict = {}
    for name in names:
        try:
            obj = torch.load(folder / name, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError, ValueError) as exc:
            raise UnsafeCheckpointError(f"torch.load(weights_only=True) refused {name}: {str(exc)[:300]}",
                                        path=folder / name,
                                        hint="the file asks to build more than tensors; dsparkhub will not load it "
                                             "with a full unpickler — re-save it as safetensors where you trust it"
                                        ) from None
        for key, value in _state_dict_of(obj, folder / name).items():
            if key in tensors:
                raise CheckpointFormatError(f"tensor {key!r} appears in two pickle files", path=folder)
            tensors[key] = value.detach().contiguous().clone()  # clone: safetensors refuses shared storage
    tmp = Path(tempfile.mkdtemp(prefix="dsparkhub-pickle-")) / folder.name
    atexit.register(shutil.rmtree, tmp.parent, True)
    tmp.mkdir()
    for extra in folder.glob("*.json"):
        if extra.is_file() and not extra.name.endswith(".index.json"):
            shutil.copyfile(extra, tmp / extra.name)
    save_file(tensors, str(tmp / "model.safetensors"),
              metadata={"format": "pt", "dsparkhub_converted_from": ",".join(names)})
    return tmp
