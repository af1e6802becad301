"""What a card states, read from files: the results files (checked against the drafter's fingerprint and for
impossible numbers), the drafter's :class:`~dsparkhub.layouts.spec.DraftSpec` (read by the layout recipes from its
``config.json``) and its ``dsparkhub_provenance.json``; and :func:`public_text`, which keeps local paths out of a card.

Every number of a card comes from here; there is no way to type one in. Does not format or render.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparkhub.convert import PROVENANCE_FILE
from dsparkhub.errors import CardError, CheckpointNotFoundError, ResultsError
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.layouts.reading import spec_from_config
from dsparkhub.layouts.spec import DraftSpec
from dsparkhub.repo_ids import is_repo_id as valid_repo_id
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import VerifyResults


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
        ResultsError: a file is malformed (see ``read_results``), its ``drafter.fingerprint`` is not the
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
        res = read_results(p)
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


def is_hub_name(value: str | None) -> bool:
    """Whether ``value`` reads as a Hub repo id (``dsparkhub.repo_ids``) and is not a local path."""
    return bool(value) and valid_repo_id(value) and not Path(value).exists()


def drafter_spec(draft: str | Path, cfg: dict) -> DraftSpec:
    """The drafter's :class:`DraftSpec`, read from its ``config.json`` dict by the layout recipes (the card needs no
    tensor data; ``reading.spec_from_config``).

    Raises:
        LayoutError: no recipe reads the config, or it breaks the layout's rules.
    """
    return spec_from_config(cfg, path=Path(draft) / "config.json")


def drafter_facts(spec: DraftSpec) -> list[tuple[str, str]]:
    """Overview bullets from the drafter's DraftSpec (target layer ids in layer-index numbering, whatever the
    layout's own numbering); heads only for a DSpark drafter, the draft vocab only when reduced, the weights dtype
    only when the config names one."""
    facts = []

    def add(label, value):
        if value is not None and value != []:
            facts.append((label, value if isinstance(value, str) else json.dumps(value)))

    dspark = spec.variant == "dspark"
    add("Architecture", spec.architecture)
    add("Block size", spec.block_size)
    add("Draft layers", spec.num_layers)
    add("Hidden size", spec.hidden_size)
    add("Target layer ids (layer index)", list(spec.target_layer_ids))
    add("Mask token id", spec.mask_token_id)
    add("Markov rank", spec.markov_rank if dspark else None)
    add("Markov head", spec.markov_head_type if dspark else None)
    add("Confidence head", spec.confidence_head if dspark else None)
    add("Draft vocab", spec.draft_vocab_size if spec.draft_vocab_size != spec.vocab_size else None)
    add("Target vocab", spec.vocab_size)
    add("Weights dtype", spec.decoder_config.get("torch_dtype") or spec.decoder_config.get("dtype"))
    return facts


def provenance_target(provenance: dict | None) -> str | None:
    """The target recorded by ``dsparkhub convert``: ``target.repo_id``, else ``target.source`` (older files: a
    plain string)."""
    t = (provenance or {}).get("target")
    return (t.get("repo_id") or t.get("source")) if isinstance(t, dict) else t if isinstance(t, str) else None


def card_target(base_model: str | None, provenance: dict | None,
                results: list[VerifyResults]) -> tuple[str, str]:
    """The target's Hub repo id, the one name every card line that names the target uses (``base_model``, the
    serve commands, the overview, validation, each "How measured" block, provenance), and where it came from.

    In order: ``base_model`` (``--base-model``); the provenance's ``target.repo_id`` (or an older file's Hub-id
    target); a results file's target id that is a Hub id; a results file's local target folder, by
    :func:`dsparkhub.target.target_repo_id` (config ``_name_or_path``, manifests).

    Raises:
        CardError: ``base_model`` is not a Hub repo id, or no Hub id is known: a card cannot name a target that
            only exists on this machine (nobody could run its serve commands), so it is refused before anything is
            written, naming ``--base-model``.
    """
    from dsparkhub.target import target_repo_id

    if base_model is not None:
        if not is_hub_name(base_model):
            raise CardError(f"--base-model {base_model!r} is not a Hub repo id (namespace/name, not a local path)",
                            hint="pass the target's Hub repo id, e.g. Qwen/Qwen3-8B")
        return base_model, "--base-model"
    candidates = [provenance_target(provenance)] + [r.target.id for r in results]
    for c, how in zip(candidates, ["provenance"] + ["results"] * len(results)):
        if isinstance(c, str) and is_hub_name(c):
            return c, how
    for r in results:  # results of a local target written before results named it by Hub id
        if Path(r.target.id).is_dir():
            repo, how = target_repo_id(r.target.id)
            if repo:
                return repo, f"results target's {how}"
    names = sorted({public_text(c) for c in candidates if isinstance(c, str)})
    raise CardError("the card names the target in its serve commands, metadata and every section, and no Hub "
                    f"repo id of it is known (the provenance and results name {', '.join(names) or 'none'}; "
                    "its config has no Hub `_name_or_path` and no target manifest matches it)",
                    hint="pass --base-model NS/NAME (the target's Hub repo id); a card never names a local "
                         "folder")


#: the license a card declares when neither ``--license`` nor a target manifest gives one (the drafter is the
#: trainer's work; dsparkhub's own default before the manifests knew their targets' licenses)
DEFAULT_LICENSE = "apache-2.0"


def card_license(license: str | None, target: str) -> dict[str, str]:
    """The card metadata's license keys: ``license`` when given, else the license of the target manifest whose
    ``repo_id`` is ``target`` (a drafter ships under its target's terms where those bind derivatives: the Kimi K2
    manifests say ``other (modified-mit)``, written as the Hub's ``license: other`` + ``license_name``), else
    :data:`DEFAULT_LICENSE`. Returns ``{"license": id}`` or ``{"license": "other", "license_name": name}``."""
    from dsparkhub.layouts.manifests import load_manifests

    if license is None:
        targets, _ = load_manifests()
        license = next((m.license for m in targets.values() if m.repo_id == target and m.license), DEFAULT_LICENSE)
    m = re.fullmatch(r"other \(([\w.-]+)\)", license.strip())
    return {"license": "other", "license_name": m.group(1)} if m else {"license": license}


def public_provenance(provenance: dict, target: str, how: str) -> dict:
    """``provenance`` as the card shows it: local paths reduced to names (:func:`public_text`) and a target that
    convert could only name by its folder named by ``target`` (the card's Hub id, found as ``how``; ``repo_id_from``
    says so)."""
    out = public_text(provenance)
    t = out.get("target")
    if isinstance(t, dict) and not is_hub_name(provenance_target(provenance)):
        t = {k: v for k, v in t.items() if k != "name"}
        out["target"] = {**t, "source": target, "repo_id": target, "repo_id_from": f"dsparkhub card ({how})"}
    elif isinstance(t, str) and not is_hub_name(t):
        out["target"] = target
    return out


def provenance_facts(provenance: dict | None) -> list[tuple[str, str]]:
    """Bullets from ``dsparkhub_provenance.json`` (keys written by ``dsparkhub.convert``; absent keys skipped); pass
    it through :func:`public_provenance` first so that the target is named by its Hub id."""
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
    if provenance_target(provenance):
        facts.append(("Converted against target", f"`{public_text(provenance_target(provenance))}`"))
    if provenance.get("options"):
        facts.append(("Conversion options", f"`{json.dumps(provenance['options'], sort_keys=True)}`"))
    version = provenance.get("version") or provenance.get("dsparkhub_version")
    if version:
        facts.append(("Converted with", f"dsparkhub {version}" + (f" on {provenance['created']}"
                                                                  if provenance.get("created") else "")))
    return facts


def provenance_summary(provenance: dict | None) -> str | None:
    """One sentence on where the weights come from (source checkpoint and layout, the dsparkhub version and date of
    the conversion), shown above the folded hashes; pass it through :func:`public_provenance` first. None without
    provenance."""
    if not provenance:
        return None
    src = provenance.get("source")
    name = (src.get("name") or src.get("path")) if isinstance(src, dict) else src if isinstance(src, str) else None
    layout = src.get("layout") if isinstance(src, dict) else None
    version = provenance.get("version") or provenance.get("dsparkhub_version")
    text = "Converted" + (f" from `{public_text(name)}`" if name else "") + (f" ({layout} layout)" if layout else "")
    if provenance.get("layout"):
        text += f" to the {provenance['layout']} layout"
    if version:
        text += f" with dsparkhub {version}" + (f" on {str(provenance['created'])[:10]}"
                                                if provenance.get("created") else "")
    return text + "; the source and written files' hashes are below."


def training_facts(provenance: dict | None) -> list[tuple[str, str]]:
    """The "Training" bullets from the provenance's ``training`` record (``dsparkhub.layouts.deepspec_run
    .training_facts``, written by convert from the DeepSpec step folder): the step, then each recorded
    ``train_config.py`` value. Empty when convert recorded none."""
    t = (provenance or {}).get("training")
    if not isinstance(t, dict):
        return []
    facts = [("Training step", str(t["step"]))] if t.get("step") is not None else []
    config = t.get("config") if isinstance(t.get("config"), dict) else {}
    return facts + [(f"`{key}`", f"`{json.dumps(public_text(v))}`") for key, v in config.items()]


def validation_fact(draft: str | Path, target: str) -> tuple[str, str] | None:
    """The "Validation" bullet from the folder's ``validation.json`` (:mod:`dsparkhub.validate.record`): its outcome
    against the target it names, with the vLLM engine's view of the target's last layer and no n (the card's
    results say which n were measured), naming the target by ``target`` (the card's Hub id) unless the record names
    another Hub id. None when the folder has no record or the record describes other files
    (its drafter fingerprint differs: config or weights changed since; a card never shows a stale outcome).

    Raises:
        CardError: ``validation.json`` is malformed (not JSON, another schema, unknown keys).
    """
    from dsparkhub.errors import CheckpointFormatError
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.validate.record import drafter_fingerprint, read_record

    try:
        record = read_record(draft)
    except CheckpointFormatError as exc:
        raise CardError(exc.args[0] if exc.args else str(exc), path=exc.path, hint=exc.hint) from None
    if record is None or record.key.drafter != drafter_fingerprint(open_draft(draft)):
        return None
    report = record.report_for(draft, None, engine="vllm")
    name = record.target_name if is_hub_name(record.target_name) else target
    against = f"against `{name}`" if record.target_name else "without a target"
    if not report.ok:
        codes = ", ".join(sorted({f.code for f in report.errors}))
        return "Validation", f"{len(report.errors)} error(s) {against} ({codes})"
    warns = sorted({f.code for f in report.warnings})
    return "Validation", f"passed {against}" + (f" ({len(warns)} warning(s): {', '.join(warns)})" if warns else
                                                " (no warnings)")
