"""Commands that make and publish a release: ``card``, ``push``, ``example build``, ``quickstart``."""

from __future__ import annotations

import json

import click

from dsparkhub.cli.errors import fail
from dsparkhub.cli.render import (
    echo_json,
    hide_transformers_progress,
    print_plan,
    print_push,
    print_push_plan,
    print_report,
    print_spec,
)
from dsparkhub.secrets import redact

#: ``--sla-tokens-per-s`` of ``compare`` and ``card``: per-user SLAs for the "highest total throughput" row
SLA_OPTION = click.option("--sla-tokens-per-s", "slas", multiple=True, type=click.FloatRange(min=0, min_open=True),
                          help="Per-user tokens/s SLA (repeat): the highest total tokens/s still meeting it, per "
                               "configuration, interpolated along its throughput curve.")


@click.command()
@click.argument("draft", type=click.Path())
@click.option("--results", "results_paths", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Results file from `dsparkhub verify` (repeat for several engines / dataset sets).")
@click.option("--template", type=click.Path(), help="Jinja2 template replacing dsparkhub's model_card.md.j2.")
@click.option("--license", "license_", help="Hub license id (default: the target manifest's, e.g. `other` + "
              "`license_name: modified-mit` for Kimi K2; else apache-2.0).")
@click.option("--base-model", help="The target's Hub repo id, named by every card line that names the target "
              "(default: from provenance / results / the local target's config; refused when none is known).")
@click.option("--repo-id", help="This drafter's Hub repo id (NS/NAME), used in the serve commands.")
@click.option("--overwrite", is_flag=True, help="Replace a README.md that dsparkhub did not write.")
@click.option("--checks", "check_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`vllm-check --json` / `sglang-check --json` report: the card says which engines' checks passed.")
@click.option("--compare", "compare_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Results file of another drafter of the same target (repeat): the card gets the comparison tables.")
@click.option("--schedule", "schedule_path", type=click.Path(exists=True, dir_okay=False),
              help="`dsparkhub schedule --out` report: the card's 'Where the time goes' compares the policies.")
@SLA_OPTION
def card(draft, results_paths, template, license_, base_model, repo_id, overwrite, check_paths,
         compare_paths, schedule_path, slas) -> None:
    """Write README.md (model card) and plots into the drafter folder from verify results files."""
    from dsparkhub.card.render import write_card

    out = write_card(draft, list(results_paths), template=template, license=license_, base_model=base_model,
                     repo_id=repo_id, overwrite=overwrite, checks=list(check_paths),
                     compare=list(compare_paths), schedule=schedule_path, slas=tuple(slas))
    click.echo(f"wrote {out.readme}")
    for p in out.plots:
        click.echo(f"wrote {p}")
    if not repo_id:
        from dsparkhub.card.tables import MODEL_PLACEHOLDER

        click.echo(f"warning: the serve commands name the drafter `{MODEL_PLACEHOLDER}/...` (no --repo-id): a preview "
                   "that `push` refuses; write the card again with --repo-id NS/NAME before publishing", err=True)


@click.command("compare")
@click.argument("results_paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@SLA_OPTION
def compare(results_paths, slas) -> None:
    """Compare drafters from `dsparkhub verify` results files: per target, mean speedup at n=3 / n=7 and the
    change, and τ / tokens/s per concurrency with the crossover (means unweighted over datasets); per file, the
    per-user speedup at matched total throughput, the SLA row and the best configuration per concurrency."""
    from dsparkhub.compare import compare as compare_results
    from dsparkhub.compare import format_text, load_sources

    click.echo(format_text(compare_results(load_sources(list(results_paths)), slas=tuple(slas))))


@click.command()
@click.argument("draft", type=click.Path(file_okay=False))
@click.option("--repo", "repo_id", required=True, help="Hub repo id NAMESPACE/NAME (created when missing).")
@click.option("--revision", help="Branch to push to (default main; created from main when missing).")
@click.option("--private", is_flag=True, help="Create the repo private (no effect on an existing repo).")
@click.option("--dry-run", is_flag=True, help="Show the plan; send only read requests.")
@click.option("--force", is_flag=True, help="Push despite validation errors (recorded in the commit message).")
@click.option("--endpoint", help="Hub URL (default HF_ENDPOINT or https://huggingface.co); rehearse on the local "
              "Hub of `dsparkhub hub serve` with the endpoint and --token it prints.")
@click.option("--target", help="Target to validate against (folder or Hub repo id).")
@click.option("--expect-head", help="Refuse unless the branch head is still this commit (the one --dry-run showed).")
@click.option("--token", help="Hub token with write access (default HF_TOKEN or `hf auth login`).")
@click.option("--include", multiple=True, help="Push only files matching this pattern (fnmatch; repeatable), as "
              "`hf upload --include`.")
@click.option("--exclude", multiple=True, help="Do not push files matching this pattern (repeatable).")
@click.option("--delete", multiple=True, help="Delete files on the Hub that the folder lacks and that match this "
              "pattern (repeatable; default: keep them, as `hf upload`). README.md goes only when named exactly.")
@click.option("--commit-message", help="Commit summary (default: the counts of added / changed / deleted files).")
@click.option("--commit-description", help="Text put before dsparkhub's own commit description.")
@click.option("--create-pr", is_flag=True, help="Open a pull request against main instead of committing to it.")
@click.option("--json", "as_json", is_flag=True, help="Print the push report as JSON.")
def push(draft, repo_id, revision, private, dry_run, force, endpoint, target, expect_head, token, include, exclude,
         delete, commit_message, commit_description, create_pr, as_json) -> None:
    """Push a drafter folder to the Hub as one commit, as `hf upload` does (files on the Hub that the folder lacks
    are kept unless --delete), after validation and a check of the card's serve commands."""
    from dsparkhub.hub.push import push as push_folder

    if create_pr and revision not in (None, "main"):
        raise click.UsageError("--create-pr opens a pull request against main; drop --revision")
    shown = []

    def on_plan(planned) -> None:  # the plan before the upload: a long upload starts with what it will send
        if not as_json:
            print_push_plan(planned)
            shown.append(True)

    report = push_folder(draft, repo_id, revision=revision, private=private, dry_run=dry_run, force=force,
                         endpoint=endpoint, target=target, expect_head=expect_head, token=token,
                         include=list(include), exclude=list(exclude), delete=list(delete),
                         commit_message=commit_message, commit_description=commit_description, create_pr=create_pr,
                         on_plan=on_plan)
    if as_json:
        click.echo(redact(json.dumps(report.to_dict(), indent=2, default=str)))
    else:
        print_push(report, plan_shown=bool(shown))


@click.group()
def example() -> None:
    """The embedded example: a tiny trained Qwen3 target with a DSpark and a DFlash drafter (built offline)."""


@example.command("build")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache root (default $DSPARKHUB_CACHE or "
              "~/.cache/dsparkhub).")
@click.option("--force", is_flag=True, help="Redo the cached folder even when a complete one exists.")
@click.option("--from-scratch", is_flag=True, help="Train a new build (minutes on 2 cores; float training differs "
              "across CPUs, so its τ differs a little from the shipped build's).")
@click.option("--json", "as_json", is_flag=True, help="Print paths and info as JSON.")
def example_build(cache_dir: str | None, force: bool, from_scratch: bool, as_json: bool) -> None:
    """Lay out the shipped example in the cache (or train one) and print where its folders are and its measured τ."""
    from dsparkhub.example import build_example

    ex = build_example(cache_dir, force=force, from_scratch=from_scratch,
                       progress=lambda line: click.echo(line, err=True))
    paths = {"root": str(ex.root), "target": str(ex.target), "deepspec_run": str(ex.deepspec_run),
             "dspark_step": str(ex.dspark_step), "dflash": str(ex.dflash), "prompts": str(ex.prompts)}
    if as_json:
        echo_json({**paths, "info": ex.info})
        return
    for k, v in paths.items():
        click.echo(f"  {k:<13} {v}")
    secs = ex.info.get("seconds", {})
    click.echo("  trained in    " + ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in secs.items()))
    for name, taus in ex.info.get("tau", {}).items():
        click.echo(f"  tau {name:<9} " + ", ".join(f"n={n}: {t:.2f}" for n, t in taus.items())
                   + f" (greedy, reference engine, {ex.info['eval']['num_prompts']} held-out prompts)")


@click.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--repo", "repo_id", help="Also plan a push to this real Hub repo (--dry-run: read requests only).")
@click.option("--max-new-tokens", type=click.IntRange(min=8), default=96, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bars.")
def quickstart(outdir: str, repo_id: str | None, max_new_tokens: int, quiet: bool) -> None:
    """Run the main job on the embedded example: build it (cached), inspect, convert, validate, verify (reference
    engine), card, and push to a local Hub started for the occasion. Re-running replaces OUTDIR's contents."""
    from dsparkhub.pipeline import quickstart as run_quickstart
    from dsparkhub.verify.results.table import format_summary_table

    if quiet:
        hide_transformers_progress()

    headers = {
        "example": "== 1/7 example: a tiny Qwen3 target and a DSpark drafter trained on it (DeepSpec layout)",
        "inspect": "== 2/7 inspect the training output (headers only)",
        "convert": "== 3/7 convert to the layout vLLM 0.32 loads",
        "validate": "== 4/7 validate against the target (headers only)",
        "verify": "== 5/7 verify with the reference engine (CPU): lossless, τ, speedup per num_speculative_tokens",
        "card": "== 6/7 model card from the results",
        "push": "== 7/7 push",
    }

    def finished(step: str, q) -> None:
        if step == "example":
            click.echo(f"  target        {q.example.target}\n  drafter run   {q.example.deepspec_run}")
        elif step == "inspect":
            click.echo(f"{q.source.checkpoint.path}  [{q.source.recipe.title}]")
            print_spec(q.source.spec.summary(), q.source.checkpoint.files)
        elif step == "convert":
            print_plan(q.conversion.plan)
            click.echo(f"wrote {q.conversion.out}")
        elif step == "validate":
            click.echo(f"{q.report.draft}  [{q.report.layout}]")
            print_report(q.report)
        elif step == "verify":
            click.echo(format_summary_table(q.results))
            click.echo(f"wrote {q.results_path}")
        elif step == "card":
            for p in q.card.plots:
                click.echo(f"wrote {p}")
        elif step == "local_hub":
            click.echo(f"  local Hub at {q.hub_url} (pass --repo NS/NAME to plan a push to the real Hub instead)")
        elif step == "push":
            print_push(q.push, plan_shown=bool(shown))

    shown = []

    def on_plan(planned) -> None:  # the plan before the upload, as `dsparkhub push` prints it (issue 29 item 8)
        print_push_plan(planned)
        shown.append(True)

    q = run_quickstart(outdir, repo_id=repo_id, max_new_tokens=max_new_tokens, progress=not quiet,
                       starting=lambda step: click.echo(headers[step]), finished=finished, on_plan=on_plan)
    if not q.ok:
        fail()
    click.echo(f"card: {q.card.readme}")
