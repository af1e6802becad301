"""Regenerate tests/conformance/fixtures/torchspec-*/ with TorchSpec's own code (run in .venv-upstream).

    PYTHONPATH=. .venv-upstream/bin/python tests/conformance/generators/make_torchspec_fixtures.py [--src DIR]

TorchSpec is not on PyPI; its source is read from ``--src`` (a checkout) or, by default, exported from the git mirror
of deepinfra/TorchSpec at ``UPSTREAM_COMMIT`` (``git archive``; lightseekorg/TorchSpec has no DSpark code yet).
What runs is TorchSpec's own code, unmodified except where listed below:

1. the draft: ``torchspec.models.draft.dspark.DSparkDraftModel(DSparkConfig(...))`` (the architecture and keys of
   ``torchspec/config/dspark_draft_config.json``, toy-sized for dsparkhub's ``make_qwen3_target`` verifier: hidden
   32, 4 layers, vocab 128), wrapped in ``torchspec.models.dspark.DSparkModel`` as ``DSparkTrainer`` does, cast to
   BF16 as ``DFlashTrainer.init_model`` does, its embedding copied from the target;
2. the training checkpoint: ``torchspec.training.checkpoint.save(actor, step=0)`` (``iter_0000001/model``, a
   ``torch.distributed.checkpoint`` folder) in a one-rank gloo process group;
3. the export: ``tools/convert_to_hf.py`` --
   - ``torchspec-dspark``: the command line, ``--input-dir iter_0000001 --config CONFIG --output-dir OUT
     --target-model-path TARGET`` (no vocab pruning);
   - ``torchspec-dspark-pruned``: ``_convert_fsdp_to_hf(..., prune_vocab=True, draft_vocab_size=64)`` in process,
     its token counts from ``_count_token_frequencies`` over synthetic token ids (a tokenized dataset is the only
     input it needs; ``_load_tokenized_prompts`` is replaced by a list of ``{"input_ids", "loss_mask"}``).

Patches (CPU / missing optional packages / one upstream bug), nothing else:

- ``numba`` and ``wandb`` are import-time dependencies of ``torchspec`` not needed here: stub modules (``njit`` =
  identity) are put first on ``sys.path``;
- ``torch.cuda.synchronize`` is a no-op (``checkpoint.save`` calls it first; there is no GPU);
- ``tools/convert_to_hf.py:299`` calls ``_prepare_export_tensors(hf_model, export_for_vllm)`` but the function takes
  one argument (``:257``), so every ``--prune-vocab`` export raises TypeError at 30189db; the pruned fixture is made
  with that call given the one argument it accepts.

Each fixture keeps the export's ``config.json`` and ``model.safetensors`` and an ``UPSTREAM.json`` (repository,
commit, command, versions). The verifier is rebuilt by the tests (seeded), so it is not kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import torch

from dsparkhub.testing.factories import make_qwen3_target

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
UPSTREAM_REPO = "deepinfra/TorchSpec"
UPSTREAM_COMMIT = "30189db21e1b58f08bac4c6e7397f0344c2d6dd6"
MIRROR = Path(os.environ.get("TORCHSPEC_MIRROR", "/work/.mirror/deepinfra+TorchSpec/repo"))
BLOCK_SIZE = 7  # the block size the recipe assumes (the export does not record it)
DRAFT_VOCAB = 64

#: torchspec/config/dspark_draft_config.json, sized for the toy verifier (hidden 32, 4 layers, vocab 128)
DRAFT_CONFIG = {
    "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3_dspark",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_theta": 1000000.0,
    "num_target_layers": 2, "target_hidden_size": 32, "target_num_hidden_layers": 4, "target_layer_ids": [1, 2],
    "mask_token_id": 127, "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
    "confidence_head_with_markov": True, "tie_word_embeddings": False,
}

STUBS = {"numba/__init__.py": "def njit(*a, **k):\n    return a[0] if a and callable(a[0]) else (lambda f: f)\n\n"
                              "jit = njit\n",
         "wandb/__init__.py": ""}


def torchspec_source(src: str | None, work: Path) -> Path:
    """A TorchSpec source tree: ``src`` as given, else ``UPSTREAM_COMMIT`` exported from the mirror."""
    if src:
        return Path(src).resolve()
    out = work / "torchspec-src"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(MIRROR), "archive", UPSTREAM_COMMIT], check=True,
                             stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "x", "-C", str(out)], input=archive, check=True)
    return out


def write_stubs(work: Path) -> Path:
    stubs = work / "stubs"
    for rel, text in STUBS.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text(text)
    return stubs


def train_checkpoint(work: Path, target: Path, config_path: Path) -> Path:
    """Build the draft with TorchSpec's classes and save it with ``torchspec.training.checkpoint.save``."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from torchspec.models.draft import AutoDraftModelConfig
    from torchspec.models.draft.dspark import DSparkDraftModel
    from torchspec.models.dspark import DSparkModel
    from torchspec.training import checkpoint

    torch.manual_seed(0)
    draft = DSparkDraftModel(AutoDraftModelConfig.from_file(str(config_path)))
    for p in draft.parameters():  # a trained-looking drafter: no all-ones norms / zero biases
        torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():  # DFlashTrainer.init_model: load_embedding(target) + freeze_embedding
        draft.embed_tokens.weight.copy_(load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"])
    draft.freeze_embedding()
    wrapper = DSparkModel(draft_model=draft.to(torch.bfloat16), block_size=BLOCK_SIZE)

    class Actor:  # what checkpoint.save reads from the trainer actor
        args = argparse.Namespace(checkpoint_dir=str(work / "ckpt"))
        model = wrapper
        global_step = 1
        optimizer = None
        lr_scheduler = None

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.synchronize = lambda *a, **k: None  # patch: CPU only
    try:
        checkpoint.save(Actor, step=0)
    finally:
        dist.destroy_process_group()
    return work / "ckpt" / "iter_0000001"


def export_plain(src: Path, stubs: Path, ckpt: Path, config_path: Path, target: Path, out: Path) -> list[str]:
    """``tools/convert_to_hf.py`` on its command line (no vocab pruning)."""
    args = ["--input-dir", str(ckpt), "--config", str(config_path), "--output-dir", str(out),
            "--target-model-path", str(target)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stubs), str(src)]), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(src / "tools" / "convert_to_hf.py"), *args], check=True, env=env,
                   cwd=src, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ["python", "tools/convert_to_hf.py", "--input-dir", "iter_0000001", "--config", "config.json",
            "--output-dir", "OUT", "--target-model-path", "TARGET"]


