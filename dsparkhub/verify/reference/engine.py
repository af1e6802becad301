"""The reference speculative-decoding engine: a transformers target plus a :class:`dsparkhub.verify.reference.modeling.Drafter`.

It is a measuring instrument: its job is to predict the acceptance length τ, the per-position acceptance and the
lossless property that vLLM 0.32 would show for the same target, drafter and ``num_speculative_tokens`` — batch 1, on
CPU or one GPU. It implements :class:`dsparkhub.verify.stats.Backend`.

One decoding step (vLLM 0.32 ``v1/worker/gpu/spec_decode/dspark/speculator.py`` and ``dflash/speculator.py``):

1. *draft*: the pending token (the last committed token, which the target has not seen yet) is the anchor at
   position p. The drafter reads its context K/V (target hidden states of every position < p, cached) and a query
   block — anchor-first ``[anchor, mask × (n-1)]`` for DSpark, 1+N ``[anchor, mask × n]`` for DFlash — and proposes n
   tokens left to right, adding the Markov bias of the previously chosen token at each position (DSpark). An
   EAGLE-3 drafter (:mod:`dsparkhub.verify.reference.eagle3`) drafts one token per step instead, autoregressively
   with its own KV cache (vLLM 0.32 ``v1/spec_decode/eagle.py``).
2. *verify*: ONE target forward over ``[anchor, d_1 .. d_k]`` with the target's KV cache. Greedy: accept while
   ``d_i == argmax``; the target's token at the first mismatch (or after the last draft) is the bonus token.
   Temperature > 0: standard speculative rejection sampling — accept ``d_i`` with probability
   ``min(1, p_t(d_i) / p_d(d_i))``, else resample from ``norm(max(p_t - p_d, 0))`` — which leaves the output
   distribution exactly the target's.
3. the target cache is cropped to the accepted prefix, and the hidden states of the accepted positions extend the
   drafter's context cache. Nothing is recomputed from scratch.

Counters follow ``dsparkhub.verify.stats`` (vLLM ``v1/spec_decode/metrics.py``): one draft per verify step, accepted
tokens exclude the bonus, ``accepted_per_pos[k]`` counts steps accepting at least k + 1 tokens. Tokens accepted past
an EOS or past ``max_new_tokens`` are counted as vLLM's scheduler counts them (accepted in that step) but not output.

Batching (``run(..., concurrency=c)``, ragged) lives in ``dsparkhub.verify.reference.batching``; this module's loop is batch 1.
Not done here: prompt-lookup or other draft methods; confidence-scheduled verification (vLLM's budgeter, SGLang's SPS
scheduler) is ``dsparkhub.verify.reference.policies``, run batched; the optional ``confidence_threshold`` is a simple
per-request truncation (see :meth:`ReferenceEngine.__init__`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dsparkhub import __version__
from dsparkhub.errors import VerifyError
from dsparkhub.verify.reference.loading import load_drafter
from dsparkhub.verify.reference.modeling import ContextCache, Drafter, count_parameters, target_features
from dsparkhub.verify.reference.sampling import rejection_step
from dsparkhub.torch_threads import threads_for, torch_threads
from dsparkhub.verify.stats import RunStats

__all__ = ["ReferenceEngine", "rejection_step", "load_target"]


def load_target(target, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A transformers causal LM in eval mode: ``target`` is a folder or an already loaded ``PreTrainedModel``.

    Raises:
        VerifyError: the folder cannot be loaded by transformers (message names the folder).
    """
    if not isinstance(target, (str, Path)):
        return target.eval()
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise VerifyError(f"transformers could not load the target from {target}: {exc}", path=target) from exc
    return model.to(device).eval()


@dataclass
class _Counters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    steps: int = 0
    recorder: object | None = None  # a ``calibration.ConfidenceRecorder`` (its ``record`` method); None in warm-up
    costs: object | None = None  # a ``dsparkhub.verify.costs.StepCosts`` (``engine.step_costs``); None in warm-up
    prompt: int = 0
    request_drafts: list[int] = field(default_factory=list)  # per prompt, filled by ``_run``
    request_accepted: list[int] = field(default_factory=list)


