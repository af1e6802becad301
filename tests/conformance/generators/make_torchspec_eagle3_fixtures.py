"""Regenerate tests/conformance/fixtures/torchspec-eagle3*/ and torchspec-dflash/ with TorchSpec's own code.

    PYTHONPATH=. .venv-upstream/bin/python tests/conformance/generators/make_torchspec_eagle3_fixtures.py \
        [--src DIR] [--dsparkhub-python .venv/bin/python]

What runs is deepinfra/TorchSpec ``30189db`` (``make_torchspec_fixtures.UPSTREAM_COMMIT``), unmodified except
where listed below:

1. the draft: ``torchspec.models.draft.AutoEagle3DraftModel.from_config(AutoDraftModelConfig.from_file(CONFIG))``
   (a ``LlamaForCausalLMEagle3``: the config ``torchspec.config.utils.generate_draft_model_config`` writes --
   ``architectures ["LlamaForCausalLMEagle3"]``, ``model_type "llama"`` -- toy-sized for dsparkhub's
   ``make_qwen3_target``: hidden 32, vocab 128, three aux layers ``eagle_config.eagle_aux_hidden_state_layer_ids``
   [0, 1, 2]), weights drawn N(0, 0.02), cast to BF16, its embedding loaded from the target with
   ``load_embedding`` (what ``_convert_fsdp_to_hf`` does given ``--target-model-path``);
   and ``torchspec.models.draft.dflash.DFlashDraftModel(DFlashConfig(...))`` (the keys of
   ``torchspec/config/dflash_draft_config.json``, toy-sized: hidden 32, 1 layer, target layers [1, 2] of 4),
   drawn and embedded the same way;
2. the export: ``tools/convert_to_hf.py``'s own writers --
   - ``torchspec-eagle3`` / ``torchspec-dflash``: ``_save_without_vocab_pruning(model, OUT, config, vocab_size)``;
   - ``torchspec-eagle3-pruned``: ``_save_with_vocab_pruning(model, OUT, config, 128, 64, d2t, t2d)`` with
     ``d2t`` / ``t2d`` from ``torchspec.data.preprocessing.process_token_dict_to_mappings`` over synthetic token
     counts (what ``_convert_fsdp_to_hf(prune_vocab=True)`` does after counting a dataset).

Two defects of ``convert_to_hf.py`` at 30189db this keeps as TorchSpec writes them:

- a drafter *trained* with a reduced vocab (``draft_vocab_size < vocab_size``, EAGLE-3's usual set-up) cannot be
  exported: without ``--prune-vocab`` ``_convert_fsdp_to_hf`` raises (``:531-537``), with it
  ``_save_with_vocab_pruning`` raises "lm_head is already pruned" (``:314-320``). Only a full-vocab drafter
  pruned after training is exportable, which is what the pruned fixture is;
- that post-training prune trims ``lm_head`` with ``tensors["lm_head.weight"][d2t]`` (``:313``), but ``d2t``
  holds *offsets* (target id = k + d2t[k], ``torchspec/data/preprocessing.py:482``): draft row k is the target
  row ``d2t[k]``, not ``k + d2t[k]``. Every run of consecutive kept ids shares one offset, so those draft rows are
  byte-identical copies of one wrong row. dsparkhub refuses such an lm_head (``torchspec-eagle3`` recipe).

Patches, nothing else:

- ``numba`` / ``wandb`` import stubs (as make_torchspec_fixtures.py);
- the training checkpoint round trip (``checkpoint.save`` then ``_load_fsdp_state_dict``) is skipped: the
  in-memory model is handed to the writers (as make_torchspec_k3_fixtures.py does);
- ``_save_with_vocab_pruning`` is called through the one-argument ``_prepare_export_tensors`` (the 30189db
  ``:299`` vs ``:257`` TypeError make_torchspec_fixtures.py documents).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import torch

# make_torchspec_fixtures.py's source / stubs helpers without its dsparkhub import (.venv-upstream has no msgspec:
# the toy target is made by dsparkhub's own venv, ``--dsparkhub-python``)
sys.modules.setdefault("dsparkhub.testing.factories", type(sys)("dsparkhub.testing.factories"))
sys.modules["dsparkhub.testing.factories"].make_qwen3_target = None
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_torchspec_fixtures import (  # noqa: E402
    FIXTURES, UPSTREAM_COMMIT, UPSTREAM_REPO, torchspec_source, write_stubs,
)

DRAFT_VOCAB = 64

#: generate_draft_model_config's keys (torchspec/config/utils.py:105-140) for the toy Qwen3 verifier
DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128, "draft_vocab_size": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_theta": 1000000.0, "hidden_act": "silu", "target_hidden_size": 32,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}, "tie_word_embeddings": False,
}


#: torchspec/config/dflash_draft_config.json, sized for the toy verifier
DFLASH_CONFIG = {
    "architectures": ["DFlashDraftModel"], "model_type": "dflash",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_theta": 1000000.0, "num_target_layers": 2, "target_hidden_size": 32,
    "target_num_hidden_layers": 4, "target_layer_ids": [1, 2], "mask_token_id": 127, "tie_word_embeddings": False,
}


def build_dflash(target: Path):
    from torchspec.models.draft.dflash import DFlashConfig, DFlashDraftModel

    torch.manual_seed(0)
    model = DFlashDraftModel(DFlashConfig(**{k: v for k, v in DFLASH_CONFIG.items()
                                             if k not in ("architectures", "model_type")}))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model = model.to(torch.bfloat16)
    model.load_embedding(str(target))
    return model


def build_model(config_path: Path, target: Path):
    from torchspec.models.draft import AutoDraftModelConfig, AutoEagle3DraftModel

    torch.manual_seed(0)
    model = AutoEagle3DraftModel.from_config(AutoDraftModelConfig.from_file(str(config_path)))
    for p in model.parameters():  # a trained-looking drafter: no all-ones norms
        torch.nn.init.normal_(p, std=0.02)
    model = model.to(torch.bfloat16)
    model.load_embedding(str(target))
    return model


def prune_maps():
    from torchspec.data.preprocessing import process_token_dict_to_mappings

    # the top 64 are 0..31 and 65, 67, ..., 127 (two offset runs: d2t 0 for ids 0..31, then 33, 34, ...)
    counts = Counter({i: 200 - i for i in range(128)})
    counts.update({i: 500 for i in range(65, 128, 2)})
    return process_token_dict_to_mappings(counts, DRAFT_VOCAB, 128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="a TorchSpec checkout (default: the mirror at UPSTREAM_COMMIT)")
    ap.add_argument("--dsparkhub-python", default=".venv/bin/python", help="makes the toy Qwen3 target")
    a = ap.parse_args()
    versions = {p: version(p) for p in ("transformers", "torch", "safetensors")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = torchspec_source(a.src, work)
        sys.path[:0] = [str(write_stubs(work)), str(src), str(src / "tools")]
        import convert_to_hf as ts

        target = work / "toy-qwen3-target"
        subprocess.run([a.dsparkhub_python, "-c", "import sys; from dsparkhub.testing.factories import "
                        "make_qwen3_target; make_qwen3_target(sys.argv[1])", str(target)], check=True)
        config_path = work / "config.json"
        config_path.write_text(json.dumps(DRAFT_CONFIG, indent=2))
        model = build_model(config_path, target)
        one_arg = ts._prepare_export_tensors
        ts._prepare_export_tensors = lambda hf_model, *_: one_arg(hf_model)  # patch: :299 vs :257
        d2t, t2d = prune_maps()
        dflash = build_dflash(target)
        made = {"torchspec-dflash": "_save_without_vocab_pruning(DFlashDraftModel, OUT, config, 128)",
                "torchspec-eagle3": "_save_without_vocab_pruning(model, OUT, config, 128)",
                "torchspec-eagle3-pruned": f"_save_with_vocab_pruning(model, OUT, config, 128, {DRAFT_VOCAB}, d2t, "
                                           "t2d) (d2t, t2d: process_token_dict_to_mappings)"}
        for name, how in made.items():
            out = work / name
            out.mkdir()
            if name == "torchspec-dflash":
                ts._save_without_vocab_pruning(dflash, str(out), dict(DFLASH_CONFIG), 128)
            elif "pruned" in name:
                ts._save_with_vocab_pruning(model, str(out), dict(DRAFT_CONFIG), 128, DRAFT_VOCAB, d2t, t2d)
            else:
                ts._save_without_vocab_pruning(model, str(out), dict(DRAFT_CONFIG), 128)
            dest = FIXTURES / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in ("config.json", "model.safetensors"):
                shutil.copy2(out / f, dest / f)
            upstream = {"repository": UPSTREAM_REPO, "commit": UPSTREAM_COMMIT, "how": how,
                        "model": "DFlashDraftModel(DFlashConfig) (BF16)" if name == "torchspec-dflash" else
                        "AutoEagle3DraftModel.from_config -> LlamaForCausalLMEagle3 (BF16)",
                        "draft_config": DFLASH_CONFIG if name == "torchspec-dflash" else DRAFT_CONFIG,
                        "patches": ["numba / wandb import stubs", "checkpoint round trip skipped (in-memory model)"]
                        + (["convert_to_hf.py:299 _prepare_export_tensors called with one argument"]
                           if "pruned" in name else []),
                        "upstream_defects": ["convert_to_hf.py:313 trims lm_head with lm_head[d2t], d2t being "
                                             "offsets (preprocessing.py:482): wrong rows"] if "pruned" in name else [],
                        **versions}
            (dest / "UPSTREAM.json").write_text(json.dumps(upstream, indent=2) + "\n")
            print(name, sorted(p.name for p in dest.iterdir()), sum(p.stat().st_size for p in dest.iterdir()))


if __name__ == "__main__":
    main()
