"""The embedded example: a tiny, really trained Qwen3 target and two drafters for it, built offline on CPU.

``build_example()`` trains, deterministically and in a few minutes on 2 CPU cores:

1. a 1024-token byte-level BPE (``tokenizers``) and a 4-layer, hidden-192 ``transformers.Qwen3ForCausalLM`` target on
   the Python standard library's own top-level module sources (a code workload); some modules are held out and give
   the evaluation prompts;
2. a DSpark drafter with the DeepSpec recipe (Qwen3 DFlash backbone over ``fc`` of target layers [0, 1, 2] in
   layer-index numbering, anchor-first blocks of B = 7, vanilla Markov head r = 32, confidence head with the Markov
   feature; loss = 0.1·CE + 0.9·L1(p_draft, p_target) + 1.0·BCE(confidence, 1 - ½‖p_draft - p_target‖₁), position
   weights exp(-k/4): DeepSpec ``deepspec/modeling/dspark/loss.py`` and its Qwen3 configs), trained on the target's
   own greedy continuations (DeepSpec regenerates its data with the target);
3. a z-lab DFlash drafter (``DFlashDraftModel``, 1+N layout, block size 8 -> 7 speculative tokens, no embedding or
   LM head) on the same data,

saves them in their real layouts (HF target folder; DeepSpec ``run/step_<N>/`` + ``step_latest``; z-lab DFlash folder)
and measures τ with :class:`dsparkhub.verify.reference.ReferenceEngine`. The result is cached under
``$DSPARKHUB_CACHE`` (default ``~/.cache/dsparkhub``) keyed by this module's and ``modeling.py``'s source and the
Python / torch / transformers / tokenizers versions; a build happens in a temp folder renamed into place.

The module also offers small factory functions for tests (:func:`make_tiny_target`, :func:`make_tiny_drafter`):
random tiny checkpoints with the real tensor names. It never touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import __version__
from .errors import DsparkhubError, OutputExistsError
from .modeling import Drafter, count_parameters, drafter_config_from_dict, target_features

__all__ = ["Example", "build_example", "example_cache_root", "example_key", "make_tiny_target",
           "make_tiny_drafter", "dspark_config_dict", "dflash_config_dict", "save_deepspec_step",
           "EXAMPLE_RECIPE"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]  # ids 0, 1, 2
EOS_ID, PAD_ID, MASK_ID = 0, 1, 2
_PROGRESS = None  # development hook: a callable taking one line of progress text (None: silent)
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

# Everything that shapes the example, in one place (also written to info.json and train_config.py).
EXAMPLE_RECIPE = {
    "seed": 1234,
    "threads": 2,
    "tokenizer": {"vocab_size": 1024, "special_tokens": SPECIAL_TOKENS},
    "corpus": {"holdout_every": 8, "max_train_chars": 1_200_000},
    "target": {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 48, "intermediate_size": 512, "max_position_embeddings": 2048, "rope_theta": 10000.0,
               "seq_len": 160, "batch_size": 16, "steps": 300, "lr": 3e-3, "warmup": 20},
    "regen": {"num_prompts": 256, "prompt_len": 96, "new_tokens": 96, "batch_size": 64},
    "dspark": {"num_hidden_layers": 2, "intermediate_size": 512, "target_layer_ids": [0, 1, 2], "block_size": 7,
               "markov_rank": 32, "num_anchors": 16, "batch_size": 12, "steps": 320, "lr": 3e-3, "warmup": 15,
               "loss_decay_gamma": 4.0, "ce_loss_alpha": 0.1, "l1_loss_alpha": 0.9, "confidence_head_alpha": 1.0},
    "dflash": {"num_hidden_layers": 2, "intermediate_size": 512, "target_layer_ids": [0, 1, 2], "block_size": 8,
               "num_anchors": 16, "batch_size": 12, "steps": 320, "lr": 3e-3, "warmup": 15,
               "loss_decay_gamma": 4.0, "ce_loss_alpha": 0.1, "l1_loss_alpha": 0.9},
    "eval": {"num_prompts": 16, "prompt_chars": 360, "max_new_tokens": 96, "ns": [3, 5, 7]},
}


@dataclass
class Example:
    """Paths of a built example.

    Attributes:
        root: the cache folder of this build.
        target: HF target folder (config.json, model.safetensors, tokenizer files with a chat template).
        deepspec_run: DeepSpec run dir holding ``step_<N>/`` and the relative ``step_latest`` symlink.
        dspark_step: the ``step_<N>`` folder of the DSpark drafter.
        dflash: z-lab DFlash drafter folder (``DFlashDraftModel``, ``dflash_config``).
        prompts: held-out evaluation prompts, JSONL lines ``{"prompt": "..."}``.
        info: sizes, parameter counts, training seconds per phase, measured τ per n (``info.json``).
    """

    root: Path
    target: Path
    deepspec_run: Path
    dspark_step: Path
    dflash: Path
    prompts: Path
    info: dict


# ---- cache ----------------------------------------------------------------------------------------------------


def example_cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$DSPARKHUB_CACHE``, else ``~/.cache/dsparkhub``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("DSPARKHUB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "dsparkhub"


def example_key() -> str:
    """16 hex digits identifying a build: hash of the builder sources, the recipe and library versions."""
    import tokenizers
    import transformers

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("example.py", "modeling.py"):
        h.update((here / name).read_bytes())
    h.update(json.dumps(EXAMPLE_RECIPE, sort_keys=True).encode())
    h.update(f"{sys.version_info[:2]} {torch.__version__} {transformers.__version__} "
             f"{tokenizers.__version__}".encode())
    return h.hexdigest()[:16]


def _load_built(root: Path) -> Example:
    info = json.loads((root / "info.json").read_text())
    run = root / "deepspec_run"
    return Example(root=root, target=root / "target", deepspec_run=run, dspark_step=run / info["dspark_step"],
                   dflash=root / "dflash_drafter", prompts=root / "prompts.jsonl", info=info)


def build_example(cache_dir: str | Path | None = None, *, force: bool = False) -> Example:
    """Build (or return the cached) embedded example.

    Args:
        cache_dir: cache root (default ``$DSPARKHUB_CACHE`` or ``~/.cache/dsparkhub``).
        force: rebuild even if a complete build with the same key exists.

    Returns:
        :class:`Example` with the paths and ``info``.

    Raises:
        DsparkhubError: the standard library sources are missing (the training corpus).
        OSError: the cache folder cannot be written.
    """
    root = example_cache_root(cache_dir)
    final = root / f"example-{example_key()}"
    if final.is_dir() and (final / "info.json").is_file() and not force:
        return _load_built(final)
    root.mkdir(parents=True, exist_ok=True)
    # One build per key at a time: concurrent callers (parallel test sessions, a quickstart next to the tests)
    # wait for the first builder instead of each training on the same 2 cores; the lock dies with its process.
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and (final / "info.json").is_file() and not force:
            return _load_built(final)
        return _build_locked(root, final, force)


def _build_locked(root: Path, final: Path, force: bool) -> Example:
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _build_into(tmp)
        if final.exists():
            if not force and (final / "info.json").is_file():  # a concurrent build won; keep its copy
                shutil.rmtree(tmp, ignore_errors=True)
                return _load_built(final)
            old = root / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError as exc:
            if final.is_dir() and (final / "info.json").is_file():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                raise OutputExistsError(f"could not move the example into {final}: {exc}", path=final) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load_built(final)


# ---- building blocks ------------------------------------------------------------------------------------------


def _stdlib_modules() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file() and not p.name.startswith("_"))
    if len(files) < 40:
        raise DsparkhubError(f"found only {len(files)} top-level modules in {stdlib}; the example needs the "
                             "Python standard library sources", path=stdlib)
    return files


def _read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _target_config(vocab_size: int):
    from transformers import Qwen3Config

    r = EXAMPLE_RECIPE["target"]
    return Qwen3Config(vocab_size=vocab_size, hidden_size=r["hidden_size"], num_hidden_layers=r["num_hidden_layers"],
                       num_attention_heads=r["num_attention_heads"], num_key_value_heads=r["num_key_value_heads"],
                       head_dim=r["head_dim"], intermediate_size=r["intermediate_size"],
                       max_position_embeddings=r["max_position_embeddings"],
                       rope_parameters={"rope_type": "default", "rope_theta": r["rope_theta"]},
                       tie_word_embeddings=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None,
                       architectures=["Qwen3ForCausalLM"])


def dspark_config_dict(target_config: dict, *, num_hidden_layers: int, target_layer_ids: list[int], block_size: int,
                       mask_token_id: int, markov_rank: int, intermediate_size: int | None = None,
                       enable_confidence_head: bool = True, confidence_head_with_markov: bool = True,
                       num_anchors: int = 512) -> dict:
    """A DeepSpec Qwen3 DSpark ``config.json``: a copy of the target config plus the DSpark keys.

    DeepSpec ``deepspec/modeling/dspark/qwen3/config.py`` ``build_draft_config`` (FORMATS §2): architectures
    ``["Qwen3DSparkModel"]``, ``model_type`` kept, ``num_hidden_layers`` = draft layers, ``num_target_layers`` = the
    target's layer count, top-level ``block_size`` / ``mask_token_id`` / ``target_layer_ids`` (layer-index numbering),
    ``markov_rank`` / ``markov_head_type``, confidence flags, ``tie_word_embeddings`` false, ``layer_types``,
    ``num_anchors``, ``_attn_implementation``.
    """
    cfg = json.loads(json.dumps(target_config))
    for key in ("transformers_version", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    cfg.update({
        "architectures": ["Qwen3DSparkModel"],
        "num_target_layers": int(target_config["num_hidden_layers"]),
        "num_hidden_layers": num_hidden_layers,
        "block_size": block_size,
        "mask_token_id": mask_token_id,
        "target_layer_ids": list(target_layer_ids),
        "num_anchors": num_anchors,
        "enable_confidence_head": enable_confidence_head,
        "markov_rank": markov_rank,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_hidden_layers,
        "_attn_implementation": "flex_attention",
    })
    if enable_confidence_head:
        cfg["confidence_head_with_markov"] = confidence_head_with_markov
    if markov_rank > 0:
        cfg["markov_head_type"] = "vanilla"
    if intermediate_size is not None:
        cfg["intermediate_size"] = intermediate_size
    return cfg


def dflash_config_dict(target_config: dict, *, num_hidden_layers: int, target_layer_ids: list[int], block_size: int,
                       mask_token_id: int, intermediate_size: int | None = None) -> dict:
    """A z-lab DFlash ``config.json`` as vLLM 0.32 loads it (``DFlashDraftModel``; ``qwen3_dflash.py``).

    Keys read by vLLM: Qwen3 geometry, ``dflash_config.{target_layer_ids, mask_token_id}`` (layer-index numbering,
    vLLM adds 1), ``block_size`` (default ``num_speculative_tokens``), ``layer_types`` all full attention
    (non-causal). ``num_target_layers`` is the target's layer count (z-lab ``dflash/model.py``).
    """
    cfg = json.loads(json.dumps(target_config))
    for key in ("transformers_version", "dtype", "torch_dtype", "mask_token_id", "target_layer_ids"):
        cfg.pop(key, None)
    cfg.update({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_target_layers": int(target_config["num_hidden_layers"]),
        "num_hidden_layers": num_hidden_layers,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(target_layer_ids), "mask_token_id": mask_token_id},
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_hidden_layers,
    })
    if intermediate_size is not None:
        cfg["intermediate_size"] = intermediate_size
    return cfg


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def save_deepspec_step(run_dir: Path, step: int, config: dict, tensors: dict[str, torch.Tensor], *,
                       train_config: str, optimizer_state: dict | None) -> Path:
    """Write ``run_dir/step_<step>/`` exactly as DeepSpec's checkpoint manager does and point ``step_latest`` at it.

    Files: ``config.json``, ``model.safetensors`` (DeepSpec names, including frozen embed / lm_head copies),
    ``train_config.py``, ``training_state.rank0.pt`` (``torch.save`` of the optimizer state; nothing in dsparkhub
    loads it) and the relative symlink ``step_latest -> step_<step>``.
    """
    step_dir = run_dir / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _save_safetensors(tensors, step_dir / "model.safetensors")
    (step_dir / "train_config.py").write_text(train_config)
    torch.save({"optimizer": optimizer_state or {}, "next_micro_step": step, "world_size": 1},
               step_dir / "training_state.rank0.pt")
    latest = run_dir / "step_latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(step_dir.name)
    return step_dir


# ---- tiny factories for tests --------------------------------------------------------------------------------


def make_tiny_target(folder: str | Path, *, vocab_size: int = 96, hidden_size: int = 48, num_hidden_layers: int = 3,
                     seed: int = 0, eos_token_id: int = 0, mask_token_id: int | None = None):
    """Save a random tiny ``Qwen3ForCausalLM`` (untied embed / lm_head) to ``folder``; returns the model.

    ``mask_token_id`` is stored in the config for the drafter factories to read (default: last id).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                      intermediate_size=hidden_size * 2, max_position_embeddings=1024, tie_word_embeddings=False,
                      eos_token_id=eos_token_id, architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper random distributions than the default init, so drafts can disagree
        model.lm_head.weight.mul_(8.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    return model


def make_tiny_drafter(folder: str | Path | None, target_model, *, kind: str = "dspark",
                      target_layer_ids: list[int] | tuple[int, ...] = (0, 1), num_hidden_layers: int = 1,
                      block_size: int | None = None, markov_rank: int = 8, confidence: bool = True,
                      include_embed_head: bool = True, mask_token_id: int | None = None, seed: int = 1,
                      layout: str = "deepspec") -> Drafter:
    """A random drafter for ``target_model`` (embed / lm_head copied from it), optionally saved to ``folder``.

    Args:
        kind: ``"dspark"`` (DeepSpec config) or ``"dflash"`` (z-lab config, 1+N).
        layout: for dspark, ``"deepspec"`` (``folder`` is a run dir with ``step_1`` + ``step_latest``) or
            ``"flat"`` (config.json + model.safetensors directly in ``folder``).
        include_embed_head: save ``embed_tokens`` / ``lm_head`` (DeepSpec) or drop them (converted / z-lab).
    """
    tcfg = target_model.config.to_dict()
    mask = mask_token_id if mask_token_id is not None else tcfg["vocab_size"] - 1
    if kind == "dspark":
        cfg = dspark_config_dict(tcfg, num_hidden_layers=num_hidden_layers, target_layer_ids=list(target_layer_ids),
                                 block_size=block_size or 4, mask_token_id=mask, markov_rank=markov_rank,
                                 enable_confidence_head=confidence)
    elif kind == "dflash":
        cfg = dflash_config_dict(tcfg, num_hidden_layers=num_hidden_layers, target_layer_ids=list(target_layer_ids),
                                 block_size=block_size or 5, mask_token_id=mask)
    else:
        raise ValueError(f"kind must be 'dspark' or 'dflash', found {kind!r}")
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config_from_dict(cfg)).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target_model.get_input_embeddings().weight)
        drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight)
    if folder is not None:
        folder = Path(folder)
        tensors = dict(drafter.state_dict())
        if not include_embed_head or kind == "dflash":
            tensors.pop("embed_tokens.weight")
            tensors.pop("lm_head.weight")
        if kind == "dspark" and layout == "deepspec":
            save_deepspec_step(folder, 1, cfg, tensors, train_config="# tiny random drafter\n", optimizer_state=None)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            _save_safetensors(tensors, folder / "model.safetensors")
    return drafter


