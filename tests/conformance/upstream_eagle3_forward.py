"""speculators 0.9.0's own EAGLE-3 forward on given inputs; run with ``.venv-upstream/bin/python`` (a subprocess of
tests/verify/test_reference_eagle3.py), never imported by the test process.

    .venv-upstream/bin/python tests/conformance/upstream_eagle3_forward.py DRAFTER INPUTS.safetensors OUT.safetensors

Builds ``Eagle3DraftModel`` (speculators/models/eagle3/core.py) from the drafter's config with eager attention (no
flex-attention compile on CPU), loads its tensors strictly except the verifier-borrowed ones, runs ``forward`` on
``hidden_states`` / ``input_ids`` / ``position_ids`` (one document) for ``ttt_steps`` steps and saves the logits of
every step (``lm_head`` outputs, caught by a forward hook) as ``step_{t}`` [1, T, Vd] float32.
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    drafter, inputs_file, out_file = sys.argv[1:4]
    config = Eagle3SpeculatorConfig.from_pretrained(drafter)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(config).float().eval()
    weights = {}
    import glob

    for f in sorted(glob.glob(f"{drafter}/*.safetensors")):
        weights.update(load_file(f))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    assert not unexpected, unexpected
    assert all(m.startswith("verifier_") for m in missing), missing
    inputs = load_file(inputs_file)
    caught = []
    model.lm_head.register_forward_hook(lambda mod, args, out: caught.append(out.detach().float().contiguous()))
    steps = int(inputs["ttt_steps"].item())
    with torch.no_grad():
        model(hidden_states=inputs["hidden_states"], input_ids=inputs["input_ids"],
              document_ids=torch.zeros_like(inputs["input_ids"]), position_ids=inputs["position_ids"],
              ttt_steps=steps)
    save_file({f"step_{t}": x for t, x in enumerate(caught)}, out_file)


if __name__ == "__main__":
    main()
