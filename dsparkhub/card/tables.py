"""The card's numbers as the template shows them: formatting, the serve commands at the best n, one section per
results file (tables of τ, per-position acceptance, speedups), and the Hub ``model-index`` metadata.

Numbers from the CPU reference engine are labelled as such and never presented as GPU serving speedups (they do not
enter ``model-index`` as speedups). Does not read files (``dsparkhub.card.facts``) or draw (``dsparkhub.card.plots``).
"""

from __future__ import annotations

import json
import re
from types import MappingProxyType
from typing import Any

from dsparkhub.card.facts import is_hub_name, public_text
from dsparkhub.serving import ENGINES, METHODS
from dsparkhub.verify.results.curves import largest_spread
from dsparkhub.verify.results.curves import tables as curve_tables
from dsparkhub.verify.results.schema import ModelRef, VerifyResults


#: the card's names of the methods (``dsparkhub.serving.METHODS``; engines: ``ENGINES[name].label``)
METHOD_LABELS = MappingProxyType({name: method.label for name, method in METHODS.items()})
#: the namespace the serve commands name when the card is written without ``--repo-id`` (push refuses it)
MODEL_PLACEHOLDER = "<your-namespace>"


def fmt(x: float | None, digits: int = 2, suffix: str = "", signed: bool = False) -> str:
    """A number for the card (``-`` for None)."""
    if x is None:
        return "-"
    return f"{x:{'+' if signed else ''}.{digits}f}{suffix}"


def serve_commands(res: VerifyResults, *, target: str, model: str) -> dict[str, Any]:
    """The ``vllm serve`` command line and the matching Python ``LLM(...)`` call for the best n of ``res`` at the
    lowest concurrency measured (:meth:`~dsparkhub.verify.results.schema.VerifyResults.best_n`).

    Settings (TP, max_model_len, compilation config) are those the numbers were measured under.
    """
    n, _ = res.best_n()
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
    return {"n": n, "cli": " \\\n  ".join(cli), "python": python, "backend": res.engine.backend,
            "advice": recommendation(res), "install": _install(res),
            "client": _CLIENT.format(target=target, temperature=s.temperature, max_tokens=s.max_new_tokens)}


#: the OpenAI-client call against ``vllm serve`` (its default port), sampling and chat template as measured
_CLIENT = """from openai import OpenAI

client = OpenAI(base_url="http://localhost:8000/v1", api_key="EMPTY")
response = client.chat.completions.create(
    model="{target}",  # the server answers under the target's name
    messages=[{{"role": "user", "content": "..."}}],
    temperature={temperature!r},
    max_tokens={max_tokens},
    extra_body={{"chat_template_kwargs": {{"enable_thinking": False}}}},  # as measured: thinking disabled
)
print(response.choices[0].message.content)"""


def _install(res: VerifyResults) -> str:
    """``pip install`` line for the client example: the vLLM version the numbers were measured with (vLLM engines),
    else the latest vLLM."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", res.engine.version) if res.engine.backend.startswith("vllm") else None
    return f'pip install "vllm=={m.group(1)}" openai' if m else "pip install vllm openai"


def setup_line(res: VerifyResults) -> str:
    """One line under a section's results: engine and exact version, hardware, sampling, load and prompts (thinking
    disabled: dsparkhub applies chat templates with ``enable_thinking=False``, ``dsparkhub.prompts.datasets``)."""
    s = res.settings
    engine = ("dsparkhub CPU reference engine" if is_reference(res) else
              ENGINES[res.engine.backend].label if res.engine.backend in ENGINES else res.engine.backend)
    load = ("one request at a time" if s.concurrency == [1] else
            "concurrency " + ", ".join(str(c) for c in s.concurrency))
    sampling = f"temperature {s.temperature}" + (" (greedy)" if s.temperature == 0 else "")
    return (f"{engine} ({res.engine.version}{_unconfirmed(res)}) on {res.engine.device}; {sampling}, up to "
            f"{s.max_new_tokens} new tokens; {load}; prompts through the target's chat template, thinking disabled; "
            f"{s.repeats} timed repeat(s)")


def _unconfirmed(res: VerifyResults) -> str:
    """``", judged with vLLM 0.34's facts, not confirmed for it: ..."`` when the run's vLLM is newer than
    dsparkhub's contract (``engine.contract.confirmed`` false), else ``""``."""
    c = res.engine.contract
    if not c or c.get("confirmed", True):
        return ""
    return (f", judged with vLLM {c.get('contract_line')}'s facts, not confirmed for it: "
            f"{', '.join(c.get('unconfirmed') or [])}")


