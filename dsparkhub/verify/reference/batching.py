"""The reference engine batched: up to ``concurrency`` requests decode together, each at its own pace.

This module owns batched (ragged) speculative decoding for :class:`dsparkhub.verify.reference.engine.ReferenceEngine` and
the choice of torch intra-op threads by model size. It does not change the batch-1 loop (``reference``), which
stays the definition of the lossless property; a batched run is checked against the baseline batched the same way.

Scheduling is a closed loop like ``vllm bench serve --max-concurrency c``: ``c`` requests start together; when one
finishes the next prompt starts (its prefill runs alone, then it joins the decoding batch). A request's TTFT and
latency count from its start.

Ragged caches without re-packing every step: every sequence of the batch appends the same number of slots per
step (``1 + K`` in a verify step) to the target's KV cache and the drafter's context cache, and a boolean *valid*
mask [B, T] marks which slots hold accepted tokens. Rejected slots stay in place, masked out of every later
attention (the target gets it as its 2D ``attention_mask``, true positions as ``position_ids``; the drafter as the
bool ``mask`` of ``Drafter.backbone``). A masked slot adds an exact zero to the softmax, so each sequence sees the
same keys as in the batch-1 loop; only the summation order of the matmuls differs. When the cache is more than
twice as long as its longest valid row, rows are compacted (valid slots kept in order, left-padded).

Not done here: sliding-window targets (a cache slot is not a position there; refused), temperature > 0 with a
confidence threshold in the same run as greedy rows (every row of a run shares one temperature, as in verify).
"""

from __future__ import annotations

import time

import torch

from dsparkhub.errors import VerifyError
from dsparkhub.verify.reference.modeling import ContextCache, target_features
from dsparkhub.verify.reference.sampling import rejection_step
from dsparkhub.verify.stats import RunStats

__all__ = ["run_batched"]

