"""The card's "Where the time goes" block: draft and verify milliseconds per step, the speedup the latency law
L = (T_draft + T_verify) / τ predicts beside the measured one, its ceiling, and (given a ``dsparkhub schedule``
report) the verification policies compared.

Reads results only: a results file's optional ``step_costs`` (:class:`~dsparkhub.verify.results.schema.
StepCostsRecord`, recorded by ``dsparkhub verify`` on the reference engine) and the JSON ``dsparkhub schedule --out``
writes (:data:`dsparkhub.verify.schedule.REPORT_FORMAT`, read by the caller). Does not measure or read files.
"""

from __future__ import annotations

from typing import Any

from dsparkhub.verify.results.schema import LawRow, StepCostsRecord

__all__ = ["time_context", "policies_context"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _law_line(r: LawRow) -> dict[str, str]:
    step = r.t_draft_s + r.t_verify_s
    measured = f"{r.measured:.2f}x" + (f" ({r.measured_spread[0]:.2f}-{r.measured_spread[1]:.2f})"
                                        if len(r.measured_spread) == 2 else "")
    return {"n": str(r.num_speculative_tokens), "concurrency": str(r.concurrency), "target": _ms(r.t_target_s),
            "draft": _ms(r.t_draft_s), "verify": _ms(r.t_verify_s),
            "draft_share": f"{r.t_draft_s / step:.0%}" if step > 0 else "-",
            "verify_ratio": f"{r.t_verify_s / r.t_target_s:.2f}x" if r.t_target_s > 0 else "-",
            "tau": f"{r.tau:.2f}", "predicted": f"{r.predicted:.2f}x ({r.spread[0]:.2f}-{r.spread[1]:.2f})",
            "ceiling": f"{r.ceiling:.2f}x", "measured": measured + (" ⚠" if r.flag else "")}


def _reading(law: list[LawRow]) -> list[str]:
    """Sentences a reader can act on: each flagged row explained, then what bounds the speedup."""
    out = []
    for r in law:
        at = f"n={r.num_speculative_tokens} at concurrency {r.concurrency}"
        if r.flag == "above ceiling":
            out.append(f"{at}: measured {r.measured:.2f}x is above the ceiling {r.ceiling:.2f}x ({r.note}).")
        elif r.flag == "shortfall":
            out.append(f"{at}: measured {r.measured:.2f}x falls short of the predicted {r.predicted:.2f}x; "
                       f"{r.note}.")
    if law:
        worst = min(law, key=lambda r: r.ceiling)
        n = worst.num_speculative_tokens
        step = worst.t_draft_s + worst.t_verify_s
        term = ("drafting" if worst.t_draft_s > worst.t_verify_s - worst.t_target_s else
                f"verifying {n + 1} tokens ({worst.t_verify_s / worst.t_target_s:.2f}x a target-alone step)")
        out.append(f"The lowest ceiling is {worst.ceiling:.2f}x (n={n}, concurrency {worst.concurrency}): even with "
                   f"every draft accepted a token costs {_ms(step / (n + 1))} ms against {_ms(worst.t_target_s)} ms "
                   f"for the target alone; most of the extra cost is {term}.")
    return out


def time_context(record: StepCostsRecord | None) -> dict[str, Any] | None:
    """The template context of one results file's "Where the time goes" block, or None without law rows.

    Returns:
        ``{source, rows: [{n, concurrency, target, draft, verify, draft_share, verify_ratio, tau, predicted,
        ceiling, measured}], reading: [sentences]}``; milliseconds per steady step as strings.
    """
    if record is None or not record.law:
        return None
    return {"source": record.source, "rows": [_law_line(r) for r in record.law], "reading": _reading(record.law)}


def policies_context(report, advice: str = "") -> dict[str, Any] | None:
    """The policies compared, from a ``dsparkhub schedule`` report (a :class:`~dsparkhub.verify.schedule.
    ScheduleReport`, e.g. :func:`~dsparkhub.verify.schedule.read_report`'s), or None without policy rows.

    Returns:
        ``{engine, hardware, gamma, rows: [{policy, confidences, concurrency, verified, wasted, saved, tau, speedup,
        lossless}], advice}``; speedup against the target alone at the row's concurrency.
    """
    if report is None or not report.policies:
        return None
    rows = []
    for p in report.policies:
        b = report.baseline_tokens_per_s.get(p.concurrency)
        rows.append({"policy": p.policy, "confidences": p.confidences, "concurrency": p.concurrency,
                     "verified": f"{p.verified:.2f}", "wasted": f"{p.wasted:.2f}", "saved": f"{p.saved:.2f}",
                     "tau": f"{p.tau:.2f}", "speedup": f"{p.tokens_per_s / b:.2f}x" if b else "-",
                     "lossless": "yes" if p.lossless else "NO"})
    return {"engine": report.engine, "hardware": report.hardware, "gamma": report.gamma, "rows": rows,
            "advice": advice}