def recommendation(res: VerifyResults, concurrency: int | None = None) -> dict[str, Any]:
    """Whether one n is reliably the fastest at ``concurrency`` (None: the lowest measured), from the reliable mean
    speedups and the spread of their timed repeats.

    The fastest n is recommended only when it pays (mean speedup above 1) and its relative margin over the
    runner-up, ``(best - second) / second``, exceeds the spread of the repeats behind either mean (the largest
    ``speedup_spread``, (max - min) / median of the per-repeat speedups, over the datasets' runs of both n). With
    one timed repeat the spread is not measured, so no n is called better.

    Returns:
        ``{"kind", "text", "best": SummaryRow | None, "second": SummaryRow | None, "spread": float | None}``;
        ``kind`` is ``"best"`` (recommend ``best``), ``"tie"`` (no n reliably better), ``"no_gain"`` (every
        reliable mean speedup at or below 1: speculation does not pay at this load), ``"single"`` (one n measured)
        or ``"none"`` (no reliable speedup). ``text``: one sentence for the card, numbers from the results only.
    """
    if concurrency is None:
        concurrency = res.settings.concurrency[0] if res.settings.concurrency else 1
    rows = sorted((r for r in res.summary_at(concurrency) if r.mean_speedup is not None and r.reliable),
                  key=lambda r: (-r.mean_speedup, r.num_speculative_tokens))
    out: dict[str, Any] = {"best": rows[0] if rows else None, "second": rows[1] if len(rows) > 1 else None,
                           "spread": None}
    if not rows:
        return {**out, "kind": "none", "text": "No speedup here is reliable, so no n is recommended."}
    best, sx = rows[0], (lambda r: f"n={r.num_speculative_tokens} ({fmt(r.mean_speedup, suffix='x')})")
    if best.mean_speedup <= 1.0:
        return {**out, "kind": "no_gain",
                "text": f"Speculation does not pay at this load: every mean speedup is at or below 1x (the highest "
                        f"is {sx(best)})."}
    if len(rows) == 1:
        return {**out, "kind": "single", "text": f"Only {sx(best)} was measured reliably; no other n to compare."}
    second = rows[1]
    chosen = {best.num_speculative_tokens, second.num_speculative_tokens}
    spread = largest_spread(res, chosen, concurrency)
    out["spread"] = spread
    margin = (best.mean_speedup - second.mean_speedup) / second.mean_speedup
    if spread is None:
        return {**out, "kind": "tie",
                "text": f"No n is reliably better: {sx(best)} leads {sx(second)}, but with "
                        f"{res.settings.repeats} timed repeat(s) the spread of the speedups is not measured "
                        "(`dsparkhub verify --repeats 3` measures it)."}
    if margin > spread:
        return {**out, "kind": "best",
                "text": f"Best n: {sx(best)}, ahead of {sx(second)} by more than the spread of the timed repeats "
                        f"(at most {fmt(spread)} of their median)."}
    return {**out, "kind": "tie",
            "text": f"No n is reliably better: {sx(best)} leads {sx(second)} by less than the spread of the timed "
                    f"repeats (up to {fmt(spread)} of their median)."}


def is_reference(res: VerifyResults) -> bool:
    return res.engine.backend == "reference"


def engine_label(res: VerifyResults) -> str:
    if is_reference(res):
        return f"dsparkhub CPU reference engine, {res.engine.device}" if "cpu" in res.engine.device.lower() \
            else f"dsparkhub reference engine, {res.engine.device}"
    return f"{res.engine.version}, {res.engine.device}"


