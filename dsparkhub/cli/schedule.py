"""``dsparkhub schedule``: the latency law and confidence-scheduled verification measured on the reference engine."""

from __future__ import annotations

import shlex

import click

from dsparkhub.cli.options import int_list
from dsparkhub.cli.render import hide_transformers_progress


def _policies(ctx, param, value: str):
    from dsparkhub.errors import VerifyError
    from dsparkhub.verify.reference.policies import parse_policies

    try:
        return parse_policies(value)
    except VerifyError as exc:
        raise click.BadParameter(exc.message) from None


def _int_list_or_none(ctx, param, value: str) -> list[int]:
    return [] if value.strip().lower() == "none" else int_list(ctx, param, value)


@click.command()
@click.argument("draft", type=click.Path(exists=True))
@click.option("--target", required=True, help="Target: HF folder (with tokenizer).")
@click.option("--datasets", multiple=True, help="As for verify: PATH.jsonl, NAME=PATH, builtin, "
              "builtin:math|code|chat, hub:owner/name[:file.jsonl]. Default: the built-in smoke set.")
@click.option("--max-prompts", type=click.IntRange(min=1), help="Use at most this many prompts per dataset.")
@click.option("--repeat-prompts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run every prompt this many times (more steady steps at high concurrency).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--policy", "policies", default="static,threshold:0.5,budget,sps", show_default=True,
              callback=_policies, help="Comma-separated: static, threshold:T, budget (vLLM 0.34 adaptive "
              "verification), sps (SGLang 0.5.23 SPS scheduler); run at n = the block size.")
@click.option("--concurrency", "concurrencies", default="1,4,16", show_default=True, callback=int_list,
              help="Requests in flight for the policy table.")
@click.option("--law-n", "law_ns", default="3,7", show_default=True, callback=_int_list_or_none,
              help="n values of the latency-law table (static n; 'none' to skip).")
@click.option("--law-concurrency", "law_concurrencies", default="1,8", show_default=True,
              callback=_int_list_or_none, help="Concurrencies of the latency-law table ('none' to skip).")
@click.option("--sts", type=click.Path(exists=True, dir_okay=False),
              help="STS sidecar (dsparkhub calibrate): policies also run with calibrated confidences.")
@click.option("--sps-out", type=click.Path(dir_okay=False),
              help="SPS table path (default DRAFT/dspark_sps_table.json).")
@click.option("--no-sps-table", is_flag=True, help="Do not write the SPS table.")
@click.option("--sps-from", default="reference", show_default=True,
              help="The SPS table's costs: reference (this run's profile), vllm-forward (`vllm bench forward`, "
              "vLLM 0.33+, on this node's GPU) or sglang=http://HOST:PORT (SGLang's dspark_sps_profiler against a "
              "running DSpark server).")
@click.option("--out", "report_out", type=click.Path(dir_okay=False),
              help="Also write the report as JSON (for `dsparkhub card --schedule`).")
@click.option("--overwrite", is_flag=True, help="Replace an existing SPS table (and --out report).")
@click.option("--device", default="cpu", show_default=True, help="Reference engine device (cpu, cuda).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def schedule(draft, target, datasets, max_prompts, repeat_prompts, max_new_tokens, policies, concurrencies, law_ns,
             law_concurrencies, sts, sps_out, no_sps_table, sps_from, report_out, overwrite, device,
             quiet) -> None:
    """Where the time goes, on the reference engine (greedy): T_draft and T_verify per step shape, the predicted
    speedup by L = (T_draft + T_verify) / τ beside the measured one, and static vs confidence-scheduled
    verification (threshold, vLLM's budget, SGLang's SPS) with raw and STS confidences, lossless checked. Writes
    the SGLang SPS table (--speculative-dspark-sps-table-path) beside the drafter."""
    from dsparkhub.verify.schedule import format_report, schedule_release

    if quiet:
        hide_transformers_progress()
    report, path = schedule_release(
        draft, target, datasets=list(datasets), max_prompts=max_prompts, repeat_prompts=repeat_prompts,
        sps_out=sps_out, write_sps=not no_sps_table, overwrite=overwrite, report_out=report_out, sps_from=sps_from,
        warn=lambda line: click.echo(line, err=True), policies=policies, concurrencies=concurrencies,
        law_ns=law_ns, law_concurrencies=law_concurrencies, sts=sts, max_new_tokens=max_new_tokens, device=device,
        progress=None if quiet else (lambda line: click.echo(line, err=True)))
    click.echo(format_report(report))
    if report_out is not None:
        click.echo(f"wrote {report_out} (the card reads it: dsparkhub card DRAFT --results R --schedule "
                   f"{shlex.quote(str(report_out))})")
    if path is not None:
        import json

        label = json.loads(path.read_text(encoding="utf-8"))
        click.echo(f"wrote {path} (costs of {label['engine']} on {label['hardware']})")
        click.echo(f"serve with SGLang: --speculative-dspark-sps-table-path {shlex.quote(str(path))}")
