"""``dsparkhub calibrate``: fit the confidence head's per-position temperatures on a release's own verification and
write the SGLang sidecar ``dspark_sts.json`` next to the drafter, with its reliability report and threshold sweep.

Order of a run (each step fails before the next, more expensive, one starts):

1. the drafter must be a DSpark drafter with a confidence head (headers only; :class:`CalibrationError` otherwise)
   whose block proposes γ = ``block_size`` tokens (SGLang 0.5.23 takes γ from ``block_size``:
   ``srt/speculative/dspark_components/dspark_config.py`` lines 295-297, and refuses a table of another length:
   ``dspark_planner.py`` lines 107-113);
2. ``dsparkhub.validate`` against the target at n = γ; datasets read and tokenized;
3. the reference engine verifies every prompt at full width γ (greedy by default), recording per step the raw
   confidence logits, the accepted count and the verified width (:class:`~dsparkhub.verify.calibration.
   ConfidenceRecorder`);
4. the steps are split by prompt into a fit and a held-out split; temperatures are fitted on the fit split
   (:func:`~dsparkhub.verify.calibration.fit_sts`) and everything reported is measured on the held-out split;
5. the sidecar is written atomically (temp file + rename); an existing one is replaced only with ``overwrite`` and
   only when it is a sidecar (never a drafter's own file: :func:`dsparkhub.io.ownership.claim_output`).

Sidecar keys. SGLang's (``DSparkStsCalibration``, ``dspark_sts.py`` lines 9-14; its msgspec decoder ignores other
keys): ``temperatures`` [γ] (> 0), ``dataset`` (dataset names, comma-separated), ``num_samples`` (fit steps),
``ece_before`` / ``ece_after`` [γ] (held-out ECE at T = 1 / fitted; SGLang's own fitter writes fit-data ECE).
dsparkhub's: ``format`` (``dsparkhub.sts/1``), ``gamma``, ``num_bins``, ``positions`` (per position: temperature,
fit samples / accepted, ``pooled`` reason or null, and the held-out ``samples, accepted, acceptance,
confidence_before/after, ece_*, brier_*, auroc_*``), ``per_dataset`` ({name: the same held-out rows}), ``fit``
(fit-split ECE before / after, settings: ``refine``, ``min_samples``, ``min_class``), ``split`` (unit prompt,
fraction, seed, prompt and step counts per dataset), ``reliability`` (held-out bins over all positions: ``before`` /
``after`` each ``edges, count, confidence, accuracy``), ``sweep`` ({``raw`` | ``calibrated``: {dataset | ``all``:
rows of :func:`~dsparkhub.verify.calibration.threshold_sweep`}}) and ``provenance`` (drafter path and fingerprint,
target and its header fingerprint, engine, settings, dsparkhub version, date).

It does not render the card (``dsparkhub.card`` reads :func:`card_context`) or upload (``push`` ships the file like
any other in the folder).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from dsparkhub import __version__
from dsparkhub.errors import DsparkhubError, ResultsError
from dsparkhub.io.output import replace_json
from dsparkhub.io.ownership import claim_output
from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.io.hashing import checkpoint_fingerprint, target_fingerprint
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate.sidecar import STS_FILE, sidecar_problems
from dsparkhub.prompts.datasets import load_datasets
from dsparkhub.verify.engines import check_torch_device
from dsparkhub.verify.runner import _validate

FORMAT = "dsparkhub.sts/1"
PLOT_FILE = "assets/confidence_reliability.png"


class CalibrationError(DsparkhubError, ValueError):
    """The drafter cannot be calibrated (no confidence head, wrong block layout, too little data) or a sidecar is
    unreadable."""


# ---- the sidecar ------------------------------------------------------------------------------------------


def read_sidecar(path: str | Path) -> dict:
    """Read and check a sidecar as SGLang would.

    Raises:
        CalibrationError: not JSON, or a check of :func:`sidecar_problems` fails (every problem listed).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"not valid JSON ({exc})", path=path) from None
    problems = sidecar_problems(data)
    if problems:
        raise CalibrationError("SGLang's reader would refuse it: " + "; ".join(problems), path=path)
    return data


