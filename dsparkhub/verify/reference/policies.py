"""Confidence-scheduled verification for the reference engine: how many of a request's n drafts one step verifies.

A *policy* turns the drafted block's raw confidence-head logits ``c`` [R, n] (R requests of the batch, n drafted
positions each) into a verify width ``k_r`` per request (0 <= k_r <= n); the engine then verifies
``[anchor, d_1 .. d_k]`` for each request. Every policy is lossless: it only chooses *how many* drafts the target
checks, never what is accepted. Confidences are ``sigmoid(c_i / T_i)`` with per-position STS temperatures ``T_i``
(SGLang 0.5.23 ``srt/models/dspark.py`` ``DSparkConfidenceHead.apply_sts``; T = 1 is the raw head, as vLLM 0.34
uses it), and the *survival* ``S_i = prod_{j <= i} sigmoid(c_j / T_j)`` is the predicted probability that the first
i + 1 drafts are all accepted.

Policies (``parse_policies`` reads ``static,threshold:0.5,budget,sps``):

- ``static``: verify all n (the width ``num_speculative_tokens`` sets in every engine).
- ``threshold:t``: verify positions while the survival stays >= t, at least one (DeepSeek's sweep; the reference
  engine's ``confidence_threshold``).
- ``budget``: vLLM 0.34 adaptive verification (``v1/worker/gpu/spec_decode/adaptive_verification.py``):
  ``get_num_tokens`` picks the draft budget b maximising ``(R + sum of the b best survivals) / (draft_cost[R] +
  verify_cost[R + b])`` over b = 0 .. R·n, the costs read from step-cost tables built by
  ``build_cost_tables_from_curves`` (ported in :func:`cost_table`, no CUDA graphs on this engine, so
  ``cudagraph_limit`` 0); ``assign_draft_token_budget`` then admits the b globally best (request, position) slots,
  capped per request at its n drafts, ties handed out in request order.
- ``sps``: SGLang 0.5.23's scheduler (``dspark_planner.py`` ``compute_verify_token_budget`` and
  ``kernels/ops/speculative/dspark/dspark_schedule.py`` ``schedule_verify_lens_topk_from_survival``): b maximises
  ``(R + sum of the b best survivals) · SPS(R + b)``, SPS the steps per second of its ``SpsCostTable`` looked up at the
  probe at or below R + b (floor, not interpolated); survivals below ``survival_eps`` 1e-6 are never admitted; ties
  go by position, then request.

Where upstream differs and this engine does not follow: vLLM and SGLang size the budget from the *previous* step's
confidences (they overlap scheduling with the forward; SGLang's ``_two_steps_prior_survival``, vLLM's
``_stale_confidences``) and choose the slots with the current ones; the reference engine has no overlap and uses
the current step's confidences for both. It also pads every row to the widest one (one dense target forward), so a
step costs ``R · (max k + 1)`` tokens where vLLM and SGLang pay ``R + b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dsparkhub.errors import VerifyError

__all__ = ["Policy", "parse_policies", "survival", "read_temperatures", "cost_table", "topk_widths",
           "vllm_budget", "sglang_budget"]

SURVIVAL_EPS = 1e-6  # SGLang 0.5.23 DSparkScheduleConfig.survival_eps
KINDS = ("static", "threshold", "budget", "sps")


@dataclass(frozen=True)
class Policy:
    """One verification policy.

    Attributes:
        kind: ``static`` | ``threshold`` | ``budget`` | ``sps``.
        threshold: the survival threshold in [0, 1] (``threshold`` only).
    """

    kind: str
    threshold: float | None = None

    @property
    def label(self) -> str:
        """``static``, ``threshold:0.5``, ``budget``, ``sps`` (what :func:`parse_policies` reads back)."""
        return f"threshold:{self.threshold:g}" if self.kind == "threshold" else self.kind

    @property
    def needs_confidence(self) -> bool:
        """Whether the policy reads the confidence head (all but ``static``)."""
        return self.kind != "static"

    @property
    def needs_costs(self) -> bool:
        """Whether the policy sizes a budget from measured step costs (``budget``, ``sps``)."""
        return self.kind in ("budget", "sps")


def parse_policies(text: str) -> list[Policy]:
    """``"static,threshold:0.5,budget,sps"`` -> policies, in order.

    Raises:
        VerifyError: an unknown policy name, a threshold that is missing, not a number or outside [0, 1], an
            argument on a policy that takes none, or a policy given twice.
    """
    out: list[Policy] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        name, _, arg = item.partition(":")
        if name not in KINDS:
            raise VerifyError(f"unknown verification policy {name!r} in {text!r}; expected one of {', '.join(KINDS)} "
                              "(threshold as threshold:T)")
        if name == "threshold":
            try:
                t = float(arg)
            except ValueError:
                raise VerifyError(f"policy {item!r}: expected threshold:T with T a number in [0, 1], "
                                  f"found {arg!r}") from None
            if not 0.0 <= t <= 1.0:
                raise VerifyError(f"policy {item!r}: the threshold must be in [0, 1], found {t:g}")
            pol = Policy("threshold", t)
        elif arg:
            raise VerifyError(f"policy {item!r}: {name} takes no argument")
        else:
            pol = Policy(name)
        if pol in out:
            raise VerifyError(f"policy {pol.label!r} given twice in {text!r}")
        out.append(pol)
    if not out:
        raise VerifyError(f"no verification policy in {text!r}; expected e.g. static,threshold:0.5,budget")
    return out


def read_temperatures(path: str | Path, n: int) -> list[float]:
    """The per-position STS temperatures of a sidecar (``dsparkhub calibrate`` / SGLang's ``dspark_sts_fit.py``),
    checked as SGLang checks them (``DSparkStsCalibration.__post_init__`` and ``dspark_planner.py`` lines 107-113:
    all > 0, exactly γ of them).

    Args:
        path: the JSON sidecar (``temperatures`` [γ]).
        n: the drafted positions the run verifies (γ; a shorter n uses the first n temperatures, as positions
            beyond n are never drafted).

    Raises:
        VerifyError: not JSON, no ``temperatures`` list, a temperature <= 0 or not a number, or fewer than n.
    """
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerifyError(f"cannot read the STS sidecar ({exc})", path=path) from None
    temps = data.get("temperatures") if isinstance(data, dict) else None
    if not isinstance(temps, list) or not temps:
        raise VerifyError("the STS sidecar has no 'temperatures' list (expected [γ] positive floats, as "
                          "`dsparkhub calibrate` writes)", path=path)
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 and math.isfinite(t)
               for t in temps):
        raise VerifyError(f"STS temperatures must all be finite numbers > 0, found {temps}", path=path)
    if len(temps) < n:
        raise VerifyError(f"the STS sidecar has {len(temps)} temperatures but the run drafts {n} positions",
                          path=path, hint="refit it with `dsparkhub calibrate` at this drafter's block size")
    return [float(t) for t in temps[:n]]


def survival(logits: torch.Tensor, temperatures: list[float] | None = None) -> torch.Tensor:
    """Survival ``cumprod(sigmoid(logits / T))`` along positions: [R, n] float -> [R, n] float64."""
    x = logits.to(torch.float64)
    if temperatures is not None:
        x = x / torch.tensor(temperatures[:x.shape[1]], dtype=torch.float64, device=x.device)
    return torch.cumprod(torch.sigmoid(x), dim=1)


def cost_table(curve: list[tuple[int, float]], limit: int) -> np.ndarray:
    """Cost at every size 0 .. ``limit`` from measured ``(size, seconds)`` samples: vLLM 0.34
    ``build_cost_tables_from_curves.build_table`` with ``cudagraph_limit`` 0 — costs made non-decreasing, a size
    priced at the next profiled size at or above it, sizes past the last sample extrapolated on the last slope.

    Raises:
        VerifyError: an empty curve.
    """
    if not curve:
        raise VerifyError("no measured step costs to build a cost table from")
    xs, ys = np.asarray(sorted(curve), dtype=np.float64).T
    ys = np.maximum.accumulate(ys)
    values = np.arange(limit + 1)
    result = ys[np.minimum(np.searchsorted(xs, values, side="left"), len(xs) - 1)]
    if len(xs) > 1:
        after = values > xs[-1]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        result[after] = ys[-1] + slope * (values[after] - xs[-1])
    return result


def vllm_budget(surv: torch.Tensor, draft_cost: float, verify_cost: np.ndarray) -> int:
    """vLLM 0.34 ``AdaptiveVerificationManager.get_num_tokens``: the draft budget b (0 .. R·n) maximising expected
    tokens ``R + sum(best b survivals)`` per predicted step seconds ``draft_cost + verify_cost[R + b]``.

    Args:
        surv: [R, n] survival; draft_cost: seconds of drafting R requests; verify_cost: seconds per verified-token
            count (index = tokens), at least R·(n + 1) + 1 entries (:func:`cost_table`).
    """
    rows = surv.shape[0]
    scores = np.sort(surv.reshape(-1).cpu().numpy())[::-1]
    expected = np.concatenate(([rows], rows + np.cumsum(scores)))
    costs = draft_cost + verify_cost[rows:rows + len(scores) + 1]
    return int(np.argmax(expected / costs))


def sglang_budget(surv: torch.Tensor, probes: list[int], steps_per_sec: list[float]) -> int:
    """SGLang 0.5.23 ``compute_verify_token_budget`` over an ``SpsCostTable`` (``probes`` = sample_batch_tokens,
    strictly increasing): b maximising ``(R + sum(best b survivals >= 1e-6)) · SPS(floor probe of R + b)``."""
    rows = surv.shape[0]
    cand = surv.reshape(-1).cpu().to(torch.float64)
    cand = torch.sort(cand[cand >= SURVIVAL_EPS], descending=True).values
    tau = rows + torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(cand, 0)])
    tokens = rows + torch.arange(tau.numel(), dtype=torch.int64)
    idx = (torch.bucketize(tokens, torch.tensor(probes, dtype=torch.int64), right=True) - 1).clamp_(0, len(probes) - 1)
    theta = tau * torch.tensor(steps_per_sec, dtype=torch.float64)[idx]
    return int(torch.argmax(theta))


def topk_widths(surv: torch.Tensor, budget: int, *, ties: str = "request") -> list[int]:
    """Admit the ``budget`` globally best (request, position) slots by survival; the widths per request.

    Survival never rises along a request, so the winners are a prefix of each request's drafts (vLLM's
    ``assign_draft_token_budget`` docstring); ties go to earlier requests (``ties="request"``, vLLM) or to earlier
    positions, then requests (``ties="position"``, SGLang's ``_value_independent_descending_order``; SGLang also
    never admits a survival below 1e-6).

    Returns:
        k per request, 0 <= k <= n, summing to at most ``budget``.
    """
    rows, n = surv.shape
    s = surv.cpu().to(torch.float64).numpy()
    req, pos = np.meshgrid(np.arange(rows), np.arange(n), indexing="ij")
    keys = (req.ravel(), pos.ravel(), -s.ravel()) if ties == "position" else (pos.ravel(), req.ravel(), -s.ravel())
    order = np.lexsort(keys)  # last key primary: best survival first, then the tie rule
    if ties == "position":
        order = order[s.ravel()[order] >= SURVIVAL_EPS]
    widths = np.zeros(rows, dtype=np.int64)
    np.add.at(widths, req.ravel()[order[:max(0, budget)]], 1)
    return widths.tolist()


class Scheduler:
    """A policy bound to a run: the verify widths for each step's confidences.

    Args:
        policy: the :class:`Policy`.
        n: drafted positions per step.
        temperatures: STS temperatures [>= n] or None (raw confidences).
        costs: for ``budget`` / ``sps``: an object with ``draft_curve()`` -> [(requests, seconds)],
            ``verify_curve()`` -> [(tokens, seconds)] and ``sps_probes()`` -> ([tokens], [steps/s]) (see
            :class:`dsparkhub.verify.costs.StepCosts`).

    Raises:
        VerifyError: a budget policy without costs.
    """

    def __init__(self, policy: Policy, n: int, *, temperatures: list[float] | None = None, costs=None):
        if policy.needs_costs and costs is None:
            raise VerifyError(f"policy {policy.label} needs measured step costs (a profile of the engine)")
        self.policy, self.n, self.temperatures = policy, n, temperatures
        if policy.kind == "budget":
            self._draft_curve, self._verify_curve = costs.draft_curve(), costs.verify_curve()
        if policy.kind == "sps":
            self._probes, self._sps = costs.sps_probes()

    def widths(self, logits: torch.Tensor) -> list[int]:
        """Verify width per request from the raw confidence logits [R, n]."""
        rows, n = logits.shape
        kind = self.policy.kind
        if kind == "static":
            return [n] * rows
        surv = survival(logits, self.temperatures)
        if kind == "threshold":
            keep = (surv >= self.policy.threshold).to(torch.int64).cumprod(1).sum(1)
            return keep.clamp(min=1).tolist()
        if kind == "budget":
            draft = cost_table(self._draft_curve, rows)[rows]
            verify = cost_table(self._verify_curve, rows * (n + 1))
            budget = vllm_budget(surv, float(draft), verify)
            return topk_widths(surv, budget, ties="request")
        budget = sglang_budget(surv, self._probes, self._sps)
        return topk_widths(surv, budget, ties="position")