class _Batch:
    """Batched target cache, drafter context cache and the valid-slot masks, rows = active requests."""

    def __init__(self):
        self.cache = None  # transformers DynamicCache, [B, nkv, T, hd] per layer
        self.valid: torch.Tensor | None = None  # bool [B, T]
        self.ctx: ContextCache | None = None
        self.ctx_valid: torch.Tensor | None = None  # bool [B, Tc]

    @property
    def rows(self) -> int:
        return 0 if self.valid is None else self.valid.shape[0]

    @staticmethod
    def _layers(cache):
        return [(layer, "keys", "values") for layer in cache.layers]

    def add(self, cache, ctx: ContextCache | None, length: int, device) -> None:
        """Append one prefilled request (batch-1 caches of ``length`` slots, all valid) as the last row."""
        valid = torch.ones(1, length, dtype=torch.bool, device=device)
        ctx_valid = torch.ones(1, length, dtype=torch.bool, device=device) if ctx is not None else None
        if self.valid is None:
            self.cache, self.valid, self.ctx, self.ctx_valid = cache, valid, ctx, ctx_valid
            return
        for (mine, _, _), (new, _, _) in zip(self._layers(self.cache), self._layers(cache)):
            mine.keys, new_k = _align(mine.keys, new.keys)
            mine.values, new_v = _align(mine.values, new.values)
            mine.keys = torch.cat([mine.keys, new_k], 0)
            mine.values = torch.cat([mine.values, new_v], 0)
        self.valid = torch.cat(_align(self.valid, valid, dim=1), 0)
        if ctx is not None:
            for i in range(len(self.ctx.keys)):
                a, b = _align(self.ctx.keys[i], ctx.keys[i])
                self.ctx.keys[i] = torch.cat([a, b], 0)
                a, b = _align(self.ctx.values[i], ctx.values[i])
                self.ctx.values[i] = torch.cat([a, b], 0)
            # positions ride along with the keys (sliding / causal masks compare them); padded slots are masked
            self.ctx.positions = torch.cat(_align(self.ctx.positions, ctx.positions, dim=1), 0)
            self.ctx_valid = torch.cat(_align(self.ctx_valid, ctx_valid, dim=1), 0)
            if ctx.states is not None:  # EAGLE-3's fused hidden per slot
                self.ctx.states = torch.cat(_align(self.ctx.states, ctx.states, dim=1), 0)

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (finished requests leave the batch)."""
        if not rows:
            self.__init__()
            return
        idx = torch.tensor(rows, device=self.valid.device)
        for layer, _, _ in self._layers(self.cache):
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.valid = self.valid[idx]
        if self.ctx is not None:
            self.ctx.keys = [k[idx] for k in self.ctx.keys]
            self.ctx.values = [v[idx] for v in self.ctx.values]
            self.ctx.positions = self.ctx.positions[idx]
            self.ctx_valid = self.ctx_valid[idx]
            if self.ctx.states is not None:
                self.ctx.states = self.ctx.states[idx]
        self.compact()

    def compact(self) -> None:
        """Drop masked slots when the cache is over twice its longest valid row (order kept, left-padded)."""
        for which in ("target", "ctx"):
            valid = self.valid if which == "target" else self.ctx_valid
            if valid is None:
                continue
            longest = int(valid.sum(1).max())
            if valid.shape[1] <= 2 * longest:
                continue
            # per row: gather index of valid slots, left-padded with a masked slot (index 0, marked invalid)
            index = torch.zeros(valid.shape[0], longest, dtype=torch.int64, device=valid.device)
            new_valid = torch.zeros(valid.shape[0], longest, dtype=torch.bool, device=valid.device)
            for b in range(valid.shape[0]):
                cols = valid[b].nonzero().squeeze(1)
                index[b, longest - len(cols):] = cols
                new_valid[b, longest - len(cols):] = True
            tensors = ([(layer, "keys") for layer in self.cache.layers] + [(layer, "values")
                                                                             for layer in self.cache.layers]
                       if which == "target" else None)
            if which == "target":
                for obj, attr in tensors:
                    setattr(obj, attr, _gather(getattr(obj, attr), index))
                self.valid = new_valid
            else:
                self.ctx.keys = [_gather(k, index) for k in self.ctx.keys]
                self.ctx.values = [_gather(v, index) for v in self.ctx.values]
                self.ctx.positions = self.ctx.positions.gather(1, index)
                if self.ctx.states is not None:
                    states = self.ctx.states
                    self.ctx.states = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))
                self.ctx_valid = new_valid


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, h, T, d] -> [B, h, T', d] with slots ``index`` [B, T'] per row."""
    b, h, _, d = x.shape
    return x.gather(2, index[:, None, :, None].expand(b, h, index.shape[1], d))


