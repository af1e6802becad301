"""Regenerate tests/conformance/fixtures/ with the real upstream trainers (run in .venv-upstream).

    PYTHONPATH=. .venv-upstream/bin/python tests/conformance/generators/make_fixtures.py

Upstream code that writes each fixture (versions pinned by scripts/setup_upstream.sh; recorded per fixture in
``fixtures/MANIFEST.json``):

- ``speculators-*``: ``speculators train --dry-run --save-path DIR`` (speculators 0.9.0 train/cli.py main: builds the
  drafter with ``from_training_args`` and calls ``save_pretrained``), against a toy Qwen3 verifier;
- ``dflash-*``: dflash 0.1.0 ``DFlashDraftModel(Qwen3Config(...)).save_pretrained`` /
  ``DFlash2DraftModel(...).save_pretrained`` (dflash/model.py).

The toy verifier is dsparkhub's own ``make_qwen3_target`` (seeded; the tests rebuild it identically), so the
fixtures hold drafter files only. Files the trainer writes beside the weights that name this machine
(``train_command.txt``, ``speculators.patch``, ``run.yaml``) are not kept. Weights are toy-sized BF16 (each
fixture < 60 KB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch

from dsparkhub.testing.factories import make_qwen3_target

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TARGET_NAME = "toy-qwen3-target"  # the verifier's name as the trainer records it (relative, machine-independent)
KEEP = {"config.json", "model.safetensors", "config.py"}

#: speculators fixtures: name -> extra `speculators train` flags (the toy verifier has 4 layers, hidden 32, vocab 128)
SPECULATORS = {
    # default DFlash: every layer sliding_attention, sliding_window_non_causal false (causal sliding layers)
    "speculators-dflash": ["--speculator-type", "dflash", "--num-layers", "1", "--block-size", "4",
                           "--sliding-window", "8", "--target-layer-ids", "1", "2"],
    # DSpark with bidirectional sliding layers and a confidence head
    "speculators-dspark-noncausal": ["--speculator-type", "dspark", "--num-layers", "1", "--block-size", "4",
                                     "--sliding-window", "8", "--target-layer-ids", "1", "2",
                                     "--sliding-window-non-causal", "--markov-rank", "8",
                                     "--enable-confidence-head"],
    # DFlash2: conv + candidate selector; sliding_window_non_causal defaults to true for it
    "speculators-dflash2": ["--speculator-type", "dflash2", "--num-layers", "1", "--block-size", "4",
                            "--sliding-window", "8", "--target-layer-ids", "1", "2", "--conv-kernel-size", "2",
                            "--conv-group-size", "8", "--selector-rank", "4", "--selector-top-k", "4"],
    # default EAGLE-3: norm_before_fc (input_norm.weight) and norm_output on
    "speculators-eagle3": ["--speculator-type", "eagle3", "--target-layer-ids", "1", "2", "3"],
}


def speculators_fixture(name: str, flags: list[str], work: Path) -> Path:
    out = work / name
    cmd = [str(Path(sys.executable).parent / "speculators"), "train", "--dry-run", "--verifier-name-or-path",
           TARGET_NAME, "--mask-token-id", "127", "--data-path", str(work / "no-data"), "--save-path", name, *flags]
    subprocess.run(cmd, cwd=work, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                   stdout=subprocess.DEVNULL)
    return out


def dflash_fixture(name: str, work: Path, *, dflash2: bool) -> Path:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    from transformers import Qwen3Config

    torch.manual_seed(0)
    target = json.loads((work / TARGET_NAME / "config.json").read_text())
    dflash_config = {"target_layer_ids": [0, 2], "mask_token_id": 127, "block_size": 4}
    if dflash2:
        dflash_config.update(conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=4)
    cfg = Qwen3Config(hidden_size=target["hidden_size"], num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, intermediate_size=64, vocab_size=target["vocab_size"],
                      max_position_embeddings=4096, rms_norm_eps=1e-6, num_target_layers=target["num_hidden_layers"],
                      block_size=4, dflash_config=dflash_config)
    cfg.architectures = ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"]
    model = (DFlash2DraftModel if dflash2 else DFlashDraftModel)(cfg)
    for p in model.parameters():  # save_pretrained leaves torch.empty values (e.g. base_kernel) as they are
        torch.nn.init.normal_(p, std=0.02)
    model.to(torch.bfloat16).save_pretrained(work / name)
    return work / name


def main() -> None:
    versions = {p: version(p) for p in ("speculators", "dflash", "transformers", "torch")}
    manifest = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_qwen3_target(work / TARGET_NAME)
        made = {name: speculators_fixture(name, flags, work) for name, flags in SPECULATORS.items()}
        made["dflash-dflash"] = dflash_fixture("dflash-dflash", work, dflash2=False)
        made["dflash-dflash2"] = dflash_fixture("dflash-dflash2", work, dflash2=True)
        for name, folder in made.items():
            dest = FIXTURES / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in folder.iterdir():
                if f.name in KEEP:
                    shutil.copy2(f, dest / f.name)
            producer = "speculators" if name.startswith("speculators") else "dflash"
            manifest[name] = {"producer": f"{producer} {versions[producer]}",
                              "how": ("speculators train --dry-run " + " ".join(SPECULATORS[name])
                                      if producer == "speculators" else
                                      f"dflash.model.{json.loads((dest / 'config.json').read_text())['architectures'][0]}"
                                      ".save_pretrained"),
                              "transformers": versions["transformers"], "torch": versions["torch"]}
    (FIXTURES / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
