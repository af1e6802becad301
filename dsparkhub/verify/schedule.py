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
from dsparkhub.verify.results.table import law_table

__all__ = ["PolicyRow", "ScheduleReport", "run_schedule", "run_policies", "format_report", "schedule_release",
           "REPORT_FORMAT", "report_dict", "read_report", "advice"]

REPORT_FORMAT = "dsparkhub.schedule/1"
GAIN = 0.05  # a policy must beat static n by this share of tokens/s to be recommended


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


def advice(report: ScheduleReport) -> str:
    """One sentence a user can act on, from the policy rows: the confidence policy to serve with where it beats static
    n = γ by more than 5% of tokens/s (lossless rows only), else what the confidence head saves (the largest saving
    that keeps τ within 5% of static's, else the largest) and why it does not pay on this engine. Empty without
    policy rows."""
    if not report.policies:
        return ""
    rows = [r for r in report.policies if r.lossless]
    static = {r.concurrency: r for r in rows if r.policy == "static"}
    wins = []
    for c, st in sorted(static.items()):
        best = max((r for r in rows if r.concurrency == c and r.policy != "static"), key=lambda r: r.tokens_per_s,
                   default=None)
        if best is not None and st.tokens_per_s > 0 and best.tokens_per_s > (1 + GAIN) * st.tokens_per_s:
            wins.append((c, best, st))
    if wins:
        c, best, st = wins[0]
        conf = "" if best.confidences == "-" else f" with {best.confidences} confidences"
        return (f"From concurrency {c} on, serve with {best.policy}{conf} rather than a static n = {report.gamma}: it "
                f"verifies {best.verified:.2f} draft tokens per request-step instead of {st.verified:.2f} at τ "
                f"{best.tau:.2f} vs {st.tau:.2f}, {best.tokens_per_s / st.tokens_per_s:.2f}x the tokens/s "
                f"(measured on {report.engine}, {report.hardware}).")
    savers = [r for r in rows if r.policy != "static" and r.saved > 0 and r.concurrency in static]
    # the largest saving that keeps τ (within 5% of static's); else the largest saving at all
    kept = [r for r in savers if r.tau >= (1 - GAIN) * static[r.concurrency].tau]
    saving = max(kept or savers, key=lambda r: r.saved, default=None)
    if saving is None:
        return (f"No confidence policy beats a static n = {report.gamma} on {report.engine} ({report.hardware}): "
                "serve with static n.")
    st = static[saving.concurrency]
    conf = "" if saving.confidences == "-" else f" ({saving.confidences})"
    return (f"Serve with a static n = {report.gamma} on this engine: {saving.policy}{conf} saves {saving.saved:.2f} "
            f"of {report.gamma} verify tokens per request-step at concurrency {saving.concurrency} "
            f"(τ {saving.tau:.2f} vs {st.tau:.2f}) but no policy gains more than {GAIN:.0%} tokens/s here, where a "
            "verify token costs little; enable adaptive verification (vLLM) or the SPS scheduler (SGLang) only "
            "where verifying is the bottleneck (a busy GPU server).")


def report_dict(report: ScheduleReport) -> dict:
    """The report as JSON (``dsparkhub schedule --out``; the card's ``--schedule``): ``format``
    (:data:`REPORT_FORMAT`), ``engine``, ``hardware``, ``gamma``, ``law`` (LawRow fields), ``policies`` (PolicyRow
    fields), ``baseline_tokens_per_s`` ({concurrency: tokens/s}) and ``advice`` (:func:`advice`). The profile is
    not kept (it is the SPS table's business)."""
    from dataclasses import asdict

    return {"format": REPORT_FORMAT, "engine": report.engine, "hardware": report.hardware, "gamma": report.gamma,
            "law": [asdict(r) for r in report.law], "policies": [asdict(r) for r in report.policies],
            "baseline_tokens_per_s": {str(c): v for c, v in report.baseline_tokens_per_s.items()},
            "advice": advice(report)}


def read_report(path: str | Path) -> tuple[ScheduleReport, str]:
    """Read a ``dsparkhub schedule --out`` file, checking every key and type (pydantic, strict).

    Returns:
        ``(report, advice)`` (``report.profile`` is None).

    Raises:
        VerifyError: the file cannot be read, is not JSON, is not a schedule report of this format, or a key is
            missing or of the wrong type (the message names the key path).
    """
    import json

    from pydantic import TypeAdapter, ValidationError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerifyError(f"cannot read the schedule report: {exc}", path=path) from None
    if not isinstance(data, dict) or data.get("format") != REPORT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise VerifyError(f"not a `dsparkhub schedule --out` report: expected format {REPORT_FORMAT!r}, found "
                          f"{found!r}", path=path)
    kinds = {"engine": str, "hardware": str, "gamma": int, "law": list[LawRow], "policies": list[PolicyRow],
             "baseline_tokens_per_s": dict[str, float], "advice": str}
    got, problems = {}, []
    for key, kind in kinds.items():
        try:  # JSON mode: strict types, dataclasses from objects
            got[key] = TypeAdapter(kind).validate_json(json.dumps(data.get(key)), strict=True)
        except ValidationError as exc:
            problems += [".".join([key, *map(str, e["loc"])]) + f": {e['msg']}" for e in exc.errors()]
    if problems:
        raise VerifyError(f"the schedule report does not fit {REPORT_FORMAT}: " + "; ".join(problems[:5]), path=path)
    report = ScheduleReport(gamma=got["gamma"], law=got["law"], policies=got["policies"],
                            baseline_tokens_per_s={int(c): v for c, v in got["baseline_tokens_per_s"].items()},
                            engine=got["engine"], hardware=got["hardware"])
    return report, got["advice"]