# ---- training --------------------------------------------------------------------------------------------------


def _train_target(model, stream: torch.Tensor, r: dict, gen: torch.Generator) -> list[float]:
    seq, bs, steps = r["seq_len"], r["batch_size"], r["steps"]
    opt = torch.optim.AdamW(model.parameters(), lr=r["lr"], betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    losses = []
    n_windows = (stream.numel() - 1) // seq
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, r["lr"], r["warmup"])
        starts = torch.randint(0, stream.numel() - seq - 1, (bs,), generator=gen)
        batch = torch.stack([stream[s:s + seq] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(out.loss.detach()))
        if _PROGRESS and step % 20 == 0:
            _PROGRESS(f"target step {step} loss {losses[-1]:.3f}")
    del n_windows
    model.eval()
    return losses


@torch.no_grad()
def _regenerate(model, stream: torch.Tensor, r: dict, gen: torch.Generator) -> torch.Tensor:
    """The target's own greedy continuations of random training windows: [N, prompt_len + new_tokens] int64."""
    from transformers import DynamicCache

    n, plen, new, bs = r["num_prompts"], r["prompt_len"], r["new_tokens"], r["batch_size"]
    starts = torch.randint(0, stream.numel() - plen - 1, (n,), generator=gen)
    prompts = torch.stack([stream[s:s + plen] for s in starts.tolist()])
    rows = []
    for i in range(0, n, bs):
        ids = prompts[i:i + bs]
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        seqs = [ids]
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new):
            seqs.append(nxt)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        rows.append(torch.cat(seqs, dim=1))
    return torch.cat(rows)


