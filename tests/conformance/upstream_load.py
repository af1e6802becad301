"""Load checkpoints with the upstream trainers' own loaders; run with ``.venv-upstream/bin/python`` (a subprocess
of tests/conformance/test_upstream_loaders.py), never imported by the test process.

    .venv-upstream/bin/python tests/conformance/upstream_load.py '[{"loader": "speculators", "path": DIR}, ...]'

Prints one JSON list: per checkpoint ``{"path", "ok", "cls", "error", "unexpected", "missing", "borrowed",
"mismatched", "causal"}``. Loaders: speculators 0.9.0 ``SpeculatorModel.from_pretrained`` (speculators/model.py),
dflash 0.1.0 ``DFlashDraftModel`` / ``DFlash2DraftModel.from_pretrained`` (dflash/model.py), picked by the config's
``architectures``. Neither loader is strict about names (transformers only warns), so every file tensor must be a
parameter of the built model and equal to it bit for bit, and every parameter must come from the file except the
ones the drafter borrows from its verifier (``verifier_*``, ``embed_tokens``, ``lm_head``). ``causal`` is each
draft layer's attention causality as the upstream model resolved it.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

BORROWED = ("verifier_", "embed_tokens.", "lm_head.")


def _file_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _load(loader: str, folder: Path):
    if loader == "speculators":
        from speculators import SpeculatorModel

        model = SpeculatorModel.from_pretrained(str(folder))
        types = getattr(model.config.transformer_layer_config, "layer_types", None) or []
        noncausal = bool(getattr(model, "sliding_window_non_causal", False))
        # speculators models/dflash/attention.py:43: full attention always bidirectional
        causal = ([t == "sliding_attention" and not noncausal for t in types]
                  if hasattr(model, "sliding_window_non_causal") else None)  # EAGLE-3 has no block attention
        return model, causal
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    cls = {"DFlashDraftModel": DFlashDraftModel, "DFlash2DraftModel": DFlash2DraftModel}[arch]
    model = cls.from_pretrained(str(folder))
    return model, [bool(layer.self_attn.is_causal) for layer in model.layers]


def check(loader: str, path: str) -> dict:
    import torch

    folder = Path(path)
    result = {"path": path, "ok": False, "cls": None, "error": None, "unexpected": [], "missing": [],
              "borrowed": [], "mismatched": [], "causal": None}
    try:
        model, causal = _load(loader, folder)
    except Exception as exc:  # noqa: BLE001 - the upstream loader's refusal is the result
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["trace"] = traceback.format_exc()[-2000:]
        return result
    result["cls"], result["causal"] = type(model).__name__, causal
    params = dict(model.state_dict())
    tensors = _file_tensors(folder)
    matched = set()
    for name, t in tensors.items():
        # dflash's codebooks are nn.Embedding: a bare file name lands on `.weight` (DFlash2DraftModel key_mapping)
        pname = next((n for n in (name, name + ".weight") if n in params), None)
        if pname is None:
            result["unexpected"].append(name)
            continue
        matched.add(pname)
        p = params[pname]
        if tuple(p.shape) != tuple(t.shape) or not torch.equal(p.to(t.dtype), t):
            result["mismatched"].append(name)
    for pname in sorted(set(params) - matched):
        (result["borrowed"] if pname.startswith(BORROWED) else result["missing"]).append(pname)
    result["ok"] = not (result["unexpected"] or result["missing"] or result["mismatched"])
    return result


def main() -> None:
    jobs = json.loads(sys.argv[1])
    print(json.dumps([check(j["loader"], j["path"]) for j in jobs]))


if __name__ == "__main__":
    main()