def format_report(report: ScheduleReport) -> str:
    """The two tables as text: the latency law, then the policies, then :func:`advice`."""
    lines = [f"engine: {report.engine}; hardware: {report.hardware}; γ = {report.gamma}", ""]
    if report.law:
        lines += law_table(report.law) + [""]
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
        lines += ["", advice(report)]
    return "\n".join(lines)


def schedule_release(draft: str | Path, target: str | Path, *, datasets=None, max_prompts: int | None = None,
                     repeat_prompts: int = 1, sps_out: str | Path | None = None, write_sps: bool = True,
                     overwrite: bool = False, report_out: str | Path | None = None, sps_from: str = "reference",
                     warn=None,
                     **kwargs) -> tuple[ScheduleReport, Path | None]:
    """``dsparkhub schedule``: validate, read the prompts, :func:`run_schedule`, and write the SPS table beside the
    release (default ``DRAFT/dspark_sps_table.json``) from the profiled step costs.

    Args:
        draft: drafter folder (a DeepSpec run folder resolves to its step); target: HF folder with a tokenizer.
        datasets / max_prompts: as for ``verify``; repeat_prompts: run each prompt this many times (more steady
            steps at high concurrency).
        sps_out / write_sps / overwrite: where the SPS table goes, whether to write it, replace an existing one.
        sps_from: the SPS table's costs: ``reference`` (this run's profile), ``vllm-forward`` (``vllm bench
            forward`` on this node's GPU) or ``sglang=URL`` (SGLang's profiler against a running DSpark server);
            :func:`dsparkhub.verify.sps_table.engine_table`.
        report_out: also write the report as JSON here (:func:`report_dict`; the card's ``--schedule``); replaced
            only with ``overwrite`` and only when it is a schedule report.
        warn: called with each validation warning; kwargs: :func:`run_schedule`'s.

    Raises:
        OutputExistsError: the SPS table (or ``report_out``) exists and ``overwrite`` is False, or it is not a file
            of that kind dsparkhub wrote (checked before any model loads, :func:`dsparkhub.io.ownership.claim_output`).
        OutputNotWritableError: ``sps_out`` is named like a checkpoint's own file (``config.json``, ...).
        ValidationFailedError / PromptFileError / VerifyError: as for ``dsparkhub verify``.
    """
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.io.ownership import claim_output
    from dsparkhub.verify.prompts import load_datasets
    from dsparkhub.verify.runner import _validate
    from dsparkhub.verify.sps_table import SPS_FILE, build_table, check_source, engine_table, write_table

    draft = resolve_step_dir(draft) if Path(draft).is_dir() else Path(draft)
    out = (Path(sps_out) if sps_out is not None else draft / SPS_FILE) if write_sps else None
    if out is not None:  # before any model loads: never over a drafter's own file, an existing table only if ours
        claim_output(out, overwrite=overwrite, kind="sps_table")
    if report_out is not None:
        claim_output(report_out, overwrite=overwrite, kind="schedule")
    if repeat_prompts < 1:
        raise VerifyError(f"repeat_prompts must be >= 1, found {repeat_prompts}")
    check_source(sps_from)
    gamma = open_draft(draft).spec.block_size
    _validate(draft, target, gamma, warn, engine="reference")
    prompts = [p for ds in load_datasets(datasets, target, max_prompts=max_prompts) for p in ds.prompts]
    report = run_schedule(draft, target, prompts * repeat_prompts, **kwargs)
    if report_out is not None:
        from dsparkhub.io.output import replace_json

        replace_json(report_out, report_dict(report))
    if out is None:
        return report, None
    requests = sorted({r for r, _ in report.profile.samples})
    if sps_from != "reference":  # a serving engine's own costs, labelled with it
        table = engine_table(sps_from, draft=draft, target=target, n=report.gamma, requests=requests,
                             context=report.profile_context)
        return report, write_table(table, out, overwrite=overwrite)
    tokens, sps = report.profile.sps_probes()
    table = build_table(tokens, sps, engine=report.engine, hardware=report.hardware,
                        source=f"dsparkhub schedule profile: synthetic steps of {requests} requests x verify widths "
                               f"0..{report.gamma}, {report.profile_context}-token context, median of "
                               f"{PROFILE_REPLAYS} replays")
    return report, write_table(table, out, overwrite=overwrite)