@torch.no_grad()
def _target_states(model, seqs: torch.Tensor, layer_ids: list[int], bs: int = 64):
    feats, last = [], []
    for i in range(0, seqs.shape[0], bs):
        out = model(input_ids=seqs[i:i + bs], output_hidden_states=True)
        feats.append(target_features(out.hidden_states, tuple(layer_ids)))
        last.append(out.hidden_states[-1])
    return torch.cat(feats), torch.cat(last)


def _sample_anchors(valid: torch.Tensor, num: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSpec ``sample_anchor_positions``: ``num`` sorted random valid anchors per row, and a keep mask."""
    bsz, n_cand = valid.shape
    rand = torch.rand(bsz, n_cand, generator=gen)
    rand = torch.where(valid, rand, torch.full_like(rand, 2.0))
    order = rand.argsort(dim=1)[:, :num]
    keep = torch.gather(valid, 1, order)
    anchors = torch.where(keep, order, torch.zeros_like(order))
    anchors, idx = anchors.sort(dim=1)
    return anchors, torch.gather(keep, 1, idx)


def _train_drafter(drafter: Drafter, seqs, feats, last_hidden, target_lm_head, prompt_len: int, r: dict,
                   gen: torch.Generator, *, anchor_first: bool) -> tuple[list[float], dict]:
    """DeepSpec-style training over sampled anchor blocks; returns (losses, optimizer state).

    Anchor-first (DSpark): query ``[anchor, mask × (B-1)]`` at positions a..a+B-1, slot k predicts a+k+1.
    1+N (DFlash): query ``[anchor, mask × (B-1)]`` at a..a+B-1, slots 1..B-1 predict their own positions.
    Either way the block attends to context positions < a and to itself (DeepSpec ``create_dspark_attention_mask``).
    """
    bsz_all, seq_len = seqs.shape
    block = r["block_size"]
    npred = block if anchor_first else block - 1
    first = 0 if anchor_first else 1
    num_anchors = r["num_anchors"]
    gamma = r["loss_decay_gamma"]
    pos_w = torch.exp(-torch.arange(npred, dtype=torch.float32) / gamma)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=r["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    # anchor a valid when a >= prompt_len (a generated token, as at inference) and a + 1 < seq_len
    cand = torch.arange(seq_len - 1)
    valid_row = (cand >= prompt_len)
    drafter.train()
    losses = []
    offs = torch.arange(block)
    for step in range(r["steps"]):
        for g in opt.param_groups:
            g["lr"] = _lr(step, r["steps"], r["lr"], r["warmup"])
        rows = torch.randint(0, bsz_all, (r["batch_size"],), generator=gen)
        ids, ft, lh = seqs[rows], feats[rows], last_hidden[rows]
        bsz = ids.shape[0]
        anchors, keep = _sample_anchors(valid_row.unsqueeze(0).expand(bsz, -1), num_anchors, gen)
        na = anchors.shape[1]
        qpos = (anchors.unsqueeze(-1) + offs).view(bsz, na * block)  # [B, na*block]
        block_ids = torch.full((bsz, na, block), drafter.config.mask_token_id, dtype=torch.int64)
        block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
        ctx_pos = torch.arange(seq_len).unsqueeze(0).expand(bsz, -1)
        cache = drafter.context_kv(ft, ctx_pos)
        q_block = torch.arange(na * block) // block
        anchor_of_q = anchors[:, q_block]  # [B, Q]
        ctx_ok = torch.arange(seq_len).view(1, 1, -1) < anchor_of_q.unsqueeze(-1)
        blk_ok = (q_block.view(-1, 1) == q_block.view(1, -1)).unsqueeze(0).expand(bsz, -1, -1)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1) & keep[:, q_block].unsqueeze(-1)
        mask[..., seq_len:] |= ~keep[:, q_block].unsqueeze(-1)  # dropped blocks still need one visible key
        hidden = drafter.backbone(block_ids.view(bsz, -1), qpos, cache, mask.unsqueeze(1))
        hidden = hidden.view(bsz, na, block, -1)[:, :, first:first + npred]  # [B, na, npred, H]
        label_pos = anchors.unsqueeze(-1) + torch.arange(1, npred + 1)  # [B, na, npred]
        in_range = label_pos < seq_len
        safe = label_pos.clamp(max=seq_len - 1)
        labels = torch.gather(ids.unsqueeze(1).expand(-1, na, -1), 2, safe)
        eval_mask = (in_range & keep.unsqueeze(-1)).to(torch.int64).cumprod(-1).bool()
        logits = drafter.base_logits(hidden)
        prev = torch.cat([torch.gather(ids, 1, anchors).unsqueeze(-1), labels[..., :-1]], dim=-1)
        if drafter.markov_head is not None:
            logits = logits + drafter.markov_bias(prev)
        tgt_h = torch.gather(lh.unsqueeze(1).expand(-1, na, -1, -1), 2,
                             (safe - 1).unsqueeze(-1).expand(-1, -1, -1, lh.shape[-1]))
        with torch.no_grad():
            tgt_p = torch.softmax(target_lm_head(tgt_h).float(), dim=-1)
        w = eval_mask.float() * pos_w
        den = w.sum() + 1e-6
        logp = torch.log_softmax(logits.float(), dim=-1)
        ce = -(torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1) * w).sum() / den
        l1_tok = (logp.exp() - tgt_p).abs().sum(-1)
        l1 = (l1_tok * w).sum() / den
        loss = r["ce_loss_alpha"] * ce + r["l1_loss_alpha"] * l1
        if drafter.confidence_head is not None:
            conf = drafter.confidence_logit(hidden, prev)
            target_acc = (1.0 - 0.5 * l1_tok.detach()).clamp(0.0, 1.0)
            bce = F.binary_cross_entropy_with_logits(conf, target_acc, reduction="none")
            loss = loss + r["confidence_head_alpha"] * (bce * w).sum() / den
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if _PROGRESS and step % 20 == 0:
            _PROGRESS(f"drafter step {step} loss {losses[-1]:.3f}")
    drafter.eval()
    return losses, opt.state_dict()


def _init_drafter(cfg_dict: dict, target_model, seed: int) -> Drafter:
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config_from_dict(cfg_dict))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 2 and not name.startswith(("embed_tokens", "lm_head")):
                p.normal_(0.0, 0.02)
        drafter.embed_tokens.weight.copy_(target_model.get_input_embeddings().weight)
        drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight)
    drafter.embed_tokens.weight.requires_grad_(False)
    drafter.lm_head.weight.requires_grad_(False)
    return drafter


def _train_config_text(name: str, cfg: dict, r: dict) -> str:
    lines = [f"# DeepSpec-style training config of the dsparkhub embedded example ({name}).",
             f"# Written by dsparkhub {__version__}; a record only, nothing loads it.",
             f"model = {json.dumps({k: cfg[k] for k in sorted(cfg) if k in ('block_size', 'markov_rank', 'markov_head_type', 'target_layer_ids', 'mask_token_id', 'num_anchors', 'enable_confidence_head', 'confidence_head_with_markov', 'num_hidden_layers')}, indent=4)}",  # noqa: E501
             f"train = {json.dumps(r, indent=4)}", ""]
    return "\n".join(lines).replace("true", "True").replace("false", "False")


def _build_into(out: Path) -> None:
    """Build every artefact into ``out`` (a fresh temp folder)."""
    from tokenizers import Tokenizer  # noqa: F401  (import error surfaces early)
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    from .verify.reference import ReferenceEngine

    rec = EXAMPLE_RECIPE
    old_threads = torch.get_num_threads()
    torch.set_num_threads(rec["threads"])
    torch.manual_seed(rec["seed"])
    gen = torch.Generator().manual_seed(rec["seed"])
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    try:
        # corpus + tokenizer
        t0 = time.perf_counter()
        modules = _stdlib_modules()
        every = rec["corpus"]["holdout_every"]
        held = [m for i, m in enumerate(modules) if i % every == every // 2]
        train = [m for m in modules if m not in held]
        texts, total = [], 0
        for m in train:
            text = _read_source(m)
            if total + len(text) > rec["corpus"]["max_train_chars"]:
                continue
            texts.append(text)
            total += len(text)
        tok = _train_tokenizer(texts, rec["tokenizer"]["vocab_size"])
        stream = torch.tensor([t for text in texts for t in tok.encode(text).ids + [EOS_ID]], dtype=torch.int64)
        timings["tokenizer_s"] = time.perf_counter() - t0

        # target
        t0 = time.perf_counter()
        tcfg = _target_config(tok.get_vocab_size())
        torch.manual_seed(rec["seed"])
        target = Qwen3ForCausalLM(tcfg)
        target_losses = _train_target(target, stream, rec["target"], gen)
        timings["target_train_s"] = time.perf_counter() - t0
        target_dir = out / "target"
        target.generation_config.eos_token_id = EOS_ID
        target.generation_config.pad_token_id = PAD_ID
        target.save_pretrained(target_dir)
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[0],
                                         pad_token=SPECIAL_TOKENS[1], mask_token=SPECIAL_TOKENS[2])
        hf_tok.chat_template = CHAT_TEMPLATE
        hf_tok.save_pretrained(target_dir)

        # regenerated data + target states
        t0 = time.perf_counter()
        seqs = _regenerate(target, stream, rec["regen"], gen)
        layer_ids = rec["dspark"]["target_layer_ids"]
        feats, last_hidden = _target_states(target, seqs, layer_ids)
        timings["regenerate_s"] = time.perf_counter() - t0
        target_config = json.loads((target_dir / "config.json").read_text())
        lm_head = target.get_output_embeddings()
        for p in target.parameters():
            p.requires_grad_(False)

        # DSpark drafter, DeepSpec layout
        t0 = time.perf_counter()
        rd = rec["dspark"]
        dcfg = dspark_config_dict(target_config, num_hidden_layers=rd["num_hidden_layers"],
                                  target_layer_ids=rd["target_layer_ids"], block_size=rd["block_size"],
                                  mask_token_id=MASK_ID, markov_rank=rd["markov_rank"],
                                  intermediate_size=rd["intermediate_size"], num_anchors=rd["num_anchors"])
        dspark = _init_drafter(dcfg, target, rec["seed"] + 1)
        dspark_losses, dspark_opt = _train_drafter(dspark, seqs, feats, last_hidden, lm_head,
                                                   rec["regen"]["prompt_len"], rd, gen, anchor_first=True)
        timings["dspark_train_s"] = time.perf_counter() - t0
        run_dir = out / "deepspec_run"
        step_dir = save_deepspec_step(run_dir, rd["steps"], dcfg, dict(dspark.state_dict()),
                                      train_config=_train_config_text("dspark", dcfg, rd),
                                      optimizer_state=dspark_opt)

        # DFlash drafter, z-lab layout
        t0 = time.perf_counter()
        rf = rec["dflash"]
        fcfg = dflash_config_dict(target_config, num_hidden_layers=rf["num_hidden_layers"],
                                  target_layer_ids=rf["target_layer_ids"], block_size=rf["block_size"],
                                  mask_token_id=MASK_ID, intermediate_size=rf["intermediate_size"])
        dflash = _init_drafter(fcfg, target, rec["seed"] + 2)
        dflash_losses, _ = _train_drafter(dflash, seqs, feats, last_hidden, lm_head, rec["regen"]["prompt_len"],
                                          rf, gen, anchor_first=False)
        timings["dflash_train_s"] = time.perf_counter() - t0
        dflash_dir = out / "dflash_drafter"
        dflash_dir.mkdir()
        (dflash_dir / "config.json").write_text(json.dumps(fcfg, indent=2, sort_keys=True) + "\n")
        _save_safetensors({k: v for k, v in dflash.state_dict().items()
                           if not k.startswith(("embed_tokens.", "lm_head."))}, dflash_dir / "model.safetensors")

        # held-out prompts
        prompts = _heldout_prompts(held, rec["eval"])
        with open(out / "prompts.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")

        # measure τ with the reference engine, from the saved folders
        t0 = time.perf_counter()
        prompt_ids = [tok.encode(p).ids for p in prompts]
        tau: dict[str, dict[str, float]] = {"dspark": {}, "dflash": {}}
        per_pos: dict[str, list[float]] = {}
        lossless: dict[str, bool] = {}
        base_engine = ReferenceEngine(target_dir, None)
        baseline = base_engine.run(prompt_ids, num_speculative_tokens=None,
                                   max_new_tokens=rec["eval"]["max_new_tokens"])
        for name, folder in (("dspark", run_dir), ("dflash", dflash_dir)):
            engine = ReferenceEngine(base_engine.target, folder)
            for n in rec["eval"]["ns"]:
                stats = engine.run(prompt_ids, num_speculative_tokens=n,
                                   max_new_tokens=rec["eval"]["max_new_tokens"])
                tau[name][str(n)] = round(stats.tau, 4)
                if n == max(rec["eval"]["ns"]):
                    per_pos[name] = [round(x, 4) for x in stats.per_position_acceptance]
                    lossless[name] = stats.outputs == baseline.outputs
        timings["measure_s"] = time.perf_counter() - t0
        timings["total_s"] = time.perf_counter() - t_all
        info = {
            "dsparkhub_version": __version__,
            "key": out.name,
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "transformers": __import__("transformers").__version__},
            "recipe": rec,
            "corpus": {"train_modules": len(texts), "heldout_modules": [m.stem for m in held],
                       "train_chars": total, "train_tokens": int(stream.numel())},
            "sizes": {
                "vocab_size": tok.get_vocab_size(),
                "target_parameters": count_parameters(target),
                "dspark_parameters": count_parameters(dspark),
                "dspark_trainable_parameters": sum(p.numel() for n_, p in dspark.named_parameters()
                                                   if not n_.startswith(("embed_tokens", "lm_head"))),
                "dflash_parameters": sum(p.numel() for n_, p in dflash.named_parameters()
                                         if not n_.startswith(("embed_tokens", "lm_head"))),
                "regenerated_sequences": int(seqs.shape[0]),
                "regenerated_seq_len": int(seqs.shape[1]),
                "bytes": {name: sum(f.stat().st_size for f in (out / name).rglob("*") if f.is_file())
                          for name in ("target", "deepspec_run", "dflash_drafter")},
            },
            "final_loss": {"target": round(sum(target_losses[-10:]) / 10, 4),
                           "dspark": round(sum(dspark_losses[-20:]) / 20, 4),
                           "dflash": round(sum(dflash_losses[-20:]) / 20, 4)},
            "seconds": {k: round(v, 2) for k, v in timings.items()},
            "tau": tau,
            "per_position_acceptance_n7": per_pos,
            "lossless_greedy": lossless,
            "eval": {"num_prompts": len(prompts), "max_new_tokens": rec["eval"]["max_new_tokens"],
                     "temperature": 0.0, "engine": base_engine.version},
            "special_tokens": {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "mask_token_id": MASK_ID},
            "dspark_step": step_dir.name,
            "target_layer_ids": {"numbering": "layer index (HF hidden_states[id + 1])", "ids": layer_ids},
        }
        (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    finally:
        torch.set_num_threads(old_threads)


def _heldout_prompts(held: list[Path], r: dict) -> list[str]:
    """Code snippets from held-out modules: each starts at a ``def`` line and is cut at a line end."""
    prompts: list[str] = []
    for m in held:
        text = _read_source(m)
        idx = text.find("\ndef ", len(text) // 3)
        if idx < 0:
            idx = text.find("\n    def ")
        if idx < 0:
            continue
        snippet = text[idx + 1: idx + 1 + r["prompt_chars"]]
        snippet = snippet[: snippet.rfind("\n") + 1] if "\n" in snippet else snippet
        if len(snippet) >= 60:
            prompts.append(snippet)
        if len(prompts) >= r["num_prompts"]:
            break
    return prompts


def main(argv: list[str] | None = None) -> int:  # used by scripts/build_example.py
    """Build the example and print its info (for ``scripts/build_example.py``)."""
    import argparse

    parser = argparse.ArgumentParser(description="Build the dsparkhub embedded example.")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    ex = build_example(args.cache_dir, force=args.force)
    sys.stdout.write(json.dumps({"root": str(ex.root), "seconds": ex.info["seconds"], "tau": ex.info["tau"],
                                 "sizes": ex.info["sizes"]}, indent=2) + "\n")
    return 0
