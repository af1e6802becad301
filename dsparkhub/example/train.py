"""Training the embedded example from scratch: a tiny Qwen3 target and two drafters for it, offline on CPU.

:func:`train_example_into` trains, seeded, in a few minutes on 2 CPU cores (float results differ across CPUs, so
the shipped build in ``dsparkhub/data/example/`` is what every machine uses; see :mod:`dsparkhub.example`):

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
and measures τ with :class:`dsparkhub.verify.reference.engine.ReferenceEngine` (:func:`measure_example`).

Owns the recipe (:data:`EXAMPLE_RECIPE`), the losses and the training loops. Does not read the corpus or train the
tokenizer (:mod:`dsparkhub.example.corpus`), build the drafters' batches (:mod:`dsparkhub.example.batches`) or
define the layouts it saves in (:mod:`dsparkhub.example.layouts`). It never touches the network.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dsparkhub import __version__
from dsparkhub.example.batches import anchor_blocks, regenerate, target_states
from dsparkhub.example.corpus import (CHAT_TEMPLATE, EOS_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, heldout_prompts,
                                      read_source, stdlib_modules, train_tokenizer)
from dsparkhub.example.layouts import dflash_config_dict, dspark_config_dict, save_deepspec_step, save_safetensors
from dsparkhub.verify.reference.loading import drafter_config_of
from dsparkhub.verify.reference.modeling import Drafter, count_parameters

__all__ = ["EXAMPLE_RECIPE", "SPECIAL_TOKENS", "train_example_into", "measure_example"]

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


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))



def optimise(opt: torch.optim.Optimizer, params: list, r: dict, loss_at, *, what: str, every: int = 20,
             progress=None) -> list[float]:
    """The example's one training loop: for ``r["steps"]`` steps, the warm-up + cosine learning rate (:func:`_lr`
    of ``r["lr"]`` / ``r["warmup"]``), ``loss_at(step)`` (a scalar tensor; it samples its own batch), backward,
    gradient norm clipped to 1.0 over ``params``, one optimizer step; a progress line every ``every`` steps.

    Returns:
        The loss of every step (floats), in order.
    """
    losses = []
    for step in range(r["steps"]):
        for g in opt.param_groups:
            g["lr"] = _lr(step, r["steps"], r["lr"], r["warmup"])
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if progress and step % every == 0:
            progress(f"  {what} step {step}/{r['steps']} loss {losses[-1]:.3f}")
    return losses


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


# ---- training --------------------------------------------------------------------------------------------------


def _train_target(model, stream: torch.Tensor, r: dict, gen: torch.Generator, progress=None) -> list[float]:
    seq, bs = r["seq_len"], r["batch_size"]
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=r["lr"], betas=(0.9, 0.95), weight_decay=0.01)
    model.train()

    def loss_at(step: int) -> torch.Tensor:
        starts = torch.randint(0, stream.numel() - seq - 1, (bs,), generator=gen)
        batch = torch.stack([stream[s:s + seq] for s in starts.tolist()])
        return model(input_ids=batch, labels=batch).loss

    losses = optimise(opt, params, r, loss_at, what="target", progress=progress)
    model.eval()
    return losses


def _train_drafter(drafter: Drafter, seqs, feats, last_hidden, target_lm_head, prompt_len: int, r: dict,
                   gen: torch.Generator, *, anchor_first: bool, progress=None) -> tuple[list[float], dict]:
    """DeepSpec-style training over sampled anchor blocks; returns (losses, optimizer state).

    Anchor-first (DSpark): query ``[anchor, mask × (B-1)]`` at positions a..a+B-1, slot k predicts a+k+1.
    1+N (DFlash): query ``[anchor, mask × (B-1)]`` at a..a+B-1, slots 1..B-1 predict their own positions.
    The blocks and their masks are :func:`dsparkhub.example.batches.anchor_blocks`.
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

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.randint(0, bsz_all, (r["batch_size"],), generator=gen)
        ids, ft, lh = seqs[rows], feats[rows], last_hidden[rows]
        bsz = ids.shape[0]
        b = anchor_blocks(ids, valid_row, num_anchors, block, npred, drafter.config.mask_token_id, gen)
        na = b.anchors.shape[1]
        cache = drafter.context_kv(ft, b.context_positions)
        hidden = drafter.backbone(b.block_ids, b.positions, cache, b.mask)
        hidden = hidden.view(bsz, na, block, -1)[:, :, first:first + npred]  # [B, na, npred, H]
        logits = drafter.base_logits(hidden)
        if drafter.markov_head is not None:
            logits = logits + drafter.markov_bias(b.prev)
        tgt_h = torch.gather(lh.unsqueeze(1).expand(-1, na, -1, -1), 2,
                             (b.label_positions - 1).unsqueeze(-1).expand(-1, -1, -1, lh.shape[-1]))
        with torch.no_grad():
            tgt_p = torch.softmax(target_lm_head(tgt_h).float(), dim=-1)
        w = b.eval_mask.float() * pos_w
        den = w.sum() + 1e-6
        logp = torch.log_softmax(logits.float(), dim=-1)
        ce = -(torch.gather(logp, -1, b.labels.unsqueeze(-1)).squeeze(-1) * w).sum() / den
        l1_tok = (logp.exp() - tgt_p).abs().sum(-1)
        l1 = (l1_tok * w).sum() / den
        loss = r["ce_loss_alpha"] * ce + r["l1_loss_alpha"] * l1
        if drafter.confidence_head is not None:
            conf = drafter.confidence_logit(hidden, b.prev)
            target_acc = (1.0 - 0.5 * l1_tok.detach()).clamp(0.0, 1.0)
            bce = F.binary_cross_entropy_with_logits(conf, target_acc, reduction="none")
            loss = loss + r["confidence_head_alpha"] * (bce * w).sum() / den
        return loss

    losses = optimise(opt, params, r, loss_at, what="drafter", progress=progress)
    drafter.eval()
    return losses, opt.state_dict()