def section(res: VerifyResults, plots: tuple[str, ...], *, target: str,
            slas: tuple[float, ...] = ()) -> dict[str, Any]:
    """The template context of one results file's "Evaluation" block; ``target`` is the card's Hub id of the target,
    shown as the target measured unless the file names another Hub id (a results file names a local target by its
    folder name when it knew no Hub id)."""
    ns = res.settings.num_speculative_tokens
    reference = is_reference(res)
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
                  f"{ENGINES[res.engine.backend].label if res.engine.backend in ENGINES else res.engine.backend} "
                  f"({res.engine.version}, "
                  f"{res.engine.device})"),
        "reference": reference,
        "cpu_reference": reference and "cpu" in res.engine.device.lower(),
        "engine": res.engine, "settings": s, "date": res.date, "dsparkhub_version": res.dsparkhub_version,
        "target": ModelRef(res.target.id if is_hub_name(res.target.id) else target, res.target.fingerprint),
        "drafter": ModelRef(public_text(res.drafter.id), res.drafter.fingerprint),
        "ns": ns, "positions": list(range(1, max_n + 1)),
        "rows": rows, "mean": mean, "change": change, "per_pos": per_pos, "details": details,
        "datasets": [{"name": ds.name, "source": public_text(ds.source), "prompts": ds.baseline.prompts}
                     for ds in res.datasets],
        "compilation_config": json.dumps(s.compilation_config) if s.compilation_config is not None else "default",
        "lossless": lossless, "warnings": [public_text(w) for w in res.warnings],
        "plot_acceptance": plots[0], "plot_speedup": plots[1], "speedup_label": res.speedup_label,
        "baseline_label": res.baseline.label,
        "unreliable": unreliable, "incomplete": res.incomplete,
        "concurrency": s.concurrency, "repeats": s.repeats, "order": s.order,
        "load": _load_context(res), "setup": setup_line(res),
        "requests": _request_context(res), "categories": _category_context(res),
        "plot_concurrency": plots[2] if len(plots) > 2 and len(s.concurrency) > 1 else None,
        "curves": (curves := [{"title": t, "head": h, "rows": r} for t, h, r in curve_tables(res, slas, best=False)]),
        "plot_pareto": plots[3] if len(plots) > 3 and curves else None,
    }


def _load_context(res: VerifyResults) -> dict[str, Any] | None:
    """The measured concurrency table (``results.load_table``) with the best n per concurrency, or None when
    only one concurrency was measured."""
    from dsparkhub.verify.results.table import load_table

    if len(res.settings.concurrency) < 2:
        return None
    head, rows = load_table(res)
    return {"head": head, "rows": rows,
            "best": [{"concurrency": r.concurrency, "n": r.best_n, "speedup": fmt(r.best_speedup, suffix="x"),
                      "text": recommendation(res, r.concurrency)["text"]} for r in res.load],
            "stops_paying_at": res.stops_paying_at}


def _request_context(res: VerifyResults) -> dict[str, Any] | None:
    """Token- vs request-weighted τ and the TPOT / E2E percentile speedups (``results.table.request_table``), or
    None when the file has no per-request figures (older files, untimed backends)."""
    from dsparkhub.verify.results.table import request_table

    if all(r.mean_request_tau is None and r.mean_latency_speedup is None for r in res.summary):
        return None
    head, rows = request_table(res)
    return {"head": head, "rows": rows}


def _category_context(res: VerifyResults) -> dict[str, Any] | None:
    """The SPEED-Bench category matrix (``results.table.category_table``), or None without categories."""
    from dsparkhub.verify.results.table import category_table

    if not res.categories:
        return None
    head, rows = category_table(res)
    return {"head": head, "rows": rows}


def card_data(results: list[VerifyResults], *, name: str, base_model: str | None, license: dict[str, str],
              method: str) -> str:
    """The card's YAML metadata (``huggingface_hub.ModelCardData``); ``license``: :func:`card_license`'s keys."""
    from huggingface_hub import EvalResult, ModelCardData

    evals = []
    for res in results:
        label = "CPU reference engine" if is_reference(res) else res.engine.backend
        for ds in res.datasets:
            for r in ds.runs:
                if r.tau is not None:
                    evals.append(EvalResult(task_type="text-generation", dataset_type=ds.name, dataset_name=ds.name,
                                            metric_type="acceptance_length", metric_value=round(r.tau, 3),
                                            metric_name=f"acceptance length τ (n={r.num_speculative_tokens}, "
                                                        f"{label})"))
                # CPU reference-engine wall-clock ratios are not serving speedups: kept out of model-index.
                if r.speedup is not None and not is_reference(res):
                    evals.append(EvalResult(task_type="text-generation", dataset_type=ds.name, dataset_name=ds.name,
                                            metric_type="speedup", metric_value=round(r.speedup, 3),
                                            metric_name=f"speedup (n={r.num_speculative_tokens}, {label}, "
                                                        f"{res.engine.device})"))
    tags = ["speculative-decoding", method, "draft-model", "vllm"]
    kwargs: dict[str, Any] = dict(library_name="vllm", pipeline_tag="text-generation", **license,
                                  tags=list(dict.fromkeys(tags)),
                                  inference=False)
    if base_model:
        kwargs["base_model"] = base_model
    if evals:
        kwargs.update(model_name=name, eval_results=evals)
    return ModelCardData(**kwargs).to_yaml()
