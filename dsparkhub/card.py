"""Model card (README.md + plots) for a drafter folder, generated from ``dsparkhub verify`` results files only.

This module owns the card: Hub YAML metadata (``huggingface_hub.ModelCardData``), the rendered Jinja2 template
(``dsparkhub/templates/model_card.md.j2``, overridable), matplotlib plots, and the refusals that keep a card honest:

- every number comes from a results file (or the drafter's own ``config.json`` / ``dsparkhub_provenance.json``);
  there is no way to type one in;
- results whose drafter fingerprint differs from the folder's ``checkpoint_fingerprint`` are refused
  (:class:`ResultsError` naming both hashes), and so are results of a run that was not lossless;
- numbers from the CPU reference engine are labelled as such and never presented as GPU serving speedups (they do
  not enter ``model-index`` as speedups, and the ready-to-paste serve command says where its n came from).

Card layout follows the speculator cards surveyed in reference/speculators_hub.md B.4-B.6 (RedHatAI speculators,
z-lab DFlash): overview, use with vLLM, evaluation tables, how measured, provenance, caveats.

It does not measure (``dsparkhub.verify``) or upload (``dsparkhub.hub.push``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dsparkhub import __version__
from dsparkhub.calibrate import card_context, plot_reliability
from dsparkhub.card_engines import engine_checks, sglang_launch
from dsparkhub.errors import CheckpointNotFoundError, DsparkhubError, ResultsError
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.target import target_repo_id
from dsparkhub.verify.results import ModelRef, VerifyResults

PROVENANCE_FILE = "dsparkhub_provenance.json"
DEFAULT_TEMPLATE = "model_card.md.j2"
ASSETS_DIR = "assets"
ENGINE_LABELS = {"vllm": "vLLM offline engine", "vllm-serve": "vLLM server"}
METHOD_LABELS = {"dspark": "DSpark", "dflash": "DFlash", "eagle3": "EAGLE-3"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: the namespace the serve commands name when the card is written without ``--repo-id`` (push refuses it)
MODEL_PLACEHOLDER = "<your-namespace>"
#: an absolute local path (``/x/y``, ``~/x``) inside free text; group 1 is its last component
_ABS_PATH = re.compile(r"(?<![\w:/.~-])(?:~/|/)(?:[^\s/`'\"()\[\]<>]+/)*([^\s/`'\"()\[\]<>]+)/?")


def public_text(obj: Any) -> Any:
    """``obj`` (str, or dicts / lists of them) with every absolute local path reduced to its last component, so a
    card never publishes where files lie on this machine (hashes next to names identify them)."""
    if isinstance(obj, str):
        return _ABS_PATH.sub(lambda m: m.group(1), obj)
    if isinstance(obj, dict):
        return {k: public_text(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [public_text(v) for v in obj]
    return obj


class CardError(DsparkhubError, ValueError):
    """The card cannot be rendered (bad template, missing drafter config, nothing to report)."""


@dataclass
class CardOutput:
    """What :func:`write_card` wrote: the README and the plot files (absolute paths)."""

    readme: Path
    plots: list[Path] = field(default_factory=list)


# ---- inputs -------------------------------------------------------------------------------------------------------


def load_results_for(draft: str | Path, paths: list[str | Path]) -> list[VerifyResults]:
    """Load results files and check they may go on this drafter's card.

    Raises:
        CardError: no results file given.
        ResultsError: a file is malformed (see ``VerifyResults.load``), its ``drafter.fingerprint`` is not the
            folder's ``checkpoint_fingerprint`` (both hashes named), or its run was not lossless.
    """
    if not paths:
        raise CardError("a card needs at least one results file from `dsparkhub verify` (--results)")
    folder = Path(draft)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"drafter folder {folder} does not exist", path=folder)
    fingerprint = checkpoint_fingerprint(folder)
    out = []
    for p in paths:
        res = VerifyResults.load(p)
        if res.drafter.fingerprint != fingerprint:
            raise ResultsError(
                f"results were measured on drafter fingerprint {res.drafter.fingerprint} but the folder {folder} "
                f"has fingerprint {fingerprint}", path=p,
                hint="re-run `dsparkhub verify` on this folder; a card only reports numbers measured on these exact "
                     "weights and config")
        _check_possible(res, p)
        if res.lossless is False:
            hit = res.first_mismatch()
            where = f" (dataset {hit[0]!r}, num_speculative_tokens={hit[1].num_speculative_tokens})" if hit else ""
            raise ResultsError(f"results come from a run that was not lossless{where}; a card cannot publish them",
                               path=p, hint="fix the drafter / engine until `dsparkhub verify` passes")
        out.append(res)
    return out


#: timing noise allowed before a batch-1 speedup above τ counts as impossible (wall clocks of two separate runs)
SPEEDUP_NOISE = 0.05


def _check_possible(res: VerifyResults, path: str | Path) -> None:
    """Refuse numbers no run can produce, naming the file and the run.

    With n draft tokens a verify step commits at most n + 1 tokens, so τ <= n + 1; at batch 1 each verify step costs
    at least one target forward, so the speedup cannot exceed τ (beyond :data:`SPEEDUP_NOISE` of timing noise);
    counts, rates and times are never negative and acceptance rates lie in [0, 1].

    Raises:
        ResultsError: the first impossible value, with its dataset and n.
    """
    problems = []
    for ds in res.datasets:
        b = ds.baseline
        for key in ("prompts", "output_tokens", "wall_s", "tokens_per_s"):
            if getattr(b, key) < 0:
                problems.append(f"dataset {ds.name!r} baseline: {key} is {getattr(b, key)} (negative)")
        for r in ds.runs:
            where = f"dataset {ds.name!r}, num_speculative_tokens={r.num_speculative_tokens}"
            n = r.num_speculative_tokens
            if r.tau is not None and not 0 <= r.tau <= n + 1:
                problems.append(f"{where}: τ is {r.tau}, but a verify step commits 1 to n + 1 = {n + 1} tokens")
            for key in ("prompts", "output_tokens", "wall_s", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                        "tokens_per_s", "baseline_tokens_per_s", "speedup", "draft_tokens_per_step"):
                v = getattr(r, key)
                if v is not None and v < 0:
                    problems.append(f"{where}: {key} is {v} (negative)")
            if (any(not 0 <= v <= 1 for v in r.per_position_acceptance)
                    or any(x < 0 for x in r.accepted_per_pos)):
                problems.append(f"{where}: per-position acceptance {r.per_position_acceptance} leaves [0, 1]")
            # a figure `verify` itself marked unreliable (results/2) is shown as such, not refused: the refusal
            # is for numbers no verify run wrote (edited files, a broken engine)
            if (r.concurrency == 1 and r.reliable and r.speedup is not None and r.tau is not None
                    and r.speedup > r.tau * (1 + SPEEDUP_NOISE)):
                problems.append(f"{where}: batch-1 speedup {r.speedup:.3f}x exceeds τ {r.tau:.3f}; each verify step "
                                "costs at least one target forward, so the two runs were not timed alike")
    if problems:
        raise ResultsError("impossible results: " + "; ".join(problems[:6])
                           + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""), path=path,
                           hint="these numbers were not measured by `dsparkhub verify` as written (edited, or "
                                "from a broken engine); re-run verify")


def read_provenance(draft: str | Path) -> dict | None:
    """``dsparkhub_provenance.json`` of the drafter folder, or None when absent.

    Raises:
        ResultsError: the file exists but is not a JSON object.
    """
    path = Path(draft) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"not valid JSON ({exc.msg} at line {exc.lineno})", path=path) from None
    if not isinstance(data, dict):
        raise ResultsError(f"expected a JSON object, found {type(data).__name__}", path=path)
    return data


def read_config(draft: str | Path) -> dict:
    """The drafter's ``config.json`` (the facts the overview shows).

    Raises:
        CardError: missing or invalid ``config.json``.
    """
    path = Path(draft) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CardError("drafter folder has no config.json", path=draft) from None
    except json.JSONDecodeError as exc:
        raise CardError(f"config.json is not valid JSON ({exc.msg})", path=path) from None
    if not isinstance(cfg, dict):
        raise CardError("config.json is not a JSON object", path=path)
    return cfg


# ---- formatting ---------------------------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 2, suffix: str = "", signed: bool = False) -> str:
    """A number for the card (``-`` for None)."""
    if x is None:
        return "-"
    return f"{x:{'+' if signed else ''}.{digits}f}{suffix}"


def _is_repo_id(value: str | None) -> bool:
    return bool(value) and bool(_REPO_ID.match(value)) and not Path(value).exists()


def _config_facts(cfg: dict) -> list[tuple[str, str]]:
    """Overview bullets from the drafter config (only keys that are present)."""
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    facts = []

    def add(label, value):
        if value is not None and value != []:
            facts.append((label, value if isinstance(value, str) else json.dumps(value)))

    add("Architecture", ", ".join(cfg.get("architectures") or []) or None)
    add("Block size", cfg.get("block_size", dflash.get("block_size")))
    add("Draft layers", cfg.get("num_hidden_layers"))
    add("Hidden size", cfg.get("hidden_size"))
    add("Target layer ids (layer index)", cfg.get("target_layer_ids", dflash.get("target_layer_ids")))
    add("Mask token id", cfg.get("mask_token_id", dflash.get("mask_token_id")))
    add("Markov rank", cfg.get("markov_rank"))
    add("Markov head", cfg.get("markov_head_type"))
    add("Confidence head", cfg.get("enable_confidence_head"))
    add("Draft vocab", cfg.get("draft_vocab_size"))
    add("Target vocab", cfg.get("vocab_size"))
    add("Weights dtype", cfg.get("torch_dtype") or cfg.get("dtype"))
    return facts


def _best_n(res: VerifyResults) -> int:
    """The n with the highest *reliable* mean speedup at the lowest concurrency measured (ties: the smaller n); the
    largest mean τ when no speedup there is reliable (an unreliable figure never chooses n)."""
    summary = res.summary_at()
    rows = [r for r in summary if r.mean_speedup is not None and r.reliable]
    if rows:
        return max(rows, key=lambda r: (r.mean_speedup, -r.num_speculative_tokens)).num_speculative_tokens
    rows = [r for r in summary if r.mean_tau is not None] or summary
    return max(rows, key=lambda r: (r.mean_tau or 0.0, -r.num_speculative_tokens)).num_speculative_tokens


def serve_commands(res: VerifyResults, *, target: str, model: str) -> dict[str, Any]:
    """The ``vllm serve`` command line and the matching Python ``LLM(...)`` call for the best n of ``res``.

    Settings (TP, max_model_len, compilation config) are those the numbers were measured under.
    """
    n = _best_n(res)
    spec = {"model": model, "method": res.method, "num_speculative_tokens": n}
    s = res.settings
    cli = [f"vllm serve {target}"]
    py = [f"    model={target!r},"]
    if s.tensor_parallel_size != 1:
        cli.append(f"--tensor-parallel-size {s.tensor_parallel_size}")
        py.append(f"    tensor_parallel_size={s.tensor_parallel_size},")
    if s.max_model_len is not None:
        cli.append(f"--max-model-len {s.max_model_len}")
        py.append(f"    max_model_len={s.max_model_len},")
    if s.compilation_config is not None:
        cli.append(f"--compilation-config '{json.dumps(s.compilation_config)}'")
        py.append(f"    compilation_config={s.compilation_config!r},")
    cli.append(f"--speculative-config '{json.dumps(spec)}'")
    py.append(f"    speculative_config={spec!r},")
    python = ("from vllm import LLM, SamplingParams\n\n"
              "llm = LLM(\n" + "\n".join(py) + "\n)\n"
              f"params = SamplingParams(temperature={s.temperature!r}, max_tokens={s.max_new_tokens})\n"
              'outputs = llm.generate(["..."], params)')
    return {"n": n, "cli": " \\\n  ".join(cli), "python": python, "backend": res.engine.backend}


# ---- plots --------------------------------------------------------------------------------------------------------


def plot_acceptance(res: VerifyResults, path: Path, *, target: str | None = None) -> Path:
    """PNG: mean per-position acceptance (unweighted over datasets) vs draft position, one line per n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    for row in res.summary_at():
        if row.mean_per_position_acceptance:
            xs = list(range(1, len(row.mean_per_position_acceptance) + 1))
            ax.plot(xs, row.mean_per_position_acceptance, marker="o", label=f"n={row.num_speculative_tokens}")
    ax.set_xticks(range(1, max(res.settings.num_speculative_tokens) + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (mean over datasets)")
    ax.set_ylim(-0.03, 1.05)
    ax.set_title(_plot_title("Per-position acceptance", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save_png(fig, path)


def plot_speedup(res: VerifyResults, path: Path, *, target: str | None = None) -> Path:
    """PNG: speedup vs num_speculative_tokens, one line per dataset plus the unweighted mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    top = 1.0
    low = res.settings.concurrency[0]
    for ds in res.datasets:
        pts = [(r.num_speculative_tokens, r.speedup) for r in ds.runs
               if r.speedup is not None and r.concurrency == low]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=ds.name)
            top = max([top] + [p[1] for p in pts])
    mean = [(r.num_speculative_tokens, r.mean_speedup) for r in res.summary_at() if r.mean_speedup is not None]
    if mean:
        ax.plot(*zip(*mean), marker="s", color="black", linestyle="--", label="mean")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(res.settings.num_speculative_tokens)
    ax.set_xlabel("num_speculative_tokens")
    ax.set_ylabel("speedup vs target alone" + (" (CPU reference engine)" if _is_reference(res) else ""))
    ax.set_ylim(0, top * 1.1)  # from 0: a truncated axis makes a 1.1x look like a 3x
    ax.set_title(_plot_title("Speedup", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


#: plot size in inches and resolution: 1350 x 825 pixels, legible on a Hub model page
PLOT_SIZE, PLOT_DPI = (9, 5.5), 150


def _plot_title(what: str, res: VerifyResults, target: str | None = None) -> str:
    """Two lines: what is plotted for which drafter and target (``target``: the card's name for it, e.g. its Hub
    id; default the results' ``target.id``), then the engine and the datasets."""
    datasets = ", ".join(ds.name for ds in res.datasets)
    return (f"{what}: {METHOD_LABELS.get(res.method, res.method)} drafter {public_text(res.drafter.id)} "
            f"on {target or public_text(res.target.id)}\n{_engine_label(res)}; datasets: {datasets}")


def plot_speedup_vs_concurrency(res: VerifyResults, path: Path, label: str | None = None,
                                others: list[VerifyResults] = (), *, target: str | None = None) -> Path:
    """PNG: mean speedup (unweighted over datasets) vs concurrency, one line per n; unreliable points hollow.

    ``others`` (further drafters' results) add one line each at their own best n per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    for n in res.settings.num_speculative_tokens:
        rows = [r for r in res.summary if r.num_speculative_tokens == n and r.mean_speedup is not None]
        if not rows:
            continue
        line, = ax.plot([r.concurrency for r in rows], [r.mean_speedup for r in rows], marker="o",
                        label=f"{label + ' ' if label else ''}n={n}")
        bad = [r for r in rows if not r.reliable]
        if bad:
            ax.plot([r.concurrency for r in bad], [r.mean_speedup for r in bad], marker="o", linestyle="none",
                    markerfacecolor="white", color=line.get_color())
    for other in others:
        pts = [(row.concurrency, row.best_speedup) for row in other.load if row.best_speedup is not None]
        if pts:
            ax.plot(*zip(*pts), marker="s", linestyle="--", label=f"{other.drafter.id} (best n)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(res.settings.concurrency, [str(c) for c in res.settings.concurrency])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("speedup vs target alone, same concurrency")
    tops = [r.mean_speedup for r in res.summary if r.mean_speedup is not None]
    ax.set_ylim(0, max([1.0] + tops) * 1.1)  # from 0, as plot_speedup
    ax.set_title(_plot_title("Speedup at serving load", res, target), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def _save_png(fig, path: Path) -> Path:
    """Lay out, write ``fig`` to ``path`` as PNG and free it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def _is_reference(res: VerifyResults) -> bool:
    return res.engine.backend == "reference"


def _engine_label(res: VerifyResults) -> str:
    if _is_reference(res):
        return f"dsparkhub CPU reference engine, {res.engine.device}" if "cpu" in res.engine.device.lower() \
            else f"dsparkhub reference engine, {res.engine.device}"
    return f"{res.engine.version}, {res.engine.device}"


# ---- context ------------------------------------------------------------------------------------------------------


def _plot_names(results: list[VerifyResults]) -> list[tuple[str, str, str]]:
    """Relative plot paths per results file (acceptance, speedup vs n, speedup vs concurrency): plain names for one
    file, ``_<backend>[_b...]`` for several."""
    if len(results) == 1:
        return [(f"{ASSETS_DIR}/acceptance_per_position.png", f"{ASSETS_DIR}/speedup_vs_n.png",
                 f"{ASSETS_DIR}/speedup_vs_concurrency.png")]
    names, used = [], set()
    for res in results:
        tag = res.engine.backend.replace("-", "_")
        k = 0
        while (t := tag + ("" if k == 0 else "_" + chr(ord("a") + k))) in used:
            k += 1
        used.add(t)
        names.append((f"{ASSETS_DIR}/acceptance_per_position_{t}.png", f"{ASSETS_DIR}/speedup_vs_n_{t}.png",
                      f"{ASSETS_DIR}/speedup_vs_concurrency_{t}.png"))
    return names


def _section(res: VerifyResults, plots: tuple[str, ...]) -> dict[str, Any]:
    ns = res.settings.num_speculative_tokens
    reference = _is_reference(res)
    rows = []
    unreliable = []
    for ds in res.datasets:
        cells = []
        for n in ns:
            r = ds.run(n)
            cells.append("-" if r is None else f"{fmt(r.speedup, suffix='x')}{' (unreliable)' if r.unreliable else ''}"
                         f" (τ {fmt(r.tau)})")
            unreliable += [f"{ds.name}, n={n}: {why}" for why in (r.unreliable if r is not None else [])]
        rows.append({"name": ds.name, "cells": cells})
    mean = [f"{fmt(r.mean_speedup, suffix='x')}{' (unreliable)' if r.unreliable else ''} (τ {fmt(r.mean_tau)})"
            for r in res.summary_at()]
    change = None
    if res.change is not None:
        c = res.change
        change = {"from_n": c.from_n, "to_n": c.to_n, "speedup": fmt(c.speedup_delta, signed=True, suffix="x"),
                  "tau": fmt(c.tau_delta, signed=True)}
    max_n = max(ns)
    per_pos = [{"n": r.num_speculative_tokens,
                "cells": [fmt(v) for v in r.mean_per_position_acceptance]
                + [""] * (max_n - len(r.mean_per_position_acceptance))}
               for r in res.summary_at()]
    details = [{"dataset": ds.name, "n": r.num_speculative_tokens, "concurrency": r.concurrency, "prompts": r.prompts,
                "output_tokens": r.output_tokens, "base_tps": fmt(r.baseline_tokens_per_s, 1),
                "tps": fmt(r.tokens_per_s, 1), "dtps": fmt(r.draft_tokens_per_step),
                "per_pos": " / ".join(fmt(v) for v in r.per_position_acceptance),
                "lossless": {True: "yes", False: "NO", None: "not checked"}[r.lossless]}
               for ds in res.datasets for r in ds.runs]
    s = res.settings
    if res.lossless is True:
        lossless = ("yes: with greedy decoding every output was token-identical with and without the drafter "
                    "(every dataset, every num_speculative_tokens)")
    else:
        lossless = f"not checked: temperature {s.temperature} samples, outputs are not comparable token by token"
    return {
        "title": ("CPU reference engine (dsparkhub PyTorch implementation)" if reference and
                  "cpu" in res.engine.device.lower() else
                  f"dsparkhub reference engine ({res.engine.device})" if reference else
                  f"{ENGINE_LABELS.get(res.engine.backend, res.engine.backend)} ({res.engine.version}, "
                  f"{res.engine.device})"),
        "reference": reference,
        "cpu_reference": reference and "cpu" in res.engine.device.lower(),
        "engine": res.engine, "settings": s, "date": res.date, "dsparkhub_version": res.dsparkhub_version,
        "target": ModelRef(public_text(res.target.id), res.target.fingerprint),
        "drafter": ModelRef(public_text(res.drafter.id), res.drafter.fingerprint),
        "ns": ns, "positions": list(range(1, max_n + 1)),
        "rows": rows, "mean": mean, "change": change, "per_pos": per_pos, "details": details,
        "datasets": [{"name": ds.name, "source": public_text(ds.source), "prompts": ds.baseline.prompts}
                     for ds in res.datasets],
        "compilation_config": json.dumps(s.compilation_config) if s.compilation_config is not None else "default",
        "lossless": lossless, "warnings": [public_text(w) for w in res.warnings],
        "plot_acceptance": plots[0], "plot_speedup": plots[1],
        "unreliable": unreliable, "incomplete": res.incomplete,
        "concurrency": s.concurrency, "repeats": s.repeats, "order": s.order,
        "load": _load_context(res),
        "plot_concurrency": plots[2] if len(plots) > 2 and len(s.concurrency) > 1 else None,
    }


def _load_context(res: VerifyResults) -> dict[str, Any] | None:
    """The measured concurrency table (``results.load_table``) with the best n per concurrency, or None when
    only one concurrency was measured."""
    from dsparkhub.verify.results import load_table

    if len(res.settings.concurrency) < 2:
        return None
    head, rows = load_table(res)
    return {"head": head, "rows": rows,
            "best": [{"concurrency": r.concurrency, "n": r.best_n, "speedup": fmt(r.best_speedup, suffix="x")}
                     for r in res.load],
            "stops_paying_at": res.stops_paying_at}


def _card_data(results: list[VerifyResults], *, name: str, base_model: str | None, license: str,
               method: str) -> str:
    from huggingface_hub import EvalResult, ModelCardData

    evals = []
    for res in results:
        label = "CPU reference engine" if _is_reference(res) else res.engine.backend
        for ds in res.datasets:
            for r in ds.runs:
                if r.tau is not None:
                    evals.append(EvalResult(task_type="text-generation", dataset_type=ds.name, dataset_name=ds.name,
                                            metric_type="acceptance_length", metric_value=round(r.tau, 3),
                                            metric_name=f"acceptance length τ (n={r.num_speculative_tokens}, "
                                                        f"{label})"))
                # CPU reference-engine wall-clock ratios are not serving speedups: kept out of model-index.
                if r.speedup is not None and not _is_reference(res):
                    evals.append(EvalResult(task_type="text-generation", dataset_type=ds.name, dataset_name=ds.name,
                                            metric_type="speedup", metric_value=round(r.speedup, 3),
                                            metric_name=f"speedup (n={r.num_speculative_tokens}, {label}, "
                                                        f"{res.engine.device})"))
    tags = ["speculative-decoding", method, "draft-model", "vllm"]
    kwargs: dict[str, Any] = dict(library_name="vllm", pipeline_tag="text-generation", license=license,
                                  tags=list(dict.fromkeys(tags)),
                                  inference=False)
    if base_model:
        kwargs["base_model"] = base_model
    if evals:
        kwargs.update(model_name=name, eval_results=evals)
    return ModelCardData(**kwargs).to_yaml()


def _provenance_target(provenance: dict | None) -> str | None:
    """The target recorded by ``dsparkhub convert``: ``target.repo_id``, else ``target.source`` (older files: a
    plain string)."""
    t = (provenance or {}).get("target")
    return (t.get("repo_id") or t.get("source")) if isinstance(t, dict) else t if isinstance(t, str) else None


def _provenance_facts(provenance: dict | None) -> list[tuple[str, str]]:
    """Bullets from ``dsparkhub_provenance.json`` (keys written by ``dsparkhub.convert``; absent keys skipped)."""
    if not provenance:
        return []
    facts = []
    src = provenance.get("source")
    if isinstance(src, dict):
        if src.get("name") or src.get("path"):  # older provenance files: an absolute path, shown by its name
            facts.append(("Source checkpoint", f"`{public_text(src.get('name') or src['path'])}`"
                          + (f" ({src['layout']} layout)"
                                                                      if src.get("layout") else "")))
        if isinstance(src.get("files"), dict) and src["files"]:
            facts.append(("Source file hashes (sha256)",
                          ", ".join(f"`{k}` `{v}`" for k, v in sorted(src["files"].items()))))
    elif isinstance(src, str):
        facts.append(("Source checkpoint", f"`{public_text(src)}`"))
    if provenance.get("layout"):
        facts.append(("Written layout", str(provenance["layout"])))
    if _provenance_target(provenance):
        facts.append(("Converted against target", f"`{public_text(_provenance_target(provenance))}`"))
    if provenance.get("options"):
        facts.append(("Conversion options", f"`{json.dumps(provenance['options'], sort_keys=True)}`"))
    version = provenance.get("version") or provenance.get("dsparkhub_version")
    if version:
        facts.append(("Converted with", f"dsparkhub {version}" + (f" on {provenance['created']}"
                                                                  if provenance.get("created") else "")))
    return facts


def build_context(draft: str | Path, results: list[VerifyResults], *, license: str = "apache-2.0",
                  base_model: str | None = None, repo_id: str | None = None,
                  checks: list[str | Path] | None = None) -> dict[str, Any]:
    """Everything the template renders, derived from the results, the drafter config and its provenance.

    Args:
        draft: drafter folder.
        results: checked results (see :func:`load_results_for`).
        license: Hub license id.
        base_model: target repo id for ``base_model``; default the provenance's or the results' target when it
            is a Hub repo id (a local path is never written as ``base_model``).
        repo_id: the drafter's Hub repo id (``NS/NAME``), used as ``model`` in the serve commands.
        checks: ``vllm-check --json`` / ``sglang-check --json`` reports for the "Engine checks" lines.

    Raises:
        CardError: the results disagree on the method, the drafter config is unusable, or a check report is
            unreadable.
    """
    draft = Path(draft)
    cfg = read_config(draft)
    provenance = read_provenance(draft)
    methods = {r.method for r in results}
    if len(methods) != 1:
        raise CardError(f"results files disagree on the method ({', '.join(sorted(methods))})")
    method = methods.pop()
    if base_model is None:
        candidates = [_provenance_target(provenance)] + [r.target.id for r in results]
        base_model = next((c for c in candidates if isinstance(c, str) and _is_repo_id(c)), None)
    if base_model is None:  # results of a local target written before results named it by Hub id
        base_model = next((repo for r in results if Path(r.target.id).is_dir()
                           for repo in [target_repo_id(r.target.id)[0]] if repo), None)
    name = repo_id or draft.resolve().name
    # Prefer a real engine's measurements for the serve command; the reference engine's best n is a hint only.
    serve_res = next((r for r in results if not _is_reference(r)), results[0])
    target = base_model or public_text(serve_res.target.id)
    # never a local path: without --repo-id the serve commands hold a placeholder that `push` refuses
    model = repo_id or f"{MODEL_PLACEHOLDER}/{name}"
    plots = _plot_names(results)
    return {
        "card_data": _card_data(results, name=name, base_model=base_model, license=license, method=method),
        "name": name, "repo_id": repo_id, "method": method, "method_label": METHOD_LABELS.get(method, method),
        "target": target, "base_model": base_model, "facts": _config_facts(cfg),
        "serve": (serve := serve_commands(serve_res, target=target, model=model)),
        "sglang": sglang_launch(method, serve["n"], target=target, model=model,
                                tensor_parallel_size=serve_res.settings.tensor_parallel_size,
                                max_model_len=serve_res.settings.max_model_len),
        "engine_checks": engine_checks(list(checks or [])),
        "serve_reference": _is_reference(serve_res),
        "sections": [_section(r, p) for r, p in zip(results, plots)],
        "calibration": card_context(draft),
        "provenance": provenance, "provenance_facts": _provenance_facts(provenance),
        "provenance_json": json.dumps(public_text(provenance), indent=2, sort_keys=True) if provenance else None,
        "dsparkhub_version": __version__,
    }


# ---- checks before publishing -------------------------------------------------------------------------------------

#: where a card names models in its serve commands: the speculative config's ``"model"`` (JSON and Python dict
#: spellings), ``vllm serve TARGET`` and ``LLM(model=TARGET)``
_SERVE_NAMES = (re.compile(r'"model"\s*:\s*"([^"]*)"'), re.compile(r"'model'\s*:\s*'([^']*)'"),
                re.compile(r"\bvllm serve\s+([^\s\\]+)"), re.compile(r"\bmodel=(?:'([^']*)'|\"([^\"]*)\")"))
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def serve_command_problems(text: str) -> list[str]:
    """Models named in a card's serve commands that nobody else can load: each must be a Hub repo id
    (``namespace/name``), not a placeholder (``drafter``, ``<your-namespace>/...``) or a local path (``/x``, ``./x``,
    ``~/x``). Returns one line per offending name (empty when the card is fine or has no serve command)."""
    found: dict[str, None] = {}
    for pattern in _SERVE_NAMES:
        for m in pattern.finditer(text):
            found[next(g for g in m.groups() if g is not None)] = None
    problems = []
    for name in found:
        if name.startswith(("/", "./", "../", "~")):
            problems.append(f"{name!r} is a local path")
        elif not _HUB_ID.match(name) or "--" in name or ".." in name:
            problems.append(f"{name!r} is a placeholder, not a Hub repo id (namespace/name)")
    return problems


# ---- rendering ----------------------------------------------------------------------------------------------------


def _environment(template: str | Path | None):
    import jinja2

    if template is None:
        text = (resources.files("dsparkhub") / "templates" / DEFAULT_TEMPLATE).read_text(encoding="utf-8")
        name = DEFAULT_TEMPLATE
    else:
        path = Path(template)
        if not path.is_file():
            raise CardError(f"card template {path} does not exist", path=path)
        text, name = path.read_text(encoding="utf-8"), str(path)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, autoescape=False)
    try:
        return env.from_string(text), name
    except jinja2.TemplateSyntaxError as exc:
        raise CardError(f"card template {name} line {exc.lineno}: {exc.message}") from None


def render_card(context: dict[str, Any], template: str | Path | None = None) -> str:
    """Render the README text from a :func:`build_context` dict.

    Raises:
        CardError: the template does not exist, does not parse, or uses a variable the context lacks.
    """
    import jinja2

    tmpl, name = _environment(template)
    try:
        return tmpl.render(**context)
    except jinja2.UndefinedError as exc:
        raise CardError(f"card template {name}: {exc.message}",
                        hint="see dsparkhub/templates/model_card.md.j2 for the variables a template gets") from None


CARD_MARKER = "<!-- written by `dsparkhub card`: running it again replaces this file -->"


def write_card(draft: str | Path, results_paths: list[str | Path], *, template: str | Path | None = None,
               license: str = "apache-2.0", base_model: str | None = None,
               repo_id: str | None = None, overwrite: bool = False,
               checks: list[str | Path] | None = None,
               compare: list[str | Path] | None = None) -> CardOutput:
    """Write ``README.md`` and ``assets/*.png`` into the drafter folder from results files.

    Everything is rendered into a temporary folder inside ``draft`` first; the plots are then renamed into
    ``assets/`` and the README last, so a README never points at a missing plot. The drafter's config and weights
    are not touched (its fingerprint does not change).

    A ``README.md`` that a previous ``dsparkhub card`` wrote (it ends with :data:`CARD_MARKER`) is replaced; one
    written by hand is kept unless ``overwrite``.

    Raises:
        ResultsError: a results file is malformed, from another drafter (both fingerprints named), or from a run
            that was not lossless; ``dspark_sts.json`` was fitted on another drafter.
        CalibrationError: ``dspark_sts.json`` does not load in SGLang's reader.
        CardError: no results, bad template, unusable drafter config, or a hand-written README.md without
            ``overwrite``.
        CompareError: a ``compare`` file (``--compare``) was measured on another target.
    """
    draft = Path(draft)
    existing = draft / "README.md"
    if existing.exists() and not existing.is_file():
        raise CardError("README.md in the drafter folder is not a file", path=existing,
                        hint="move it away; the card is written as DRAFT/README.md")
    if existing.is_file() and not overwrite and CARD_MARKER not in existing.read_text(encoding="utf-8",
                                                                                        errors="replace"):
        raise CardError("the drafter folder already has a README.md that dsparkhub did not write", path=existing,
                        hint="pass --overwrite to replace it, or move it away first")
    results = load_results_for(draft, list(results_paths))
    context = build_context(draft, results, license=license, base_model=base_model, repo_id=repo_id,
                            checks=checks)
    if compare:  # the drafter comparison (dsparkhub.compare), every file of the card's target
        from dsparkhub.compare import card_section

        context["comparison"] = card_section(list(zip(map(str, results_paths), results)), list(compare))
    text = render_card(context, template).rstrip("\n") + f"\n\n{CARD_MARKER}\n"
    staging = Path(tempfile.mkdtemp(prefix=".dsparkhub-card-", dir=draft))
    try:
        written = []
        for res, sec in zip(results, context["sections"]):
            todo = [(sec["plot_acceptance"], plot_acceptance), (sec["plot_speedup"], plot_speedup)]
            if sec["plot_concurrency"]:
                todo.append((sec["plot_concurrency"], plot_speedup_vs_concurrency))
            for rel, plot in todo:
                tmp = staging / Path(rel).name
                plot(res, tmp, target=context["target"])
                written.append((tmp, draft / rel))
        calibration = context["calibration"]
        if calibration and not calibration["foreign"]:  # dsparkhub calibrate's sidecar: its reliability diagram
            tmp = staging / Path(calibration["plot"]).name
            written.append((plot_reliability(calibration["data"], tmp), draft / calibration["plot"]))
        readme_tmp = staging / "README.md"
        readme_tmp.write_text(text, encoding="utf-8")
        (draft / ASSETS_DIR).mkdir(exist_ok=True)
        for tmp, final in written:
            os.replace(tmp, final)
        os.replace(readme_tmp, draft / "README.md")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return CardOutput(readme=(draft / "README.md").resolve(), plots=[final.resolve() for _, final in written])