class ReferenceEngine:
    """Batch-1 speculative decoding with a transformers target and an optional DSpark / DFlash / EAGLE-3 drafter.

    Args:
        target: HF model folder or loaded ``PreTrainedModel`` (Qwen3-style, ``output_hidden_states`` support).
        drafter: drafter folder (any layout :func:`dsparkhub.verify.reference.loading.load_drafter` reads), the
            drafter opened (``OpenedDraft``, as verify hands it on) or a :class:`Drafter`;
            None for baseline-only use.
        device: torch device ("cpu", "cuda").
        dtype: dtype of both models (float32 default: the lossless check is then exact up to kernel rounding).
        confidence_threshold: if set (0..1), truncate each draft at the first position whose cumulative confidence
            (product of ``sigmoid(confidence_head)`` so far) drops below it; at least one token is always drafted.
            Needs a drafter with a confidence head.
        eos_token_id: stop token(s); default the target's ``generation_config`` / ``config`` eos.
        ignore_eos: generate exactly ``max_new_tokens`` tokens.

    Attributes:
        name: ``"reference"``; version: ``"dsparkhub X (torch Y)"``; device: in words, e.g. ``"cpu (2 threads)"``.

    Raises:
        VerifyError: the target cannot be loaded, or ``confidence_threshold`` is given for a drafter without head.
    """

    name = "reference"
    interleaves = True  # switching configurations costs nothing: verify interleaves baseline and drafter runs

    def __init__(self, target, drafter=None, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 confidence_threshold: float | None = None, eos_token_id: int | list[int] | None = None,
                 ignore_eos: bool = False):
        self.version = f"dsparkhub {__version__} (torch {torch.__version__})"
        self._device = torch.device(device)
        self.target = load_target(target, device=self._device, dtype=dtype)
        if drafter is not None and not isinstance(drafter, Drafter):
            drafter = load_drafter(drafter, self.target, dtype=dtype, device=self._device)
        self.drafter: Drafter | None = drafter
        if confidence_threshold is not None:
            if drafter is None or drafter.confidence_head is None:
                raise VerifyError("confidence_threshold needs a drafter with a confidence head "
                                  "(enable_confidence_head and confidence_head.* tensors)")
            if not 0.0 <= confidence_threshold <= 1.0:
                raise VerifyError(f"confidence_threshold must be in [0, 1], found {confidence_threshold}")
        self.confidence_threshold = confidence_threshold
        if eos_token_id is None:
            gen_cfg = getattr(self.target, "generation_config", None)
            eos_token_id = getattr(gen_cfg, "eos_token_id", None) or getattr(self.target.config, "eos_token_id",
                                                                             None)
        if isinstance(eos_token_id, int):
            eos_token_id = [eos_token_id]
        self.eos_ids: set[int] = set() if ignore_eos or eos_token_id is None else {int(e) for e in eos_token_id}
        self._warm = False
        # confidence-scheduled verification (dsparkhub.verify.schedule sets it; it routes every run, concurrency 1
        # included, through batching.run_batched) and per-shape step costs (schedule and verify set them; recorded by
        # the batch-1 loop and the batched one alike, warm-up excluded)
        self.scheduler = None  # a dsparkhub.verify.reference.policies.Scheduler
        self.step_costs = None  # a dsparkhub.verify.costs.StepCosts
        # intra-op threads for the model size: small models run fastest on one (dsparkhub.torch_threads)
        self.threads = threads_for(max(sum(p.numel() for p in self.target.parameters()),
                                       count_parameters(drafter) if drafter is not None else 0), device=self._device)
        cfg = self.target.config
        self._vocab = int((cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg).vocab_size)

    @property
    def device(self) -> str:
        """What runs the engine, in words."""
        if self._device.type == "cuda":
            return f"{torch.cuda.get_device_name(self._device)} x1"
        return f"{self._device.type} ({self.threads} thread{'s' if self.threads > 1 else ''})"

    def num_parameters(self) -> int:
        """Parameters of the target plus the drafter (for the choice of intra-op threads)."""
        mods = [m for m in (self.target, self.drafter) if m is not None]
        return sum(p.numel() for m in mods for p in m.parameters())

    def close(self) -> None:
        """Drop the models (the engine cannot run afterwards)."""
        self.target = None
        self.drafter = None

    # -- public ---------------------------------------------------------------------------------------------------

    def run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0, concurrency: int = 1, progress=None,
            recorder=None) -> RunStats:
        """:meth:`_run` with ``self.threads`` intra-op threads (restored afterwards); same arguments and errors."""
        with torch_threads(self.threads):
            return self._run(prompts, num_speculative_tokens=num_speculative_tokens, max_new_tokens=max_new_tokens,
                             temperature=temperature, seed=seed, concurrency=concurrency, progress=progress,
                             recorder=recorder)

    def _run(self, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
             temperature: float = 0.0, seed: int = 0, concurrency: int = 1, progress=None,
             recorder=None) -> RunStats:
        """Generate for each prompt (batch 1, or ``concurrency`` requests together) and return outputs, counters
        and timings.

        Args:
            prompts: token ids per prompt.
            num_speculative_tokens: n draft tokens per step; None runs the target alone (baseline).
            max_new_tokens: output cap per prompt.
            temperature: 0 = greedy; > 0 = sampling with rejection sampling (lossless in distribution).
            seed: prompt i samples with a generator seeded ``seed + i``.
            concurrency: requests decoding together (> 1: ``batching.run_batched``, ragged batches).
            progress: called with 1 per finished prompt.
            recorder: optional object with ``record(prompt, confidence_logits, accepted, verified)``, called once per
                verify step (warm-up excluded; batch 1 only) with the prompt's index, the raw confidence-head logits of the drafted
                positions (k floats, before the sigmoid), the accepted count and the verified width k; see
                :class:`dsparkhub.verify.calibration.ConfidenceRecorder`. Needs a drafter with a confidence head.

        Returns:
            :class:`RunStats`; ``wall_s`` covers generation only (after a one-off warm-up), with per-prompt
            ``ttft_s`` / ``latency_s``.

        Raises:
            VerifyError: bad arguments, a drafter is needed but missing, or an empty prompt.
        """
        if self.target is None:
            raise VerifyError("engine is closed")
        if num_speculative_tokens is not None:
            if self.drafter is None:
                raise VerifyError("num_speculative_tokens given but the engine has no drafter")
            if num_speculative_tokens < 1:
                raise VerifyError(f"num_speculative_tokens must be >= 1, found {num_speculative_tokens}")
        if max_new_tokens < 1:
            raise VerifyError(f"max_new_tokens must be >= 1, found {max_new_tokens}")
        if temperature < 0:
            raise VerifyError(f"temperature must be >= 0, found {temperature}")
        if recorder is not None and (num_speculative_tokens is None or self.drafter.confidence_head is None):
            raise VerifyError("recording confidences needs num_speculative_tokens and a drafter with a confidence "
                              "head (enable_confidence_head and confidence_head.* tensors)")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise VerifyError(f"prompt {i} is empty")
        n = num_speculative_tokens
        if not self._warm and prompts:
            self._generate(prompts[0], n, min(4, max_new_tokens), 0.0, None, _Counters(accepted_per_pos=[0] * (n or 0)))
            self._warm = True
        if concurrency != 1 or self.scheduler is not None:
            if recorder is not None:
                raise VerifyError("recording confidences runs one request at a time (concurrency 1), found "
                                  f"concurrency {concurrency}")
            from dsparkhub.verify.reference.batching import run_batched

            return run_batched(self, prompts, num_speculative_tokens=n, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed, concurrency=concurrency, progress=progress)
        counters = _Counters(accepted_per_pos=[0] * (n or 0), recorder=recorder, costs=self.step_costs)
        outputs: list[list[int]] = []
        wall = 0.0
        ttft: list[float] = []
        latency: list[float] = []
        for i, prompt in enumerate(prompts):
            gen = None
            if temperature > 0:
                gen = torch.Generator(device=self._device).manual_seed(seed + i)
            counters.prompt = i
            drafts0, accepted0 = counters.num_drafts, counters.num_accepted_tokens
            self._sync()
            t0 = time.perf_counter()
            outputs.append(self._generate(prompt, n, max_new_tokens, temperature, gen, counters))
            self._sync()
            wall += time.perf_counter() - t0
            ttft.append(self._first_token_at - t0)
            latency.append(time.perf_counter() - t0)
            counters.request_drafts.append(counters.num_drafts - drafts0)
            counters.request_accepted.append(counters.num_accepted_tokens - accepted0)
            if progress:
                progress(1)
        return RunStats(ttft_s=ttft, latency_s=latency, outputs=outputs, wall_s=wall, num_drafts=counters.num_drafts,
                        num_draft_tokens=counters.num_draft_tokens, num_accepted_tokens=counters.num_accepted_tokens,
                        accepted_per_pos=counters.accepted_per_pos if n else [],
                        draft_s=counters.draft_s if n else 0.0, verify_s=counters.verify_s, steps=counters.steps,
                        request_drafts=counters.request_drafts, request_accepted=counters.request_accepted)

    # -- internals ------------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _choose(self, logits: torch.Tensor, temperature: float, gen) -> int:
        if temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))

    def _generate(self, prompt, n, max_new, temperature, gen, c: _Counters) -> list[int]:
        from transformers import DynamicCache

        with torch.inference_mode():
            ids = torch.tensor([prompt], dtype=torch.int64, device=self._device)
            cache = DynamicCache(config=self.target.config)
            out = self.target(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=n is not None,
                              logits_to_keep=1)
            pending = self._choose(out.logits[0, -1], temperature, gen)
            self._sync()
            self._first_token_at = time.perf_counter()  # TTFT of this request (read by ``run``)
            outputs = [pending]
            if n is None:
                return self._decode_plain(pending, cache, outputs, max_new, temperature, gen, c)
            drafter = self.drafter
            layer_ids = drafter.config.target_layer_ids
            ctx = drafter.context_kv(target_features(out.hidden_states, layer_ids).to(self._dtype_of(drafter)),
                                     torch.arange(len(prompt), device=self._device).unsqueeze(0),
                                     next_tokens=torch.tensor([prompt[1:] + [pending]], device=self._device))
            return self._decode_spec(pending, len(prompt), cache, ctx, outputs, n, max_new, temperature, gen, c)

    @staticmethod
    def _dtype_of(module) -> torch.dtype:
        return module.fc.weight.dtype

    def _done(self, outputs: list[int], max_new: int) -> bool:
        return len(outputs) >= max_new or outputs[-1] in self.eos_ids

    def _decode_plain(self, pending, cache, outputs, max_new, temperature, gen, c: _Counters) -> list[int]:
        while not self._done(outputs, max_new):
            self._sync()
            t0 = time.perf_counter()
            out = self.target(input_ids=torch.tensor([[pending]], device=self._device), past_key_values=cache,
                              use_cache=True)
            pending = self._choose(out.logits[0, -1], temperature, gen)
            self._sync()
            dt = time.perf_counter() - t0
            c.verify_s += dt
            c.steps += 1
            if c.costs is not None:  # context: the cache before this step's token
                c.costs.record(1, None, 0.0, dt, context=cache.get_seq_length() - 1)
            outputs.append(pending)
        return outputs

    def _draft(self, anchor: int, pos: int, ctx: ContextCache, n: int, temperature: float, gen,
               confidence_out: list[float] | None = None):
        """Propose up to n tokens (target ids) and, for sampling, the [k, V] draft distributions they came from;
        ``confidence_out`` (when given) receives the raw confidence logit of each drafted position."""
        d = self.drafter
        anchor_t = torch.tensor([anchor], device=self._device)
        if getattr(d, "autoregressive", False):  # EAGLE-3: chain drafting (no confidence head: refused in __init__)
            dists: list[torch.Tensor] = []
            ids = d.draft_steps(anchor_t, torch.tensor([pos], device=self._device), ctx, None, n,
                                lambda step, logits: self._choose_draft(d, logits, temperature, [gen], dists))
            return ids[0].tolist(), (torch.cat(dists) if dists else None)
        block_ids, positions, first = d.block_query(anchor_t, n, torch.tensor([pos], device=self._device))
        hidden = d.backbone(block_ids, positions, ctx)[0, first:first + n]  # [n, H]
        base = d.base_logits(hidden).float()  # [n, Vd]
        use_markov = d.markov_head is not None
        vocab = self._vocab
        if not use_markov and temperature == 0 and self.confidence_threshold is None and confidence_out is None:
            return d.to_target_ids(base.argmax(-1)).tolist(), None
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        prev = anchor_t
        survival = 1.0
        for i in range(n):
            logits = base[i] + d.markov_bias(prev)[0].float() if use_markov else base[i]
            if temperature == 0:
                draft_id = logits.argmax().view(1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                draft_id = torch.multinomial(probs, 1, generator=gen)
            tok = d.to_target_ids(draft_id)
            if self.confidence_threshold is not None or confidence_out is not None:
                logit = d.confidence_logit(hidden[i:i + 1], prev)
                if self.confidence_threshold is not None:
                    survival *= float(torch.sigmoid(logit)[0])
                    if survival < self.confidence_threshold and tokens:
                        break
                if confidence_out is not None:
                    confidence_out.append(float(logit[0]))
            if temperature > 0:
                q = torch.zeros(vocab, device=self._device)
                q[d.to_target_ids(torch.arange(probs.shape[0], device=self._device))] = probs
                dists.append(q)
            tokens.append(int(tok))
            prev = tok
        return tokens, (torch.stack(dists) if dists else None)

    def _choose_draft(self, d, logits: torch.Tensor, temperature: float, gens: list, dists: list) -> torch.Tensor:
        """Draft-vocab ids [B] from ``logits`` [B, Vd]: argmax, or one sample per row with its generator; for
        sampling, appends the rows' draft distributions in target vocab ([B, V]) to ``dists``."""
        if temperature == 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        q = torch.zeros(probs.shape[0], self._vocab, device=self._device)
        q[:, d.to_target_ids(torch.arange(probs.shape[1], device=self._device))] = probs
        dists.append(q)
        return torch.stack([torch.multinomial(probs[b], 1, generator=gens[b])[0] for b in range(probs.shape[0])])

    def _decode_spec(self, pending, pos, cache, ctx, outputs, n, max_new, temperature, gen, c: _Counters):
        d = self.drafter
        layer_ids = d.config.target_layer_ids
        ddtype = self._dtype_of(d)
        while not self._done(outputs, max_new):
            self._sync()
            t0 = time.perf_counter()
            conf: list[float] | None = None
            if c.recorder is None:
                drafts, q = self._draft(pending, pos, ctx, n, temperature, gen)
            else:
                conf = []
                drafts, q = self._draft(pending, pos, ctx, n, temperature, gen, confidence_out=conf)
            self._sync()
            t1 = time.perf_counter()
            k = len(drafts)
            inp = torch.tensor([[pending] + drafts], device=self._device)
            out = self.target(input_ids=inp, past_key_values=cache, use_cache=True, output_hidden_states=True)
            logits = out.logits[0].float()  # [k + 1, V]
            if temperature == 0:
                tgt = logits.argmax(-1)
                match = (tgt[:k] == torch.tensor(drafts, device=self._device)).to(torch.int64)
                accepted = int(match.cumprod(0).sum())
                bonus = int(tgt[accepted])
            else:
                p = torch.softmax(logits / temperature, dim=-1)
                accepted, bonus = 0, None
                for i in range(k):
                    ok, resampled = rejection_step(p[i], q[i], drafts[i], gen)
                    if not ok:
                        bonus = resampled
                        break
                    accepted += 1
                if bonus is None:
                    bonus = int(torch.multinomial(p[k], 1, generator=gen))
            if k - accepted > 0:
                cache.crop(-(k - accepted))
            feats = target_features(out.hidden_states, layer_ids)[:, :accepted + 1].to(ddtype)
            d.extend_context(ctx, feats, torch.arange(pos, pos + accepted + 1, device=self._device).unsqueeze(0),
                             next_tokens=torch.tensor([drafts[:accepted] + [bonus]], device=self._device))
            self._sync()
            t2 = time.perf_counter()
            c.draft_s += t1 - t0
            c.verify_s += t2 - t1
            if c.costs is not None:
                c.costs.record(1, k, t1 - t0, t2 - t1, context=pos)
            c.steps += 1
            c.num_drafts += 1
            c.num_draft_tokens += k
            c.num_accepted_tokens += accepted
            if c.recorder is not None:
                c.recorder.record(c.prompt, conf, accepted, k)
            for j in range(accepted):
                c.accepted_per_pos[j] += 1
            for tok in drafts[:accepted] + [bonus]:
                outputs.append(tok)
                if self._done(outputs, max_new):
                    break
            pos += accepted + 1
            pending = bonus
        return outputs
