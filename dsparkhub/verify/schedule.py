"""``dsparkhub schedule``: where the time goes for a drafter on the machine at hand — the latency law measured, and
what confidence-scheduled verification saves — on the reference engine.

One call (:func:`run_schedule`) on one engine (target + drafter loaded once):

1. *profile* (when a ``budget`` / ``sps`` policy runs or an SPS table is asked for): synthetic steps of every shape
   (requests x verify width 0 .. γ), :func:`dsparkhub.verify.costs.profile_costs`, the start-up profile vLLM 0.34's
   adaptive verification runs; its costs size the budgets and make the SPS table.
2. *target alone* at every concurrency (the baseline: outputs for the lossless check, tokens/s, T_target per step).
3. *latency law*: static n for every n x concurrency asked (``law_ns`` x ``law_concurrencies``), recording T_draft
   and T_verify per step shape; predicted vs measured speedup (:func:`dsparkhub.verify.costs.latency_law`).
4. *policies* at n = γ for every concurrency: each policy with raw confidences and, given an STS sidecar, with
   calibrated ones; per row verified and wasted (rejected) draft tokens per request-step, padded slots, τ, tokens/s,
   and whether the output equals the target alone (greedy).

Counting: a request-step is one request in one verify step; it counts as a draft even when a budget gave it width
0 (τ then counts 1 for it), so τ is output tokens per request-step across policies. Wasted = verified - accepted.

Not here: vLLM / SGLang backends (their schedulers run inside those engines; ``verify --adaptive-verification``), the
card, sampling (greedy only: the lossless check is exact equality).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsparkhub.errors import VerifyError
from dsparkhub.verify.costs import PROFILE_REPLAYS, LawRow, StepCosts, latency_law, profile_costs
from dsparkhub.verify.reference.policies import Policy, Scheduler, read_temperatures

__all__ = ["PolicyRow", "ScheduleReport", "run_schedule", "run_policies", "format_report", "schedule_release"]


@dataclass
class PolicyRow:
    """One policy at one concurrency.

    Attributes:
        policy: label (``static``, ``threshold:0.5``, ``budget``, ``sps``); confidences: ``raw``, ``sts`` or ``-``;
        concurrency; request_steps: verify steps summed over requests; verified / wasted: draft tokens verified /
        rejected per request-step; padded: padding slots per request-step (rows shorter than the batch's widest);
        tau; tokens_per_s; saved: verify tokens saved per request-step vs static γ; lossless: output == target alone.
    """

    policy: str
    confidences: str
    concurrency: int
    request_steps: int
    verified: float
    wasted: float
    padded: float
    tau: float
    tokens_per_s: float
    saved: float
    lossless: bool


@dataclass
class ScheduleReport:
    """What :func:`run_schedule` measured (rows in run order), the profile and the labels of where it ran."""

    gamma: int
    law: list[LawRow] = field(default_factory=list)
    policies: list[PolicyRow] = field(default_factory=list)
    baseline_tokens_per_s: dict[int, float] = field(default_factory=dict)
    profile: StepCosts | None = None
    engine: str = ""
    hardware: str = ""
    profile_context: int = 0


def run_policies(engine, prompts: list[list[int]], *, n: int, concurrency: int, policies: list[Policy],
                 temperatures: list[float] | None, costs: StepCosts | None, baseline: list[list[int]],
                 max_new_tokens: int) -> list[PolicyRow]:
    """Run each policy (raw confidences, then STS-calibrated ones when ``temperatures`` is given) at one
    concurrency on ``engine`` (a :class:`~dsparkhub.verify.reference.engine.ReferenceEngine`) and compare with
    ``baseline`` (the target alone's outputs, same prompts).

    Raises:
        VerifyError: a confidence policy on a drafter without a confidence head; a budget policy without ``costs``.
    """
    rows = []
    for pol in policies:
        if pol.needs_confidence and engine.drafter.confidence_head is None:
            raise VerifyError(f"policy {pol.label} reads the confidence head, but the drafter has none "
                              "(enable_confidence_head and confidence_head.* tensors)")
        variants = [("-", None)] if not pol.needs_confidence else \
            [("raw", None)] + ([("sts", temperatures)] if temperatures is not None else [])
        for label, temps in variants:
            engine.scheduler = Scheduler(pol, n, temperatures=temps, costs=costs)
            engine.step_costs = StepCosts()
            try:
                stats = engine.run(prompts, num_speculative_tokens=n, max_new_tokens=max_new_tokens,
                                   concurrency=concurrency)
                padded = engine.step_costs.padded
            finally:
                engine.scheduler = engine.step_costs = None
            steps = stats.num_drafts or 1
            verified = stats.num_draft_tokens / steps
            rows.append(PolicyRow(pol.label, label, concurrency, stats.num_drafts, verified,
                                  (stats.num_draft_tokens - stats.num_accepted_tokens) / steps, padded / steps,
                                  stats.tau or 1.0, stats.tokens_per_s, n - verified, stats.outputs == baseline))
    return rows


def run_schedule(draft: str | Path, target: str | Path, prompts: list[list[int]], *, policies: list[Policy],
                 concurrencies: list[int], law_ns: list[int], law_concurrencies: list[int], sts: str | Path | None,
                 max_new_tokens: int = 64, device: str = "cpu", ignore_eos: bool = True,
                 profile_context: int | None = None, progress=None) -> ScheduleReport:
    """Measure the latency law and the policies (module docstring) for ``draft`` against ``target``.

    Args:
        draft / target: folders (or a loaded target model); prompts: token ids.
        policies: :func:`~dsparkhub.verify.reference.policies.parse_policies` output, run at n = γ (block size).
        concurrencies: for the policies; law_ns / law_concurrencies: static n x concurrency for the law (may be
            empty).
        sts: an STS sidecar (``dsparkhub calibrate``) for calibrated confidences, or None.
        max_new_tokens: per prompt; ignore_eos: generate exactly that many (steady shapes; default).
        profile_context: context tokens of the profile (default: mean prompt length + max_new_tokens / 2).
        progress: called with a line of text before each run.

    Raises:
        VerifyError: no prompts, a confidence policy for a drafter without a confidence head, a law n above γ, an STS
            sidecar that does not fit γ, or what the engine raises.
    """
    from dsparkhub.verify.reference.engine import ReferenceEngine

    if not prompts:
        raise VerifyError("no prompts to run")
    say = progress or (lambda _: None)
    engine = ReferenceEngine(target, draft, device=device, ignore_eos=ignore_eos)
    try:
        cfg = engine.drafter.config
        gamma = int(cfg.block_size or max(law_ns or [1]))
        needs = [p.label for p in policies if p.needs_confidence]
        if needs and engine.drafter.confidence_head is None:
            raise VerifyError(f"policies {', '.join(needs)} read the confidence head, but the drafter has none "
                              "(enable_confidence_head and confidence_head.* tensors)", path=draft,
                              hint="run --policy static, or a DSpark drafter trained with a confidence head")
        if any(n > gamma or n < 1 for n in law_ns):
            raise VerifyError(f"latency-law n must be in 1 .. {gamma} (the block size), found {law_ns}")
        temps = read_temperatures(sts, gamma) if sts is not None else None
        report = ScheduleReport(gamma=gamma, engine=f"reference ({engine.version})", hardware=engine.device)
        requests = sorted(set(concurrencies) | set(law_concurrencies))
        ctx = profile_context or int(sum(map(len, prompts)) / len(prompts) + max_new_tokens / 2)
        say(f"profile: {requests} requests x widths 0..{gamma}, context {ctx}")
        report.profile = profile_costs(engine, n=gamma, requests=requests, context=ctx)
        report.profile_context = ctx
        base: dict[int, tuple] = {}
        for c in sorted(set(concurrencies) | set(law_concurrencies)):
            say(f"target alone, concurrency {c}")
            engine.step_costs = StepCosts()
            stats = engine.run(prompts, num_speculative_tokens=None, max_new_tokens=max_new_tokens, concurrency=c)
            base[c] = (engine.step_costs, stats)
            engine.step_costs = None
            report.baseline_tokens_per_s[c] = stats.tokens_per_s
        for c in law_concurrencies:
            for n in law_ns:
                say(f"static n={n}, concurrency {c}")
                engine.step_costs = StepCosts()
                stats = engine.run(prompts, num_speculative_tokens=n, max_new_tokens=max_new_tokens, concurrency=c)
                costs, engine.step_costs = engine.step_costs, None
                report.law.append(latency_law(n=n, concurrency=c, base_costs=base[c][0], spec_costs=costs,
                                              base_stats=base[c][1], spec_stats=stats))
        for c in concurrencies:
            say(f"policies at n={gamma}, concurrency {c}")
            report.policies += run_policies(engine, prompts, n=gamma, concurrency=c, policies=policies,
                                            temperatures=temps, costs=report.profile, baseline=base[c][1].outputs,
                                            max_new_tokens=max_new_tokens)
    finally:
        engine.close()
    return report


def format_report(report: ScheduleReport) -> str:
    """The two tables as text: the latency law, then the policies."""
    lines = [f"engine: {report.engine}; hardware: {report.hardware}; γ = {report.gamma}", ""]
    if report.law:
        lines.append("latency law  L = (T_draft + T_verify) / τ  vs the target alone (ms per step)")
        lines.append(f"{'n':>3} {'conc':>4} {'T_target':>8} {'T_draft':>8} {'T_verify':>8} {'τ':>5} "
                     f"{'predicted':>9} {'(spread)':>13} {'ceiling':>7} {'measured':>8}  note")
        for r in report.law:
            note = f"{r.flag}: {r.note}" if r.flag else ""
            lines.append(f"{r.n:>3} {r.concurrency:>4} {r.t_target_s * 1e3:>8.2f} {r.t_draft_s * 1e3:>8.2f} "
                         f"{r.t_verify_s * 1e3:>8.2f} {r.tau:>5.2f} {r.predicted:>8.2f}x {_spread(r.spread):>13} "
                         f"{r.ceiling:>6.2f}x "
                         f"{r.measured:>7.2f}x  {note}".rstrip())
        lines.append("")
    if report.policies:
        lines.append(f"policies at n = {report.gamma} (per request-step: draft tokens verified, rejected, padding; "
                     "saved = verify tokens saved vs static)")
        lines.append(f"{'policy':<15} {'conf':<4} {'conc':>4} {'verified':>8} {'wasted':>6} {'padded':>6} "
                     f"{'saved':>5} {'τ':>5} {'tok/s':>8} {'vs target':>9}  lossless")
        for r in report.policies:
            base = report.baseline_tokens_per_s.get(r.concurrency) or 0.0
            ratio = f"{r.tokens_per_s / base:.2f}x" if base else "-"
            lines.append(f"{r.policy:<15} {r.confidences:<4} {r.concurrency:>4} {r.verified:>8.2f} {r.wasted:>6.2f} "
                         f"{r.padded:>6.2f} {r.saved:>5.2f} {r.tau:>5.2f} {r.tokens_per_s:>8.1f} {ratio:>9}  "
                         f"{'yes' if r.lossless else 'NO'}")
    return "\n".join(lines)




def _spread(lo_hi: tuple[float, float]) -> str:
    return f"({lo_hi[0]:.2f}-{lo_hi[1]:.2f})"

def schedule_release(draft: str | Path, target: str | Path, *, datasets=None, max_prompts: int | None = None,
                     repeat_prompts: int = 1, sps_out: str | Path | None = None, write_sps: bool = True,
                     overwrite: bool = False, warn=None, **kwargs) -> tuple[ScheduleReport, Path | None]:
    """``dsparkhub schedule``: validate, read the prompts, :func:`run_schedule`, and write the SPS table beside the
    release (default ``DRAFT/dspark_sps_table.json``) from the profiled step costs.

    Args:
        draft: drafter folder (a DeepSpec run folder resolves to its step); target: HF folder with a tokenizer.
        datasets / max_prompts: as for ``verify``; repeat_prompts: run each prompt this many times (more steady
            steps at high concurrency).
        sps_out / write_sps / overwrite: where the SPS table goes, whether to write it, replace an existing one.
        warn: called with each validation warning; kwargs: :func:`run_schedule`'s.

    Raises:
        OutputExistsError: the SPS table exists and ``overwrite`` is False, or it is not a table dsparkhub wrote
            (checked before any model loads, :func:`dsparkhub.io.ownership.claim_output`).
        OutputNotWritableError: ``sps_out`` is named like a checkpoint's own file (``config.json``, ...).
        ValidationFailedError / PromptFileError / VerifyError: as for ``dsparkhub verify``.
    """
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.io.ownership import claim_output
    from dsparkhub.verify.prompts import load_datasets
    from dsparkhub.verify.runner import _validate
    from dsparkhub.verify.sps_table import SPS_FILE, build_table, write_table

    draft = resolve_step_dir(draft) if Path(draft).is_dir() else Path(draft)
    out = (Path(sps_out) if sps_out is not None else draft / SPS_FILE) if write_sps else None
    if out is not None:  # before any model loads: never over a drafter's own file, an existing table only if ours
        claim_output(out, overwrite=overwrite, kind="sps_table")
    if repeat_prompts < 1:
        raise VerifyError(f"repeat_prompts must be >= 1, found {repeat_prompts}")
    gamma = open_draft(draft).spec.block_size
    _validate(draft, target, gamma, warn, engine="reference")
    prompts = [p for ds in load_datasets(datasets, target, max_prompts=max_prompts) for p in ds.prompts]
    report = run_schedule(draft, target, prompts * repeat_prompts, **kwargs)
    if out is None:
        return report, None
    tokens, sps = report.profile.sps_probes()
    requests = sorted({r for r, _ in report.profile.samples})
    table = build_table(tokens, sps, engine=report.engine, hardware=report.hardware,
                        source=f"dsparkhub schedule profile: synthetic steps of {requests} requests x verify widths "
                               f"0..{report.gamma}, {report.profile_context}-token context, median of "
                               f"{PROFILE_REPLAYS} replays")
    return report, write_table(table, out, overwrite=overwrite)
