"""Regenerate the DeepSpec conformance fixture with DeepSpec's own code (not with dsparkhub's factories).

What it writes, next to this file:

- ``target/``: a tiny Qwen3 target (``transformers.Qwen3ForCausalLM``, random weights, BF16) and a word-level
  tokenizer, the two things ``BaseTrainer.build_models`` reads from ``target_model_name_or_path``.
- ``run/step_2/`` + ``run/step_latest``: a DeepSpec run folder exactly as DeepSpec's trainer saves it. The drafter
  is built by ``Qwen3DSparkTrainer.build_models`` (deepspec/trainer/base_trainer.py: ``_build_draft_model`` ->
  ``build_draft_config`` + ``Qwen3DSparkModel``, then ``initialize_embeddings_and_head`` copies the target's
  embedding / LM head, frozen) and saved by ``ckpt_manager.save_checkpoint`` (``step_<N>/`` with config.json,
  model.safetensors, train_config.py, training_state.rank0.pt, then ``safe_symlink`` writes ``step_latest`` as an
  ABSOLUTE link: ``Path(src).resolve()``, deepspec/utils/io.py:13).

The run is saved under :data:`ORIGIN` and then copied here with its links kept (``shutil.copytree(symlinks=True)``),
so the committed ``run/step_latest`` names a folder that does not exist on any other machine, as a run folder does
once it is copied elsewhere (issue 12 item 4).

Upstream: deepseek-ai/DeepSpec at :data:`DEEPSPEC_COMMIT` (read with ``git archive`` from a clone; never copied into
this repository). Run it with the project venv (torch 2.13 CPU, transformers 5)::

    git clone https://github.com/deepseek-ai/DeepSpec /tmp/DeepSpec && git -C /tmp/DeepSpec checkout <commit>
    python tests/conformance/deepspec/generate.py --deepspec /tmp/DeepSpec

The smallest patches needed to run DeepSpec's trainer code on a CPU-only, single-process machine (each one says
why; nothing in DeepSpec's modeling or saving logic is changed):

1. ``torch.utils.tensorboard`` is replaced by an empty module before the import: DeepSpec's training logger imports
   ``SummaryWriter`` at import time and tensorboard is not installed here (no summary is ever written).
2. ``torch.distributed`` is initialised as a one-process ``gloo`` group instead of ``init_dist``'s NCCL one
   (``is_global_main_process`` and ``dist.barrier`` then work as on rank 0 of a real run).
3. ``ckpt_manager._full_model_state_dict`` asserts the model is wrapped in FSDP and gathers the full state dict; at
   world size 1 that gather is ``model.state_dict()``, which is what the patch returns (FSDP needs CUDA / NCCL).
4. ``torch.cuda.get_rng_state`` returns an empty uint8 tensor: ``_serialize_training_state`` stores the CUDA RNG
   state and a CPU-only torch has none.
5. ``BaseTrainer.__init__`` is skipped (it starts NCCL, the data cache and the scheduler); ``build_models`` is called
   on a trainer whose ``args`` / ``device`` / ``precision_dtype`` are set as ``__init__`` sets them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the DeepSpec commit this fixture was generated with
DEEPSPEC_COMMIT = "afdfa7c9382a3341a3e6f17756dd816da79f132c"
#: where the run is saved before it is copied here; the committed absolute ``step_latest`` names this folder
ORIGIN = Path("/tmp/dsparkhub-deepspec-fixture/checkpoints/deepspec/dspark_tiny")
STEP = 2

TARGET_CONFIG = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                     rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
                     eos_token_id=2, pad_token_id=0)

TRAIN_CONFIG = '''import os
from deepspec.trainer import Qwen3DSparkTrainer
project_name = "deepspec"
exp_name = "dspark_tiny"
seed = 42

model = dict(
    target_model_name_or_path="{target}",
    block_size=4,
    num_draft_layers=1,
    target_layer_ids=[0, 2],
    mask_token_id=127,
    num_anchors=8,
    markov_rank=8,
    markov_head_type='vanilla',
    confidence_head_alpha=1.0,
    confidence_head_with_markov=True,
    loss_decay_gamma=4.0,
    ce_loss_alpha=0.1,
    l1_loss_alpha=0.9,
)

train = dict(
    trainer_cls=Qwen3DSparkTrainer,
    lr=6.0e-4,
    warmup_ratio=0.04,
    weight_decay=0.0,
    precision="bf16",
    local_batch_size=1,
    global_batch_size=1,
    num_train_epochs=1,
    max_train_steps=2,
    max_grad_norm=1.0,
    sharding_strategy="no_shard",
    torch_compile=False,
)

logging = dict(
    logging_steps=1,
    checkpointing_steps=2,
    checkpoint_dir="{checkpoint_dir}",
    tensorboard_dir=None,
)

data = dict(target_cache_path=None, chat_template="qwen", max_length=64, num_workers=0)
'''


def _write_target(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**TARGET_CONFIG)).to(torch.bfloat16)
    model.save_pretrained(folder)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, TARGET_CONFIG["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)


def _deepspec_commit(src: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspec", required=True, type=Path,
                        help=f"a DeepSpec source tree at commit {DEEPSPEC_COMMIT}")
    args = parser.parse_args()
    commit = _deepspec_commit(args.deepspec)
    if commit is not None and commit != DEEPSPEC_COMMIT:
        sys.exit(f"{args.deepspec} is at {commit}; this fixture is pinned to {DEEPSPEC_COMMIT}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(args.deepspec.resolve()))  # generation time only; DeepSpec is never vendored

    # patch 1: tensorboard is imported by deepspec.utils.training_logger but never used here
    stub = types.ModuleType("torch.utils.tensorboard")
    stub.SummaryWriter = object
    sys.modules["torch.utils.tensorboard"] = stub

    import torch
    import torch.distributed as dist

    from deepspec.trainer import Qwen3DSparkTrainer, ckpt_manager
    from deepspec.utils import BF16Optimizer, load_config, parse_opts_to_config

    work = Path(tempfile.mkdtemp(prefix="dsparkhub-deepspec-gen-"))
    target = work / "target"
    _write_target(target)
    if ORIGIN.exists():
        shutil.rmtree(ORIGIN)
    config_path = work / "dspark_tiny.py"
    config_path.write_text(TRAIN_CONFIG.format(target=target, checkpoint_dir=ORIGIN))
    config = parse_opts_to_config([], load_config(str(config_path)))  # as train.py parse_args does
    config._origin_config_path = str(config_path)
    config._origin_opts = []

    # patch 2: a one-process gloo group in place of init_dist's NCCL group
    dist.init_process_group("gloo", init_method=f"file://{work / 'dist'}", rank=0, world_size=1)
    # patch 3: the FSDP full-state-dict gather is the plain state dict at world size 1
    ckpt_manager._full_model_state_dict = lambda model: model.state_dict()
    # patch 4: no CUDA RNG on a CPU-only torch
    torch.cuda.get_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)

    torch.manual_seed(int(config.seed))
    # patch 5: the parts of BaseTrainer.__init__ that build_models reads
    trainer = Qwen3DSparkTrainer.__new__(Qwen3DSparkTrainer)
    trainer.args = config
    trainer.device = torch.device("cpu")
    trainer.precision_dtype = torch.bfloat16
    draft_model, _tokenizer = trainer.build_models()
    optimizer = BF16Optimizer(draft_model, lr=float(config.train.lr), total_steps=int(config.train.max_train_steps),
                              warmup_ratio=float(config.train.warmup_ratio),
                              weight_decay=float(config.train.weight_decay))
    step_dir = ckpt_manager.save_checkpoint(
        model=draft_model, draft_model=draft_model, optimizer=optimizer, checkpoint_dir_root=str(ORIGIN),
        train_config=config, next_micro_step=STEP, gradient_accumulation_steps=1, global_rank=0, world_size=1,
        local_batch_size=1)
    dist.destroy_process_group()

    for name in ("target", "run"):
        if (HERE / name).exists():
            shutil.rmtree(HERE / name)
    shutil.copytree(target, HERE / "target")
    shutil.copytree(ORIGIN, HERE / "run", symlinks=True)
    # train_config.py names the generating machine's temp target folder; keep it as DeepSpec wrote it
    (HERE / "UPSTREAM.json").write_text(json.dumps({
        "producer": "deepseek-ai/DeepSpec", "commit": DEEPSPEC_COMMIT,
        "entry_points": ["deepspec/trainer/base_trainer.py BaseTrainer.build_models (via Qwen3DSparkTrainer)",
                         "deepspec/trainer/ckpt_manager.py save_checkpoint"],
        "origin": str(ORIGIN), "step_dir": str(step_dir),
        "step_latest": os.readlink(ORIGIN / "step_latest"),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
    }, indent=2) + "\n")
    shutil.rmtree(ORIGIN.parent.parent.parent)
    shutil.rmtree(work)
    print(f"wrote {HERE / 'target'} and {HERE / 'run'} (step_latest -> {os.readlink(HERE / 'run' / 'step_latest')})")


if __name__ == "__main__":
    main()