def write_sidecar(data: dict, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``data`` as JSON atomically (temp file in the same folder, then rename).

    Raises:
        OutputExistsError / OutputNotWritableError: ``path`` exists and ``overwrite`` is False, or is not a sidecar
            (a drafter's ``config.json``, ...), or cannot be written (:func:`dsparkhub.io.ownership.claim_output`).
        CalibrationError: ``data`` would not load in SGLang (see :func:`sidecar_problems`).
    """
    path = Path(path)
    claim_output(path, overwrite=overwrite, kind="sidecar")
    problems = sidecar_problems(data)
    if problems:
        raise CalibrationError("refusing to write a sidecar SGLang cannot read: " + "; ".join(problems), path=path)
    return replace_json(path, data)


# ---- a run ----------------------------------------------------------------------------------------------------


def check_drafter(draft: str | Path):
    """The opened drafter and its γ, or a refusal naming what is missing (headers only).

    Raises:
        CalibrationError: not a DSpark drafter, no confidence head declared or its tensors absent, or a block that
            does not propose ``block_size`` tokens (1+N: SGLang's γ would not match the positions drafted).
    """
    d = open_draft(draft)
    spec = d.spec
    head = {"confidence_head.proj.weight", "confidence_head.proj.bias"} & set(spec.tensors)
    if spec.variant != "dspark" or not spec.confidence_head or "confidence_head.proj.weight" not in head:
        found = (f"a {spec.variant} drafter" if spec.variant != "dspark" else
                 "enable_confidence_head is false" if not spec.confidence_head else
                 "no confidence_head.proj.weight tensor")
        raise CalibrationError(f"the drafter has no confidence head to calibrate ({found})", path=draft,
                               hint="STS calibrates a DSpark confidence head (enable_confidence_head: true and "
                                    "confidence_head.proj.* tensors); without one there is nothing to calibrate")
    if spec.proposals_per_block != spec.block_size:
        raise CalibrationError(f"the drafter's {spec.block_layout} block proposes {spec.proposals_per_block} tokens, "
                               f"but SGLang's γ is block_size {spec.block_size}", path=draft,
                               hint="SGLang serves DSpark anchor-first; convert with --declare-block-layout "
                                    "anchor_first if that is how it was trained")
    return d, spec.block_size


def run_calibration(draft: str | Path, target: str | Path, *, datasets=None, max_prompts: int | None = None,
                    max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0, fit_fraction: float = 0.5,
                    min_samples: int = 100, min_class: int = 10, refine: bool = False, device: str | None = None,
                    out: str | Path | None = None, overwrite: bool = False, progress: bool = True,
                    tokenizer=None, warn=None) -> tuple[dict, Path]:
    """Record, fit, report and write the sidecar (order in the module docstring).

    Args:
        draft: drafter folder (a DeepSpec run folder is followed to its ``step_latest``).
        target: target HF folder (with tokenizer, or token-id prompts).
        datasets / max_prompts / tokenizer: as for ``dsparkhub verify``.
        max_new_tokens / temperature / seed: generation settings (greedy by default, as SGLang's collector).
        fit_fraction / seed: the prompt split; min_samples / min_class / refine: see ``calibration.fit_sts``.
        device: reference engine device. warn: called with each validation warning line.
        out: sidecar path (default ``DRAFT/dspark_sts.json``); ``overwrite`` replaces an existing one.

    Returns:
        ``(sidecar dict, path written)``.

    Raises:
        CalibrationError: see :func:`check_drafter`; a dataset with fewer than 2 prompts with verify steps.
        OutputExistsError / OutputNotWritableError: see :func:`write_sidecar` (checked before any model loads).
        ValidationFailedError / PromptFileError / VerifyError: as for ``dsparkhub verify``.
    """
    from tqdm import tqdm

    from dsparkhub.verify import calibration as cal
    from dsparkhub.verify.reference.engine import ReferenceEngine
    draft = resolve_step_dir(draft) if Path(draft).is_dir() else Path(draft)
    _, gamma = check_drafter(draft)
    out = Path(out) if out is not None else draft / STS_FILE
    claim_output(out, overwrite=overwrite, kind="sidecar")
    if not 0.0 < fit_fraction < 1.0:
        raise CalibrationError(f"fit_fraction must be in (0, 1), found {fit_fraction}")
    check_torch_device(device)
    _validate(draft, target, gamma, warn)
    data = load_datasets(datasets, target, max_prompts=max_prompts, tokenizer=tokenizer)
    engine = ReferenceEngine(target, draft, device=device or "cpu")
    recorder = cal.ConfidenceRecorder(gamma)
    try:
        if engine.drafter.confidence_head is None:  # declared, but its weights were dropped at load
            raise CalibrationError("the loaded drafter has no confidence head", path=draft)
        for ds in tqdm(data, desc="calibrate", unit="dataset", disable=not progress):
            recorder.dataset = ds.name
            engine.run(ds.prompts, num_speculative_tokens=gamma, max_new_tokens=max_new_tokens,
                       temperature=temperature, seed=seed, recorder=recorder)
        engine_info = {"backend": engine.name, "version": engine.version, "device": engine.device}
    finally:
        engine.close()
    records = recorder.records()
    try:
        fit_rec, held = records.split(fit_fraction, seed)
    except ValueError as exc:
        raise CalibrationError(str(exc), hint="give more prompts (--max-prompts, --datasets)") from None
    fit = cal.fit_sts(fit_rec, refine=refine, min_samples=min_samples, min_class=min_class)
    sidecar = build_sidecar(fit, fit_rec, held, fit_fraction=fit_fraction, seed=seed,
                            fit_settings={"refine": refine, "min_samples": min_samples, "min_class": min_class})
    sidecar["split"]["datasets"] = {
        ds.name: {"source": ds.source, "prompts": len(ds.prompts),
                  "fit_steps": int((fit_rec.dataset == ds.name).sum()),
                  "heldout_steps": int((held.dataset == ds.name).sum())} for ds in data}
    sidecar["provenance"] = {
        "drafter": str(draft), "drafter_fingerprint": checkpoint_fingerprint(draft), "target": str(target),
        "target_fingerprint": target_fingerprint(target), "engine": engine_info,
        "settings": {"num_speculative_tokens": gamma, "max_new_tokens": max_new_tokens, "temperature": temperature,
                     "seed": seed, "max_prompts": max_prompts, "batch_size": 1},
        "dsparkhub_version": __version__, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return sidecar, write_sidecar(sidecar, out, overwrite=overwrite)


def build_sidecar(fit, fit_rec, held, *, fit_fraction: float, seed: int, fit_settings: dict | None = None,
                  num_bins: int | None = None) -> dict:
    """The sidecar dict (keys in the module docstring) from a fit and the held-out records; ``provenance`` and
    ``split.datasets`` are added by the caller.

    Raises:
        CalibrationError: a position has no held-out samples (its ECE cannot be reported).
    """
    from dsparkhub.verify import calibration as cal

    num_bins = num_bins or cal.NUM_BINS
    temps = fit.temperatures
    rows = cal.position_metrics(held, temps, num_bins=num_bins)
    empty = [r["position"] for r in rows if not r["samples"]]
    if empty:
        raise CalibrationError(f"no held-out samples at position(s) {empty}", hint="give more prompts")
    positions = [{"position": i, "temperature": temps[i], "fit_samples": fit.samples[i],
                  "fit_accepted": fit.positives[i], "pooled": fit.pooled[i], **{k: v for k, v in r.items()
                                                                                if k != "position"}}
                 for i, r in enumerate(rows)]
    names = held.datasets
    sweep = {tag: {"all": cal.threshold_sweep(held, t),
                   **{n: cal.threshold_sweep(held.subset(held.dataset == n), t) for n in names}}
             for tag, t in (("raw", [1.0] * held.gamma), ("calibrated", temps))}
    return {
        "temperatures": [float(t) for t in temps], "dataset": ",".join(fit_rec.datasets),
        "num_samples": len(fit_rec), "ece_before": [r["ece_before"] for r in rows],
        "ece_after": [r["ece_after"] for r in rows],
        "format": FORMAT, "gamma": held.gamma, "num_bins": num_bins, "positions": _finite(positions),
        "per_dataset": {n: _finite(cal.position_metrics(held.subset(held.dataset == n), temps, num_bins=num_bins))
                        for n in names},
        "fit": {"ece_before": _none_nan(fit.ece_before), "ece_after": _none_nan(fit.ece_after),
                **(fit_settings or {})},
        "split": {"unit": "prompt", "fit_fraction": fit_fraction, "seed": seed, "fit_steps": len(fit_rec),
                  "heldout_steps": len(held)},
        "reliability": cal.pooled_reliability(held, temps, num_bins=num_bins),
        "sweep": sweep,
    }


def _none_nan(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values]


def _finite(rows: list[dict]) -> list[dict]:
    """NaN -> None (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]


# ---- report: text, plot, card ---------------------------------------------------------------------------------


def _f(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_report(sidecar: dict) -> str:
    """The per-position table (held-out ECE / Brier / AUROC before -> after with sample counts), the pooling
    notes and the calibrated threshold sweep, as text for the terminal."""
    lines = [(f"held-out split: {sidecar['split']['heldout_steps']} verify steps; fit split: "
              f"{sidecar['split']['fit_steps']} ({sidecar['dataset']})"),
             ("  k  temperature  fit n  held-out n  accepted  ECE before  ECE after  Brier before  Brier after  "
              "AUROC before  AUROC after")]
    for p in sidecar["positions"]:
        lines.append(f"{p['position'] + 1:>3}  {p['temperature']:>11.4f}  {p['fit_samples']:>5}  {p['samples']:>10}  "
                     f"{p['accepted']:>8}  {_f(p['ece_before']):>10}  {_f(p['ece_after']):>9}  "
                     f"{_f(p['brier_before']):>12}  {_f(p['brier_after']):>11}  {_f(p['auroc_before']):>12}  "
                     f"{_f(p['auroc_after']):>11}")
    for p in sidecar["positions"]:
        if p["pooled"]:
            lines.append(f"draft position {p['position'] + 1} pooled: {p['pooled']}")
    lines.append("threshold sweep (calibrated survival, held-out, all datasets): threshold, acceptance rate of the "
                 "tokens kept, draft tokens per step")
    for r in sidecar["sweep"]["calibrated"]["all"]:
        lines.append(f"  {r['threshold']:.1f}  {_f(r['acceptance_rate'])}  {_f(r['draft_tokens_per_step'], 2)}")
    return "\n".join(lines)


def plot_reliability(sidecar: dict, path: str | Path) -> Path:
    """PNG: reliability diagram before / after (held-out, all positions) and the per-position ECE before / after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--", label="perfect calibration")
    for tag, style in (("before", "o-"), ("after", "s-")):
        b = sidecar["reliability"][tag]
        pts = [(c, a) for c, a in zip(b["confidence"], b["accuracy"]) if c is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=f"{tag} STS")
    ax.set_xlabel("predicted survival (cumulative confidence)")
    ax.set_ylabel("observed acceptance")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("Reliability (held-out, all positions)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    pos = [p["position"] + 1 for p in sidecar["positions"]]
    width = 0.4
    bx.bar([x - width / 2 for x in pos], [p["ece_before"] for p in sidecar["positions"]], width, label="before")
    bx.bar([x + width / 2 for x in pos], [p["ece_after"] for p in sidecar["positions"]], width, label="after")
    bx.set_xticks(pos)
    bx.set_xlabel("draft position")
    bx.set_ylabel("ECE (held-out)")
    bx.set_title("ECE per position", fontsize=10)
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return Path(path)


def card_context(draft: str | Path) -> dict | None:
    """What the card's calibration section shows, from ``DRAFT/dspark_sts.json``; None when there is none.

    Raises:
        CalibrationError: the sidecar does not load in SGLang.
        ResultsError: it was fitted on a drafter with another fingerprint (both named).
    """
    path = Path(draft) / STS_FILE
    if not path.is_file():
        return None
    data = read_sidecar(path)
    if data.get("format") != FORMAT:
        return {"foreign": True, "file": STS_FILE, "temperatures": data["temperatures"]}
    found, fingerprint = (data.get("provenance") or {}).get("drafter_fingerprint"), checkpoint_fingerprint(draft)
    if found != fingerprint:
        raise ResultsError(f"{STS_FILE} was fitted on drafter fingerprint {found}, but the folder has fingerprint "
                           f"{fingerprint}", path=path, hint="re-run `dsparkhub calibrate` on this folder")
    sweep = data["sweep"]["calibrated"]
    names = [n for n in sweep if n != "all"]
    return {
        "foreign": False, "file": STS_FILE, "plot": PLOT_FILE, "data": data,
        "positions": [{**p, "cells": {k: _f(p.get(k)) for k in ("ece_before", "ece_after", "brier_before",
                                                                "brier_after", "auroc_before", "auroc_after")},
                       "temperature_text": f"{p['temperature']:.3f}"} for p in data["positions"]],
        "per_dataset": [{"name": n, "cells": [f"{_f(r['ece_before'])} → {_f(r['ece_after'])}" for r in rows]}
                        for n, rows in data["per_dataset"].items()],
        "sweep_names": names,
        "sweep": [{"threshold": f"{row['threshold']:.1f}",
                   "cells": [f"{_f(sweep[n][i]['acceptance_rate'])} / {_f(sweep[n][i]['draft_tokens_per_step'], 2)}"
                             for n in names]} for i, row in enumerate(sweep["all"])],
        "pooled": [(p["position"] + 1, p["pooled"]) for p in data["positions"] if p["pooled"]],
    }
