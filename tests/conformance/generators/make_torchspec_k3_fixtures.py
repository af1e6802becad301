"""Regenerate tests/conformance/fixtures/torchspec-k3-dspark*/ with TorchSpec's own K3 DSpark code (.venv-upstream).

    PYTHONPATH=. .venv-upstream/bin/python tests/conformance/generators/make_torchspec_k3_fixtures.py \
        --dspark-py DSPARK_PY [--src DIR]

``K3DSparkConfig`` / ``K3DSparkModel`` exist only in ``torchspec/models/draft/dspark.py`` of lightseekorg/TorchSpec
``7f1e0906`` (``DSPARK_COMMIT``). No git mirror holds that commit (the lightseekorg mirror stops at 6f21829, the
deepinfra one at 30189db), only that one file is stored, so it is passed as ``--dspark-py`` and laid over the
deepinfra/TorchSpec 30189db tree (``make_torchspec_fixtures.UPSTREAM_COMMIT``) that every module it imports
(``deepseek_eagle.DeepSeekMLAAttention`` / ``_rotate_half_interleaved``, ``dflash.DFlash*``,
``ops.flex_attention``) comes from. What runs is TorchSpec's own code:

1. the draft: ``K3DSparkModel(K3DSparkConfig(**DRAFT_CONFIG))`` (Kimi K3's keys, toy-sized: hidden 32, 2 layers,
   vocab 128; ``markov_head_type`` left to the 7f1e090 default, ``"vanilla"``), weights drawn N(0, 0.02), cast to
   BF16 as ``DFlashTrainer.init_model`` does;
2. the export: ``tools/convert_to_hf.py``'s own writers at 30189db --
   - ``torchspec-k3-dspark``: ``_save_without_vocab_pruning(model, OUT, config, vocab_size)``;
   - ``torchspec-k3-dspark-pruned``: ``_save_with_vocab_pruning(...)`` with ``d2t`` / ``t2d`` from
     ``torchspec.data.preprocessing.process_token_dict_to_mappings`` over synthetic token counts (as
     ``_convert_fsdp_to_hf(prune_vocab=True)`` does after counting a dataset).

Patches, nothing else:

- the committed fixtures were made with a copy of the 7f1e090 file transcribed from the code index without
  ``K3DSparkMLAAttention.forward`` (never called: no forward pass is run to make a checkpoint);

- ``numba`` / ``wandb`` import stubs (as make_torchspec_fixtures.py);
- the 30189db ``DFlashDecoderLayer`` builds ``DFlashAttention`` by name (7f1e090's has the ``attention_class`` hook
  ``K3DSparkDecoderLayer`` sets): ``dflash.DFlashAttention`` is pointed at ``K3DSparkMLAAttention`` while the model
  is built;
- the training checkpoint round trip (``checkpoint.save`` then ``_load_fsdp_state_dict``) is skipped: the
  in-memory model is handed to the writers (30189db's ``AutoEagle3DraftModel`` has no ``k3_dspark`` entry);
- ``_save_with_vocab_pruning`` is called through the one-argument ``_prepare_export_tensors`` (the 30189db bug
  make_torchspec_fixtures.py documents).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import torch

# make_torchspec_fixtures.py's source / stubs helpers, without its dsparkhub import (not needed here: no target)
sys.modules.setdefault("dsparkhub.testing.factories", type(sys)("dsparkhub.testing.factories"))
sys.modules["dsparkhub.testing.factories"].make_qwen3_target = None
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_torchspec_fixtures import (  # noqa: E402
    FIXTURES, UPSTREAM_COMMIT, UPSTREAM_REPO, torchspec_source, write_stubs,
)

DSPARK_REPO = "lightseekorg/TorchSpec"
DSPARK_COMMIT = "7f1e0906abcb8aebaee8191f41a49b07f457b4c2"
DRAFT_VOCAB = 64

#: K3DSparkConfig's keys (Inferact Kimi-K3-DSpark's shape: dense MLA layers, q_lora, no output gate), toy-sized
DRAFT_CONFIG = {
    "architectures": ["K3DSparkModel"], "model_type": "k3_dspark",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
    "v_head_dim": 8, "mla_use_output_gate": False, "vocab_size": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
    "num_target_layers": 3, "target_hidden_size": 32, "target_num_hidden_layers": 8, "target_layer_ids": [1, 3, 5],
    "mask_token_id": 126, "markov_rank": 8, "enable_confidence_head": True, "confidence_head_with_markov": True,
    "tie_word_embeddings": False,
}


def build_model(src: Path):
    from torchspec.models.draft import dflash
    from torchspec.models.draft.dspark import K3DSparkConfig, K3DSparkMLAAttention, K3DSparkModel

    torch.manual_seed(0)
    config = K3DSparkConfig(**{k: v for k, v in DRAFT_CONFIG.items() if k not in ("architectures", "model_type")})
    gqa = dflash.DFlashAttention
    dflash.DFlashAttention = K3DSparkMLAAttention  # patch: 30189db has no attention_class hook
    try:
        model = K3DSparkModel(config)
    finally:
        dflash.DFlashAttention = gqa
    for p in model.parameters():  # a trained-looking drafter
        torch.nn.init.normal_(p, std=0.02)
    return model.to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dspark-py", required=True, help=f"torchspec/models/draft/dspark.py at {DSPARK_COMMIT}")
    ap.add_argument("--src", help="a TorchSpec checkout (default: the deepinfra mirror at UPSTREAM_COMMIT)")
    a = ap.parse_args()
    versions = {p: version(p) for p in ("transformers", "torch", "safetensors")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = torchspec_source(a.src, work)
        shutil.copy2(a.dspark_py, src / "torchspec" / "models" / "draft" / "dspark.py")
        stubs = write_stubs(work)
        sys.path[:0] = [str(stubs), str(src), str(src / "tools")]
        import convert_to_hf as ts
        from torchspec.data.preprocessing import process_token_dict_to_mappings

        model = build_model(src)
        V = DRAFT_CONFIG["vocab_size"]
        out_plain, out_pruned = work / "plain", work / "pruned"
        out_plain.mkdir()
        out_pruned.mkdir()
        ts._save_without_vocab_pruning(model, str(out_plain), DRAFT_CONFIG, V)
        counts = Counter({i: 200 - i for i in range(V)})  # the same non-contiguous top 64 as the Qwen3 fixture
        counts.update({i: 500 for i in range(65, V, 2)})
        d2t, t2d = process_token_dict_to_mappings(counts, DRAFT_VOCAB, V)
        one_arg = ts._prepare_export_tensors
        ts._prepare_export_tensors = lambda hf_model, *_: one_arg(hf_model)  # patch: convert_to_hf.py:299 vs :257
        ts._save_with_vocab_pruning(model, str(out_pruned), DRAFT_CONFIG, V, DRAFT_VOCAB, d2t, t2d)
        made = {"torchspec-k3-dspark": (out_plain, "_save_without_vocab_pruning(K3DSparkModel, OUT, config, 128)"),
                "torchspec-k3-dspark-pruned": (out_pruned, "_save_with_vocab_pruning(K3DSparkModel, OUT, config, "
                                               f"128, {DRAFT_VOCAB}, d2t, t2d)")}
        for name, (folder, how) in made.items():
            dest = FIXTURES / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in ("config.json", "model.safetensors"):
                shutil.copy2(folder / f, dest / f)
            upstream = {"repository": UPSTREAM_REPO, "commit": UPSTREAM_COMMIT,
                        "model_code": {"repository": DSPARK_REPO, "commit": DSPARK_COMMIT,
                                       "file": "torchspec/models/draft/dspark.py"},
                        "how": how, "draft_config": DRAFT_CONFIG,
                        "patches": ["numba / wandb import stubs",
                                    "dflash.DFlashAttention -> K3DSparkMLAAttention while building (no "
                                    "attention_class hook at 30189db)",
                                    "no checkpoint.save / _load_fsdp_state_dict round trip"]
                        + (["convert_to_hf.py:299 _prepare_export_tensors called with one argument"]
                           if "pruned" in name else []), **versions}
            (dest / "UPSTREAM.json").write_text(json.dumps(upstream, indent=2) + "\n")
            print(name, sorted(p.name for p in dest.iterdir()), sum(p.stat().st_size for p in dest.iterdir()))


if __name__ == "__main__":
    main()