def _init_drafter(cfg_dict: dict, target_model, seed: int) -> Drafter:
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config_of(cfg_dict))
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


def train_example_into(out: Path, progress=None) -> None:
    """Train every artefact into ``out`` (a fresh temp folder) and write its ``info.json``.

    Args:
        out: an empty folder.
        progress: ``None`` or a callable taking one line of text, called per phase and every 20 training steps.

    Raises:
        DsparkhubError: the standard library sources are missing (the training corpus).
    """
    from tokenizers import Tokenizer  # noqa: F401  (import error surfaces early)
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    rec = EXAMPLE_RECIPE

    def say(line: str) -> None:
        if progress:
            progress(line)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(rec["threads"])
    torch.manual_seed(rec["seed"])
    gen = torch.Generator().manual_seed(rec["seed"])
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    try:
        # corpus + tokenizer
        t0 = time.perf_counter()
        modules = stdlib_modules()
        every = rec["corpus"]["holdout_every"]
        held = [m for i, m in enumerate(modules) if i % every == every // 2]
        train = [m for m in modules if m not in held]
        texts, total = [], 0
        for m in train:
            text = read_source(m)
            if total + len(text) > rec["corpus"]["max_train_chars"]:
                continue
            texts.append(text)
            total += len(text)
        tok = train_tokenizer(texts, rec["tokenizer"]["vocab_size"])
        stream = torch.tensor([t for text in texts for t in tok.encode(text).ids + [EOS_ID]], dtype=torch.int64)
        timings["tokenizer_s"] = time.perf_counter() - t0

        # target
        t0 = time.perf_counter()
        tcfg = _target_config(tok.get_vocab_size())
        torch.manual_seed(rec["seed"])
        target = Qwen3ForCausalLM(tcfg)
        say("training the target")
        target_losses = _train_target(target, stream, rec["target"], gen, progress)
        timings["target_train_s"] = time.perf_counter() - t0
        target_dir = out / "target"
        target.generation_config.eos_token_id = EOS_ID
        target.generation_config.pad_token_id = PAD_ID
        target.save_pretrained(target_dir)
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[0],
                                         pad_token=SPECIAL_TOKENS[1], mask_token=SPECIAL_TOKENS[2])
        hf_tok.chat_template = CHAT_TEMPLATE
        hf_tok.save_pretrained(target_dir)

        say("regenerating the training data with the target")
        # regenerated data + target states
        t0 = time.perf_counter()
        seqs = regenerate(target, stream, rec["regen"], gen)
        layer_ids = rec["dspark"]["target_layer_ids"]
        feats, last_hidden = target_states(target, seqs, layer_ids)
        timings["regenerate_s"] = time.perf_counter() - t0
        target_config = json.loads((target_dir / "config.json").read_text())
        lm_head = target.get_output_embeddings()
        for p in target.parameters():
            p.requires_grad_(False)

        say("training the DSpark drafter (DeepSpec recipe)")
        # DSpark drafter, DeepSpec layout
        t0 = time.perf_counter()
        rd = rec["dspark"]
        dcfg = dspark_config_dict(target_config, num_hidden_layers=rd["num_hidden_layers"],
                                  target_layer_ids=rd["target_layer_ids"], block_size=rd["block_size"],
                                  mask_token_id=MASK_ID, markov_rank=rd["markov_rank"],
                                  intermediate_size=rd["intermediate_size"], num_anchors=rd["num_anchors"])
        dspark = _init_drafter(dcfg, target, rec["seed"] + 1)
        dspark_losses, dspark_opt = _train_drafter(dspark, seqs, feats, last_hidden, lm_head,
                                                   rec["regen"]["prompt_len"], rd, gen, anchor_first=True,
                                                   progress=progress)
        timings["dspark_train_s"] = time.perf_counter() - t0
        run_dir = out / "deepspec_run"
        step_dir = save_deepspec_step(run_dir, rd["steps"], dcfg, dict(dspark.state_dict()),
                                      train_config=_train_config_text("dspark", dcfg, rd),
                                      optimizer_state=dspark_opt)

        say("training the DFlash drafter (z-lab layout)")
        # DFlash drafter, z-lab layout
        t0 = time.perf_counter()
        rf = rec["dflash"]
        fcfg = dflash_config_dict(target_config, num_hidden_layers=rf["num_hidden_layers"],
                                  target_layer_ids=rf["target_layer_ids"], block_size=rf["block_size"],
                                  mask_token_id=MASK_ID, intermediate_size=rf["intermediate_size"])
        dflash = _init_drafter(fcfg, target, rec["seed"] + 2)
        dflash_losses, _ = _train_drafter(dflash, seqs, feats, last_hidden, lm_head, rec["regen"]["prompt_len"],
                                          rf, gen, anchor_first=False, progress=progress)
        timings["dflash_train_s"] = time.perf_counter() - t0
        dflash_dir = out / "dflash_drafter"
        dflash_dir.mkdir()
        (dflash_dir / "config.json").write_text(json.dumps(fcfg, indent=2, sort_keys=True) + "\n")
        save_safetensors({k: v for k, v in dflash.state_dict().items()
                           if not k.startswith(("embed_tokens.", "lm_head."))}, dflash_dir / "model.safetensors")

        # held-out prompts
        prompts = heldout_prompts(held, rec["eval"])
        with open(out / "prompts.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")

        say("measuring τ with the reference engine")
        # measure τ with the reference engine, from the saved folders
        t0 = time.perf_counter()
        measured = measure_example(target_dir, run_dir, dflash_dir, out / "prompts.jsonl")
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
            **measured,
            "special_tokens": {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "mask_token_id": MASK_ID},
            "dspark_step": step_dir.name,
            "target_layer_ids": {"numbering": "layer index (HF hidden_states[id + 1])", "ids": layer_ids},
        }
        (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    finally:
        torch.set_num_threads(old_threads)


def measure_example(target_dir: Path, dspark_dir: Path, dflash_dir: Path, prompts_file: Path) -> dict:
    """τ of both drafters on the held-out prompts with the reference engine (greedy, ``EXAMPLE_RECIPE["eval"]``).

    Args:
        target_dir: the HF target folder (its tokenizer encodes the prompts).
        dspark_dir: the DeepSpec run (or step) folder of the DSpark drafter.
        dflash_dir: the z-lab DFlash drafter folder.
        prompts_file: JSONL, one ``{"prompt": str}`` a line.

    Returns:
        ``{"tau": {"dspark"|"dflash": {"3"|"5"|"7": float}}, "per_position_acceptance_n7": {name: [float]},
        "lossless_greedy": {name: bool}, "eval": {num_prompts, max_new_tokens, temperature, engine, device}}``;
        τ rounded to 4 decimals, the bonus token included.
    """
    from transformers import AutoTokenizer

    from dsparkhub.verify.reference.engine import ReferenceEngine

    r = EXAMPLE_RECIPE["eval"]
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    prompts = [json.loads(line)["prompt"] for line in Path(prompts_file).read_text().splitlines() if line.strip()]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    tau: dict[str, dict[str, float]] = {"dspark": {}, "dflash": {}}
    per_pos: dict[str, list[float]] = {}
    lossless: dict[str, bool] = {}
    base_engine = ReferenceEngine(target_dir, None)
    baseline = base_engine.run(prompt_ids, num_speculative_tokens=None, max_new_tokens=r["max_new_tokens"])
    for name, folder in (("dspark", dspark_dir), ("dflash", dflash_dir)):
        engine = ReferenceEngine(base_engine.target, folder)
        for n in r["ns"]:
            stats = engine.run(prompt_ids, num_speculative_tokens=n, max_new_tokens=r["max_new_tokens"])
            tau[name][str(n)] = round(stats.tau, 4)
            if n == max(r["ns"]):
                per_pos[name] = [round(x, 4) for x in stats.per_position_acceptance]
                lossless[name] = stats.outputs == baseline.outputs
    device = base_engine.device
    return {"tau": tau, "per_position_acceptance_n7": per_pos, "lossless_greedy": lossless,
            "eval": {"num_prompts": len(prompts), "max_new_tokens": r["max_new_tokens"], "temperature": 0.0,
                     "engine": base_engine.version, "device": device}}
