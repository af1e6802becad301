"""How the CLI prints library results: specs, plans, validation reports, push reports, JSON, progress bars."""

from __future__ import annotations

import contextlib
import json
import sys

import click


def hide_transformers_progress() -> None:
    """--quiet: also hide transformers' own "Loading weights" bar."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def echo_json(obj) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_spec(summary: dict, files: list[str]) -> None:
    s = summary
    rows = [
        ("layout", s["layout"]), ("architecture", s["architecture"]), ("variant", s["variant"]),
        ("family", s["family"]), ("draft layers", s["num_layers"]),
        ("block size", f"{s['block_size']} ({s['block_layout']}: {s['proposals_per_block']} proposals per block)"),
        ("target layer ids", f"{s['target_layer_ids']} (layer-index numbering: HF output_hidden_states[id + 1])"),
        ("target layers / hidden", f"{s['num_target_layers']} / {s['target_hidden_size']}"),
        ("Markov head", f"rank {s['markov_rank']}, {s['markov_head_type']}" if s["markov_rank"] else "none"),
        ("confidence head", ("yes, input [h; W1[prev]]" if s["confidence_head_with_markov"] else "yes, input h")
         if s["confidence_head"] else "no"),
        ("vocab / draft vocab", f"{s['vocab_size']} / {s['draft_vocab_size']}"),
        ("mask token id", s["mask_token_id"]), ("hidden size", s["hidden_size"]),
        ("dtypes", ", ".join(f"{k} x{v}" for k, v in sorted(s["dtypes"].items()))),
        ("parameters", f"{s['num_parameters']:,}"), ("bytes", fmt_bytes(s["total_bytes"])),
        ("files", ", ".join(files)),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"  {k:<{width}}  {v}")
    for note in s.get("notes") or []:
        click.echo(f"  note: {note}")


def print_report(report) -> None:
    for f in report.findings:
        click.echo(f"  {f.severity.upper():7} {f.code}  {f.message}")
        if f.location:
            click.echo(f"          at {f.location}")
        if f.expected or f.found:
            click.echo(f"          expected {f.expected or '-'}, found {f.found or '-'}")
        if f.hint:
            click.echo(f"          hint: {f.hint}")
    verdict = "clean" if not report.findings else ("ok" if report.ok else "FAILED")
    click.echo(f"validate: {verdict} — {len(report.errors)} error(s), {len(report.warnings)} warning(s)"
               + (f" against {report.target}" if report.target else " (no target given: target checks skipped)"))


def print_plan(plan) -> None:
    d = plan.draft
    click.echo(f"convert {d.checkpoint.path} [{d.recipe.name}] -> [{plan.recipe.name}]"
               + (f" for target {plan.target.source}" if plan.target else ""))
    copies = plan.copies
    count = len(copies) + len(plan.derived) + len(plan.reduced)
    click.echo(f"  tensors to write: {count} ({fmt_bytes(plan.out_bytes)})")
    for note in d.spec.notes:  # e.g. a block layout declared with --declare-block-layout
        click.echo(f"  note: {note}")
    for x in plan.decisions:
        if x.action == "drop" or x.reason:
            click.echo(f"  {x.action:5} {x.name}: {x.reason}")
    if plan.report.findings:
        print_report(plan.report)


@contextlib.contextmanager
def convert_bars():
    """tqdm bars on stderr for convert's phases, shown only for a phase that runs over 2 s (``delay``)."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    labels = {"write": ("writing shards", "B", True), "hash": ("hashing the source for provenance", "", False)}

    def progress(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            desc, unit, scale = labels.get(phase, (phase, "", False))
            bars[phase] = tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, file=sys.stderr, delay=2,
                               leave=False)
        bars[phase].update(done - bars[phase].n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


@contextlib.contextmanager
def working(desc: str, *, delay_s: float = 2.0, show: bool = True):
    """A one-line "DESC: 12s" on stderr, shown once the block runs past ``delay_s`` and cleared when it ends, for a
    step that reports no progress of its own (attach, detach, an engine check in a child process). ``show=False``
    (a ``--json`` run, whose output is for a program) prints nothing."""
    if not show:
        yield
        return
    import threading

    from tqdm import tqdm

    bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, delay=delay_s, leave=False)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            bar.update(0)  # tqdm redraws on updates only (after its delay); this block makes none

    thread = threading.Thread(target=tick, name="dsparkhub-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()


def print_push_plan(report) -> None:
    """The plan of a push: where, one line per file (action, local and remote size), the counts, validation.
    Printed before the upload starts (``push(on_plan=...)``), or with the report of a dry run."""
    plan = report.plan
    where = f"{plan.repo_id}@{plan.revision}"
    state = ("new repo" if not plan.repo_exists else "new branch from main" if not plan.branch_exists
             else f"head {plan.parent_commit[:12]}")
    click.echo(f"{'Plan' if report.dry_run else 'Push'}: {where} ({state})")
    width = max([len(f.path) for f in plan.files] + [4])
    click.echo(f"  {'action':<9} {'path':<{width}} {'local':>10} {'remote':>10}")
    for f in plan.files:
        local = fmt_bytes(f.size) if f.size is not None else "-"
        remote = fmt_bytes(f.remote_size) if f.remote_size is not None else "-"
        click.echo(f"  {f.action:<9} {f.path:<{width}} {local:>10} {remote:>10}")
    counts = ", ".join(f"{len(plan.by_action(a))} {word}" for a, word in
                       (("add", "added"), ("change", "changed"), ("delete", "deleted"), ("unchanged", "unchanged"),
                        ("keep", "kept on the Hub")))
    click.echo(f"  {counts}; {fmt_bytes(plan.bytes_to_send)} to send at most")
    if report.validation is not None:
        v = report.validation
        click.echo(f"validation: {'ok' if v['ok'] else 'FORCED'} ({v['errors']} error(s), {v['warnings']} warning(s))")


def print_push(report, *, plan_shown: bool = False) -> None:
    """A push report: the plan (unless ``plan_shown``: already printed before the upload), the notes, the outcome."""
    if not plan_shown:
        print_push_plan(report)
    for note in report.notes:
        click.echo(f"note: {note}")
    plan = report.plan
    if report.dry_run:
        click.echo("dry run: nothing was written to the Hub")
        if plan.parent_commit:
            click.echo(f"to push exactly this plan: --expect-head {plan.parent_commit}")
    elif report.committed:
        click.echo(f"bytes uploaded: {report.bytes_uploaded} ({fmt_bytes(report.bytes_uploaded)})")
        click.echo(f"commit: {report.commit_url}")
        if report.pr_url:
            click.echo(f"pull request: {report.pr_url}")
        click.echo(f"remote check: {report.remote_check} (sizes and hashes of the pushed files match)")
    else:
        click.echo("unchanged: the Hub already holds these files; no commit made, 0 bytes uploaded")


def echo_stages(title: str, stages) -> None:
    """A staged engine check (``vllm-check`` / ``sglang-check``): the title line, then one line per stage and the
    first 20 missing tensors of each."""
    click.echo(title)
    for s in stages:
        click.echo(f"  {s.name:<13} {s.status:<8} {s.message}")
        for name in s.details.get("missing", [])[:20]:
            click.echo(f"      missing: {name}")