def export_pruned(src: Path, ckpt: Path, config_path: Path, target: Path, out: Path) -> list[str]:
    """``_convert_fsdp_to_hf(prune_vocab=True)`` over synthetic token ids (the one-argument call patched)."""
    sys.path.insert(0, str(src / "tools"))
    import convert_to_hf as ts

    # id i seen 200 - i times, the odd ids 65..127 500 more: the top 64 are 0..31 and 65, 67, ..., 127 (a
    # non-contiguous draft vocab, so d2t offsets vary)
    counts = Counter({i: 200 - i for i in range(128)})
    counts.update({i: 500 for i in range(65, 128, 2)})
    ids = torch.tensor([t for t, n in sorted(counts.items()) for _ in range(n)], dtype=torch.long)
    prompts = [{"input_ids": ids[None], "loss_mask": torch.ones_like(ids)[None]}]
    ts._load_tokenized_prompts = lambda *a, **k: prompts
    one_arg = ts._prepare_export_tensors
    ts._prepare_export_tensors = lambda hf_model, *_: one_arg(hf_model)  # patch: convert_to_hf.py:299 vs :257
    ts._convert_fsdp_to_hf(config_path=str(config_path), input_dir=str(ckpt / "model"), output_dir=str(out),
                           target_model_path=str(target), prune_vocab=True, dataset_path="synthetic",
                           draft_vocab_size=DRAFT_VOCAB, tokenizer="TARGET", chat_template="qwen")
    return ["_convert_fsdp_to_hf(prune_vocab=True, draft_vocab_size=%d, target_model_path=TARGET)" % DRAFT_VOCAB]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="a TorchSpec checkout (default: the mirror at UPSTREAM_COMMIT)")
    a = ap.parse_args()
    versions = {p: version(p) for p in ("transformers", "torch", "safetensors")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = torchspec_source(a.src, work)
        stubs = write_stubs(work)
        sys.path[:0] = [str(stubs), str(src)]
        target = make_qwen3_target(work / "toy-qwen3-target")
        config_path = work / "config.json"
        config_path.write_text(json.dumps(DRAFT_CONFIG, indent=2))
        ckpt = train_checkpoint(work, target, config_path)
        made = {"torchspec-dspark": (work / "out-plain",
                                     export_plain(src, stubs, ckpt, config_path, target, work / "out-plain")),
                "torchspec-dspark-pruned": (work / "out-pruned",
                                            export_pruned(src, ckpt, config_path, target, work / "out-pruned"))}
        for name, (folder, how) in made.items():
            dest = FIXTURES / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in ("config.json", "model.safetensors"):
                shutil.copy2(folder / f, dest / f)
            upstream = {"repository": UPSTREAM_REPO, "commit": UPSTREAM_COMMIT, "how": " ".join(how),
                        "training_checkpoint": "torchspec.training.checkpoint.save (DSparkModel, block_size "
                                               f"{BLOCK_SIZE}, BF16)",
                        "draft_config": DRAFT_CONFIG, "patches": ["numba / wandb import stubs",
                                                                 "torch.cuda.synchronize no-op"]
                        + (["convert_to_hf.py:299 _prepare_export_tensors called with one argument"]
                           if "pruned" in name else []), **versions}
            (dest / "UPSTREAM.json").write_text(json.dumps(upstream, indent=2) + "\n")
            print(name, sorted(p.name for p in dest.iterdir()), sum(p.stat().st_size for p in dest.iterdir()))


if __name__ == "__main__":
    main()
