"""The card itself: the template context, the Jinja2 rendering (``dsparkhub/templates/model_card.md.j2``,
overridable), the checks ``push`` runs on a card's serve commands, and the atomic write of ``README.md`` + plots.

Card layout follows the speculator cards surveyed in reference/speculators_hub.md B.4-B.6 (RedHatAI speculators,
z-lab DFlash): overview, use with vLLM, evaluation tables, how measured, provenance, caveats.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from dsparkhub import __version__
from dsparkhub.calibrate import card_context, plot_reliability
from dsparkhub.card import CARD_MARKER
from dsparkhub.card.engines import engine_checks, sglang_launch
from dsparkhub.card.facts import (
    CardError,
    CardOutput,
    card_license,
    card_target,
    drafter_facts,
    drafter_spec,
    load_results_for,
    provenance_facts,
    provenance_summary,
    training_facts,
    public_provenance,
    validation_fact,
    read_config,
    read_provenance,
)
from dsparkhub.card.plots import (ASSETS_DIR, plot_acceptance, plot_names, plot_pareto, plot_speedup,
                                  plot_speedup_vs_concurrency)
from dsparkhub.card.timing import policies_context, time_context
from dsparkhub.compare import card_section, read_compare
from dsparkhub.card.tables import METHOD_LABELS, MODEL_PLACEHOLDER, card_data, is_reference, section, serve_commands
from dsparkhub.repo_ids import is_repo_id as valid_repo_id
from dsparkhub.verify.results.schema import VerifyResults


DEFAULT_TEMPLATE = "model_card.md.j2"


def build_context(draft: str | Path, results: list[VerifyResults], *, license: str | None = None,
                  base_model: str | None = None, repo_id: str | None = None,
                  checks: list[str | Path] | None = None, slas: tuple[float, ...] = ()) -> dict[str, Any]:
    """Everything the template renders, derived from the results, the drafter config and its provenance.

    Args:
        draft: drafter folder.
        results: checked results (see :func:`load_results_for`).
        license: Hub license id; default the target manifest's, else ``apache-2.0`` (:func:`card_license`).
        base_model: the target's Hub repo id, used by every line that names the target (``base_model``, serve
            commands, overview, validation, sections, provenance); default: :func:`card_target` (provenance,
            results, the local target's config or manifest). A local path or folder name is never written.
        repo_id: the drafter's Hub repo id (``NS/NAME``), used as ``model`` in the serve commands.
        checks: ``vllm-check --json`` / ``sglang-check --json`` reports for the "Engine checks" lines.
        slas: per-user tokens/s SLAs (``--sla-tokens-per-s``) for each section's "highest total throughput" row.

    Raises:
        CardError: no Hub repo id of the target is known (names ``--base-model``), the results disagree on the
            method, the drafter config is unusable, or a check report is unreadable.
        LayoutError: no layout recipe reads the drafter's config.
    """
    draft = Path(draft)
    cfg = read_config(draft)
    provenance = read_provenance(draft)
    methods = {r.method for r in results}
    if len(methods) != 1:
        raise CardError(f"results files disagree on the method ({', '.join(sorted(methods))})")
    method = methods.pop()
    target, target_from = card_target(base_model, provenance, results)
    name = repo_id or draft.resolve().name
    # Prefer a real engine's measurements for the serve command; the reference engine's best n is a hint only.
    serve_res = next((r for r in results if not is_reference(r)), results[0])
    # never a local path: without --repo-id the serve commands hold a placeholder that `push` refuses
    model = repo_id or f"{MODEL_PLACEHOLDER}/{name}"
    plots = plot_names(results)
    shown = public_provenance(provenance, target, target_from) if provenance else None
    calibration = card_context(draft)
    sts = None if calibration is None else len(
        calibration["temperatures"] if calibration["foreign"] else calibration["data"]["temperatures"])
    return {
        "card_data": card_data(results, name=name, base_model=target, license=card_license(license, target),
                               method=method),
        "name": name, "repo_id": repo_id, "method": method, "method_label": METHOD_LABELS.get(method, method),
        "target": target, "base_model": target, "facts": drafter_facts(drafter_spec(draft, cfg)) + [
            f for f in [validation_fact(draft, target)] if f is not None],
        "serve": (serve := serve_commands(serve_res, target=target, model=model)),
        "sglang": sglang_launch(method, serve["n"], target=target, model=model,
                                tensor_parallel_size=serve_res.settings.tensor_parallel_size,
                                max_model_len=serve_res.settings.max_model_len, sts_positions=sts),
        "multinode": _multinode(target, model, serve["n"]),
        "engine_checks": engine_checks(list(checks or [])),
        "serve_reference": is_reference(serve_res),
        "sections": (sections := [section(r, p, target=target, slas=slas) for r, p in zip(results, plots)]),
        "time_sections": [{"title": sec["title"], **t} for r, sec in zip(results, sections)
                          if (t := time_context(r.step_costs)) is not None],
        "schedule": None,
        "calibration": calibration,
        "provenance": provenance, "provenance_facts": provenance_facts(shown),
        "provenance_summary": provenance_summary(shown), "training": training_facts(shown),
        "provenance_json": json.dumps(shown, indent=2, sort_keys=True) if provenance else None,
        "dsparkhub_version": __version__,
    }


def _multinode(target: str, model: str, n: int) -> str | None:
    """The Ray multi-node commands when ``target`` is a manifest target served across nodes (else None)."""
    from dsparkhub.card.multinode import manifest_for_target, multinode_commands

    manifest = manifest_for_target(target) if target else None
    return multinode_commands(manifest, model=model, n=n) if manifest is not None else None


# ---- checks before publishing -------------------------------------------------------------------------------------

#: where a card names models in its serve commands: the speculative config's ``"model"`` (JSON and Python dict
#: spellings), ``vllm serve TARGET`` and ``LLM(model=TARGET)``
_SERVE_NAMES = (re.compile(r'"model"\s*:\s*"([^"]*)"'), re.compile(r"'model'\s*:\s*'([^']*)'"),
                re.compile(r"\bvllm serve\s+([^\s\\]+)"), re.compile(r"\bmodel=(?:'([^']*)'|\"([^\"]*)\")"))


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
        elif not valid_repo_id(name):
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




def write_card(draft: str | Path, results_paths: list[str | Path], *, template: str | Path | None = None,
               license: str | None = None, base_model: str | None = None,
               repo_id: str | None = None, overwrite: bool = False,
               checks: list[str | Path] | None = None,
               compare: list[str | Path] | None = None, schedule: str | Path | None = None,
               slas: tuple[float, ...] = ()) -> CardOutput:
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
        VerifyError: ``schedule`` (a ``dsparkhub schedule --out`` report, shown under "Where the time goes") cannot
            be read or is not such a report.
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
                            checks=checks, slas=slas)
    if schedule is not None:  # the policies compared (dsparkhub schedule --out)
        from dsparkhub.verify.schedule import advice, read_report

        report, _ = read_report(schedule)  # the advice is derived again from the rows, as this version words it
        context["schedule"] = policies_context(report, advice(report))
    others = read_compare(results[0], list(compare)) if compare else []
    if others:  # the drafter comparison (dsparkhub.compare), every file of the card's target
        context["comparison"] = card_section(list(zip(map(str, results_paths), results)), others, slas)
    text = render_card(context, template).rstrip("\n") + f"\n\n{CARD_MARKER}\n"
    staging = Path(tempfile.mkdtemp(prefix=".dsparkhub-card-", dir=draft))
    try:
        written = []
        for res, sec in zip(results, context["sections"]):
            todo = [(sec["plot_acceptance"], plot_acceptance), (sec["plot_speedup"], plot_speedup)]
            if sec["plot_concurrency"]:
                todo.append((sec["plot_concurrency"], plot_speedup_vs_concurrency))
            if sec["plot_pareto"]:
                todo.append((sec["plot_pareto"], plot_pareto))
            for rel, plot in todo:
                tmp = staging / Path(rel).name
                if plot is plot_acceptance or plot is plot_speedup:
                    plot(res, tmp, target=context["target"])
                else:  # the load plots draw the --compare drafters beside this one
                    plot(res, tmp, others=[o for _, o in others], target=context["target"])
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