def _align(a: torch.Tensor, b: torch.Tensor, dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad the shorter of ``a`` / ``b`` along ``dim`` with zeros (masked slots) to the same length."""
    la, lb = a.shape[dim], b.shape[dim]

    def pad(x, k):
        shape = list(x.shape)
        shape[dim] = k
        return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim)

    return (pad(a, lb - la), b) if la < lb else (a, pad(b, la - lb) if lb < la else b)


class _Request:
    def __init__(self, index: int, prompt: list[int], gen):
        self.index, self.prompt, self.gen = index, prompt, gen
        self.outputs: list[int] = []
        self.pending = 0
        self.pos = len(prompt)  # position of the pending token
        self.t_start = self.t_first = self.t_end = 0.0
        self.drafts = self.accepted = 0  # this request's verify steps with drafts, draft tokens accepted


def run_batched(engine, prompts: list[list[int]], *, num_speculative_tokens: int | None, max_new_tokens: int,
                temperature: float, seed: int, concurrency: int, progress=None) -> RunStats:
    """Generate for every prompt with up to ``concurrency`` requests decoding together.

    Args:
        engine: a :class:`~dsparkhub.verify.reference.engine.ReferenceEngine` (its target, drafter, eos ids, device,
            confidence threshold and token choice are used).
        prompts: token ids per prompt (non-empty; the engine checked them).
        num_speculative_tokens: n drafts per step; None for the baseline.
        max_new_tokens: output cap per prompt.
        temperature: 0 = greedy; > 0 rejection sampling per row (prompt i seeded ``seed + i``).
        seed: sampling seed.
        concurrency: requests in flight together (>= 1).
        progress: called with 1 each time a request finishes.

    Returns:
        :class:`RunStats` with outputs in prompt order, ``wall_s`` from the first start to the last finish,
        per-request ``ttft_s`` / ``latency_s`` and the vLLM-style counters summed over requests.

    Raises:
        VerifyError: a sliding-window target (not supported batched) or a concurrency below 1.
    """
    if concurrency < 1:
        raise VerifyError(f"concurrency must be >= 1, found {concurrency}")
    cfg = engine.target.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) and \
            any(t == "sliding_attention" for t in (getattr(text, "layer_types", None) or [])):
        raise VerifyError("the batched reference engine does not handle sliding-window attention layers yet; "
                          "run this target at --concurrency 1")
    from transformers import DynamicCache

    dev = engine._device
    n = num_speculative_tokens
    drafter = engine.drafter if n is not None else None
    counters = dict(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, steps=0)
    accepted_per_pos = [0] * (n or 0)
    queue = [_Request(i, p, torch.Generator(device=dev).manual_seed(seed + i) if temperature > 0 else None)
             for i, p in enumerate(prompts)]
    queue.reverse()
    active: list[_Request] = []
    done: list[_Request] = []
    batch = _Batch()
    engine._sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        while queue or active:
            while queue and len(active) < concurrency:  # admit: prefill alone, then join the batch
                req = queue.pop()
                req.t_start = time.perf_counter()
                ids = torch.tensor([req.prompt], dtype=torch.int64, device=dev)
                cache = DynamicCache(config=engine.target.config)
                out = engine.target(input_ids=ids, past_key_values=cache, use_cache=True,
                                    output_hidden_states=drafter is not None, logits_to_keep=1)
                req.pending = engine._choose(out.logits[0, -1], temperature, req.gen)
                req.outputs.append(req.pending)
                ctx = None
                if drafter is not None:
                    feats = target_features(out.hidden_states, drafter.config.target_layer_ids)
                    ctx = drafter.context_kv(feats.to(drafter.fc.weight.dtype),
                                             torch.arange(len(req.prompt), device=dev).unsqueeze(0),
                                             next_tokens=torch.tensor([req.prompt[1:] + [req.pending]], device=dev))
                engine._sync()
                req.t_first = time.perf_counter()
                if engine._done(req.outputs, max_new_tokens):
                    req.t_end = req.t_first
                    done.append(req)
                    if progress:
                        progress(1)
                    continue
                batch.add(cache, ctx, len(req.prompt), dev)
                active.append(req)
            if not active:
                continue
            if drafter is None:
                _plain_step(engine, batch, active, temperature)
            else:
                _spec_step(engine, batch, active, n, temperature, counters, accepted_per_pos)
            counters["steps"] += 1
            engine._sync()
            now = time.perf_counter()
            keep = []
            for b, req in enumerate(active):
                if engine._done(req.outputs, max_new_tokens):
                    del req.outputs[max_new_tokens:]
                    req.t_end = now
                    done.append(req)
                    if progress:
                        progress(1)
                else:
                    keep.append(b)
            if len(keep) < len(active):
                active = [active[b] for b in keep]
                batch.keep(keep)
    wall = time.perf_counter() - t0
    done.sort(key=lambda r: r.index)
    return RunStats(outputs=[r.outputs for r in done], wall_s=wall, accepted_per_pos=accepted_per_pos,
                    draft_s=None, verify_s=None, ttft_s=[r.t_first - r.t_start for r in done],
                    latency_s=[r.t_end - r.t_start for r in done], concurrency=concurrency,
                    **{k: counters[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
                    steps=counters["steps"], request_drafts=[r.drafts for r in done],
                    request_accepted=[r.accepted for r in done])


def _target_forward(engine, batch: _Batch, tokens: torch.Tensor, positions: torch.Tensor, hidden: bool):
    """One target forward of ``tokens`` [B, Q] at true ``positions`` [B, Q] over the masked batch cache."""
    mask = torch.cat([batch.valid, torch.ones_like(tokens, dtype=torch.bool)], 1).to(torch.int64)
    return engine.target(input_ids=tokens, position_ids=positions, attention_mask=mask,
                         past_key_values=batch.cache, use_cache=True, output_hidden_states=hidden)


def _plain_step(engine, batch: _Batch, active: list[_Request], temperature: float) -> None:
    dev = engine._device
    costs = getattr(engine, "step_costs", None)
    if costs is not None:
        engine._sync()
        t0 = time.perf_counter()
    tokens = torch.tensor([[r.pending] for r in active], device=dev)
    positions = torch.tensor([[r.pos] for r in active], device=dev)
    out = _target_forward(engine, batch, tokens, positions, hidden=False)
    batch.valid = torch.cat([batch.valid, torch.ones(len(active), 1, dtype=torch.bool, device=dev)], 1)
    for b, req in enumerate(active):
        req.pending = engine._choose(out.logits[b, -1], temperature, req.gen)
        req.outputs.append(req.pending)
        req.pos += 1
    if costs is not None:
        engine._sync()
        costs.record(len(active), None, 0.0, time.perf_counter() - t0, context=max(r.pos for r in active) - 1)


def _spec_step(engine, batch: _Batch, active: list[_Request], n: int, temperature: float, counters: dict,
               accepted_per_pos: list[int]) -> None:
    """Draft for every row at once, verify every row in one target forward, accept per row.

    With ``engine.scheduler`` set (a :class:`dsparkhub.verify.reference.policies.Scheduler`), every row drafts all
    n positions and the scheduler picks each row's verify width from the block's confidence logits; with
    ``engine.step_costs`` set, the step's draft and verify seconds are recorded per shape (rows x widest width).
    """
    d = engine.drafter
    dev = engine._device
    sched = getattr(engine, "scheduler", None)
    costs = getattr(engine, "step_costs", None)
    if costs is not None:
        engine._sync()
        t0 = time.perf_counter()
    conf = [] if sched is not None and sched.policy.needs_confidence else None
    rows = len(active)
    anchors = torch.tensor([r.pending for r in active], device=dev)
    starts = torch.tensor([r.pos for r in active], device=dev)
    if getattr(d, "autoregressive", False):  # EAGLE-3: chain drafting over the masked context cache
        steps: list[torch.Tensor] = []
        ids = d.draft_steps(anchors, starts, batch.ctx, batch.ctx_valid, n, lambda step, logits: engine._choose_draft(
            d, logits, temperature, [r.gen for r in active], steps))
        drafts = ids.tolist()
        dists = [[q[b] for q in steps] for b in range(rows)]
        _verify_and_accept(engine, batch, active, drafts, dists, n, temperature, counters, accepted_per_pos, costs,
                           t0 if costs is not None else 0.0, sched)
        return
    block_ids, block_pos, first = d.block_query(anchors, n, starts)
    q_len = block_ids.shape[1]
    tc = batch.ctx_valid.shape[1]
    mask = torch.cat([batch.ctx_valid[:, None, None, :].expand(rows, 1, q_len, tc),
                      torch.ones(rows, 1, q_len, q_len, dtype=torch.bool, device=dev)], -1)
    hidden = d.backbone(block_ids, block_pos, batch.ctx, mask)[:, first:first + n]  # [B, n, H]
    base = d.base_logits(hidden).float()  # [B, n, Vd]
    drafts = [[] for _ in range(rows)]
    dists = [[] for _ in range(rows)]
    stopped = [False] * rows
    survival = torch.ones(rows, device=dev)
    prev = anchors
    for i in range(n):
        logits = base[:, i] + d.markov_bias(prev).float() if d.markov_head is not None else base[:, i]
        if temperature == 0:
            draft_ids = logits.argmax(-1)
            probs = None
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            draft_ids = torch.stack([torch.multinomial(probs[b], 1, generator=active[b].gen)[0]
                                     for b in range(rows)])
        tok = d.to_target_ids(draft_ids)
        if engine.confidence_threshold is not None:
            survival = survival * torch.sigmoid(d.confidence_logit(hidden[:, i], prev))
        if conf is not None:
            conf.append(d.confidence_logit(hidden[:, i], prev))
        for b in range(rows):
            if stopped[b]:
                continue
            if engine.confidence_threshold is not None and drafts[b] and \
                    float(survival[b]) < engine.confidence_threshold:
                stopped[b] = True
                continue
            drafts[b].append(int(tok[b]))
            if probs is not None:
                q = torch.zeros(engine._vocab, device=dev)
                q[d.to_target_ids(torch.arange(probs.shape[1], device=dev))] = probs[b]
                dists[b].append(q)
        prev = tok
    _verify_and_accept(engine, batch, active, drafts, dists, n, temperature, counters, accepted_per_pos, costs,
                       t0 if costs is not None else 0.0, sched, conf)


def _verify_and_accept(engine, batch: _Batch, active: list[_Request], drafts: list[list[int]], dists: list[list],
                       n: int, temperature: float, counters: dict, accepted_per_pos: list[int], costs, t0: float,
                       sched, conf: list | None = None) -> None:
    """Verify every row's drafts (target ids) in one target forward, accept per row, extend the caches.

    ``dists``: per row, the [V] draft distributions of its drafts (temperature > 0), else empty lists.
    """
    d = engine.drafter
    dev = engine._device
    rows = len(active)
    starts = torch.tensor([r.pos for r in active], device=dev)
    if sched is not None:
        widths = sched.widths(torch.stack(conf, 1) if conf is not None else torch.zeros(rows, n))
        drafts = [x[:w] for x, w in zip(drafts, widths)]
        dists = [x[:w] for x, w in zip(dists, widths)]
    k_max = max(len(x) for x in drafts)
    if costs is not None:
        engine._sync()
        t1 = time.perf_counter()
    pad = d.config.mask_token_id
    tokens = torch.tensor([[r.pending] + x + [pad] * (k_max - len(x)) for r, x in zip(active, drafts)], device=dev)
    positions = starts.unsqueeze(1) + torch.arange(k_max + 1, device=dev).unsqueeze(0)
    out = _target_forward(engine, batch, tokens, positions, hidden=True)
    logits = out.logits.float()  # [B, k_max + 1, V]
    accepted = []
    bonuses = []
    for b, req in enumerate(active):
        k = len(drafts[b])
        if temperature == 0:
            tgt = logits[b].argmax(-1)
            match = (tgt[:k] == torch.tensor(drafts[b], device=dev)).to(torch.int64)
            acc = int(match.cumprod(0).sum())
            bonus = int(tgt[acc])
        else:
            p = torch.softmax(logits[b] / temperature, dim=-1)
            acc, bonus = 0, None
            for i in range(k):
                ok, resampled = rejection_step(p[i], dists[b][i], drafts[b][i], req.gen)
                if not ok:
                    bonus = resampled
                    break
                acc += 1
            if bonus is None:
                bonus = int(torch.multinomial(p[k], 1, generator=req.gen))
        accepted.append(acc)
        bonuses.append(bonus)
        counters["num_drafts"] += 1
        counters["num_draft_tokens"] += k
        counters["num_accepted_tokens"] += acc
        req.drafts += 1
        req.accepted += acc
        for j in range(acc):
            accepted_per_pos[j] += 1
    acc_t = torch.tensor(accepted, device=dev)
    new_valid = torch.arange(k_max + 1, device=dev).unsqueeze(0) <= acc_t.unsqueeze(1)  # [B, k_max + 1]
    batch.valid = torch.cat([batch.valid, new_valid], 1)
    feats = target_features(out.hidden_states, d.config.target_layer_ids).to(d.fc.weight.dtype)
    nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)  # the token after each verified slot: draft, then bonus
    nxt[torch.arange(rows, device=dev), acc_t] = torch.tensor(bonuses, device=dev)
    d.extend_context(batch.ctx, feats, positions, next_tokens=nxt)
    batch.ctx_valid = torch.cat([batch.ctx_valid, new_valid], 1)
    for b, req in enumerate(active):
        for tok in drafts[b][:accepted[b]] + [bonuses[b]]:
            req.outputs.append(tok)
            if engine._done(req.outputs, 10 ** 9):
                break
        req.pos += accepted[b] + 1
        req.pending = bonuses[b]
    batch.compact()
    if costs is not None:
        engine._sync()
        costs.record(rows, k_max, t1 - t0, time.perf_counter() - t1, padded=rows * k_max - sum(map(len, drafts)),
                     context=int(starts.max()))
