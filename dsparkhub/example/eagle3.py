"""A tiny EAGLE-3 drafter for the embedded example's target, trained in well under a minute on CPU.

:func:`train_example_eagle3` trains, seeded, speculators' EAGLE-3 recipe at example size on the same kind of data as
the example's DSpark / DFlash drafters (:mod:`dsparkhub.example.train`): the target's own greedy continuations of
standard-library source windows (the example's training modules, its tokenizer). The drafter is one Llama layer over
``[embed ; fc(aux states of target layers 0, 1, 2)]`` (layer-index numbering; ``eagle_aux_hidden_state_layer_ids``
[1, 2, 3] in speculators' hidden-state-index numbering), ``norm_before_fc`` and ``norm_before_residual`` as
speculators 0.9.0 trains it, embedding and LM head initialised from the target (embedding frozen), and the
training-time test of speculators ``Eagle3DraftModel.forward``: ``ttt_steps`` teacher-forced steps, loss = soft
cross-entropy against the target's next-token distribution, step t weighted ``ttt_step_loss_decay ** t``. It is
saved in the speculators-eagle3 layout (config.json + model.safetensors) that vLLM 0.32 loads.

Not shipped with the example build: tests/test_compare_three_drafters.py trains it once, the CLI never does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dsparkhub.example.batches import regenerate, target_states
from dsparkhub.example.corpus import EOS_ID, read_source, stdlib_modules
from dsparkhub.example.layouts import save_safetensors
from dsparkhub.example.train import EXAMPLE_RECIPE, optimise

__all__ = ["EAGLE3_RECIPE", "eagle3_config_dict", "train_example_eagle3"]

EAGLE3_RECIPE = {
    "seed": 1234,
    "corpus_chars": 300_000,
    "regen": {"num_prompts": 128, "prompt_len": 64, "new_tokens": 64, "batch_size": 64},
    "target_layer_ids": [0, 1, 2],
    "intermediate_size": 512,
    "ttt_steps": 3,
    "ttt_step_loss_decay": 0.8,
    "batch_size": 8,
    "steps": 240,
    "lr": 3e-3,
    "warmup": 15,
}


def eagle3_config_dict(target_config: dict, r: dict = EAGLE3_RECIPE) -> dict:
    """The speculators-eagle3 ``config.json`` of the example's EAGLE-3 for a target ``config.json`` dict."""
    layer = {k: target_config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                           "rms_norm_eps", "vocab_size", "max_position_embeddings")}
    layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1, hidden_act="silu",
                 intermediate_size=r["intermediate_size"], attention_bias=False, mlp_bias=False,
                 rope_parameters=target_config.get("rope_parameters") or {"rope_type": "default",
                                                                           "rope_theta": 10000.0})
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
            "draft_vocab_size": target_config["vocab_size"], "norm_before_residual": True, "norm_before_fc": True,
            "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
            "target_hidden_size": target_config["hidden_size"],
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in r["target_layer_ids"]],
            "transformer_layer_config": layer,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": r["ttt_steps"]}],
                                   "verifier": {"name_or_path": "dsparkhub-example/target",
                                                "architectures": target_config.get("architectures")}}}


def _training_stream(target_dir: Path, chars: int) -> torch.Tensor:
    """The example's training modules (its held-out split excluded) tokenized with its tokenizer, EOS-separated."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    every = EXAMPLE_RECIPE["corpus"]["holdout_every"]
    ids, total = [], 0
    for i, module in enumerate(stdlib_modules()):
        if i % every == every // 2:
            continue
        text = read_source(module)
        if total + len(text) > chars:
            continue
        ids.extend(tok.encode(text).ids + [EOS_ID])
        total += len(text)
    return torch.tensor(ids, dtype=torch.int64)


def _ttt_loss(drafter, seqs, feats, last, lm_head, prompt_len: int, r: dict) -> torch.Tensor:
    """Soft cross-entropy of every TTT step against the target's distribution (speculators ``shift_batch``: slot i
    reads ``(x_{i+1}, h_i)`` and step t predicts ``x_{i+2+t}``), over generated positions only."""
    tokens, feats, last = seqs[:, 1:], feats[:, :-1], last[:, 1:]
    b, t = tokens.shape
    positions = torch.arange(t).unsqueeze(0).expand(b, -1)
    steps = drafter.ttt_forward(tokens, feats, positions, r["ttt_steps"])
    loss = torch.zeros(())
    slot = torch.arange(t)
    for step, logits in enumerate(steps):
        keep = (slot + 1 >= prompt_len) & (slot + step < t)  # slot i + step predicts x_{i+2+step}
        target_h = torch.cat([last[:, step:], last[:, :step]], 1)[:, keep]
        with torch.no_grad():
            p = torch.softmax(lm_head(target_h).float(), -1)
        ce = -(p * F.log_softmax(logits[:, keep].float(), -1)).sum(-1).mean()
        loss = loss + r["ttt_step_loss_decay"] ** step * ce
    return loss


def train_example_eagle3(target_dir: str | Path, out: str | Path, r: dict = EAGLE3_RECIPE, progress=None) -> Path:
    """Train the example's EAGLE-3 for the target in ``target_dir`` and save it to ``out`` (speculators layout).

    Args:
        target_dir: the example's HF target folder (``Example.target``).
        out: the drafter folder to write (created; config.json, model.safetensors, train_info.json).
        r: the recipe (:data:`EAGLE3_RECIPE`).
        progress: ``None`` or a callable taking one line of text.

    Returns:
        ``out`` as a Path.

    Raises:
        DsparkhubError: the standard library sources are missing (the training corpus).
    """
    from transformers import AutoModelForCausalLM

    from dsparkhub.verify.reference.loading import load_drafter

    target_dir, out = Path(target_dir), Path(out)
    t_all = time.perf_counter()
    gen = torch.Generator().manual_seed(r["seed"])
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    stream = _training_stream(target_dir, r["corpus_chars"])
    seqs = regenerate(target, stream, r["regen"], gen)
    feats, last = target_states(target, seqs, r["target_layer_ids"])
    # the config first (the recipes read the drafter's geometry from it), the weights once trained
    out.mkdir(parents=True, exist_ok=True)
    cfg = eagle3_config_dict(json.loads((target_dir / "config.json").read_text()), r)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    torch.manual_seed(r["seed"])
    h, a = target.config.hidden_size, len(r["target_layer_ids"])
    init = {"fc.weight": torch.randn(h, a * h) * 0.02, "input_norm.weight": torch.ones(a * h),
            "norm.weight": torch.ones(h), "embed_tokens.weight": target.get_input_embeddings().weight.detach(),
            "lm_head.weight": target.get_output_embeddings().weight.detach().clone()}
    drafter = _fresh_drafter(cfg, init, out / "config.json")
    params = [p for n, p in drafter.named_parameters() if not n.startswith("embed_tokens")]
    opt = torch.optim.AdamW(params, lr=r["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    lm_head = target.get_output_embeddings()
    drafter.train()

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.randint(0, seqs.shape[0], (r["batch_size"],), generator=gen)
        return _ttt_loss(drafter, seqs[rows], feats[rows], last[rows], lm_head, r["regen"]["prompt_len"], r)

    losses = optimise(opt, params, r, loss_at, what="eagle3", every=40, progress=progress)
    drafter.eval()
    save_safetensors({k: v.detach().contiguous() for k, v in drafter.state_dict().items()}, out / "model.safetensors")
    (out / "train_info.json").write_text(json.dumps({"recipe": r, "loss_first": losses[0], "loss_last": losses[-1],
                                                     "train_s": round(time.perf_counter() - t_all, 1)}, indent=2))
    load_drafter(out, target)  # the saved folder reads back through the recipes
    return out


def _fresh_drafter(config: dict, init: dict, path: Path):
    """The :class:`~dsparkhub.verify.reference.eagle3.Eagle3Drafter` of a speculators-eagle3 ``config`` with
    ``init`` loaded, layer 0 randomly initialised and the embedding frozen."""
    from dsparkhub.layouts.reading import spec_from_config
    from dsparkhub.verify.reference.loading import eagle3_from_spec

    drafter = eagle3_from_spec(spec_from_config(config, path=path, layout="speculators-eagle3"), path=path)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name in init:
                p.copy_(init[name])
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
    drafter.embed_tokens.weight.requires_grad_(False)
    return drafter
