"""Commands on a drafter's checkpoint: ``inspect``, ``validate``, ``convert`` (and ``--attach``), ``detach``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dsparkhub.cli.errors import fail
from dsparkhub.cli.options import ALLOW_PICKLE_HELP, OVERWRITE_HELP, ByteSize, int_list, layout_name, pickle_source
from dsparkhub.cli.render import convert_bars, echo_json, fmt_bytes, print_plan, print_report, print_spec, working
from dsparkhub.serving import engine_names


@click.command()
@click.argument("path", type=click.Path())
@click.option("--layout", help="Force the source layout (a converters/ recipe name) instead of detecting it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with the tensor list) instead of a summary.")
@click.option("--allow-pickle", is_flag=True, help=ALLOW_PICKLE_HELP)
def inspect(path: str, layout: str | None, as_json: bool, allow_pickle: bool) -> None:
    """Describe a drafter checkpoint (any known layout) from its config and safetensors headers."""
    from dsparkhub.layouts.reading import open_draft

    d = open_draft(pickle_source(path, allow_pickle), layout=layout)
    if as_json:
        echo_json({**d.spec.to_dict(), "path": d.checkpoint.path, "files": d.checkpoint.files})
        return
    click.echo(f"{d.checkpoint.path}  [{d.recipe.title}]")
    print_spec(d.spec.summary(), d.checkpoint.files)


@click.command()
@click.argument("draft", type=click.Path())
@click.option("--target", help="Target: local HF folder, Hub repo id (headers only are read) or manifest name "
              "(`dsparkhub manifests list`).")
@click.option("--num-speculative-tokens", "-n", callback=lambda ctx, param, v: None if v is None else
              max(int_list(ctx, param, v)), help="The n you will serve with (3,5,7: the largest is checked).")
@click.option("--layout", help="Force the drafter's layout instead of detecting it.")
@click.option("--engine", type=click.Choice(engine_names()), default="vllm", show_default=True,
              help="The engine that will read the target's hidden states (the last layer is pre-norm in vLLM and "
                   "SGLang, normed in the reference engine's HF output_hidden_states).")
@click.option("--vllm-version", help="With --engine vllm / vllm-serve: judge with this vLLM version's contract, for a "
                                     "node you are not on (default: the installed vLLM's, else the newest supported).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--deep", is_flag=True, help="Also read the drafter's tensor data and report NaN / Inf (DSH207).")
@click.option("--save", is_flag=True, help="Also write the settings-independent outcome as validation.json into the "
              "drafter folder (what verify, push and card read; default: print only, write nothing).")
def validate(draft: str, target: str | None, num_speculative_tokens: int | None, layout: str | None,
             engine: str, vllm_version: str | None, as_json: bool, deep: bool, save: bool) -> None:
    """Check a drafter against its target and the vLLM contract of the installed (or --vllm-version) vLLM (configs
    and headers only; --deep reads the data too). Exit 1 on errors."""
    from dsparkhub.validate import validate as run_validate
    from dsparkhub.verify.vllm.contract import installed_contract

    if vllm_version is not None and not engine.startswith("vllm"):
        raise click.UsageError(f"--vllm-version judges with a vLLM contract; --engine {engine} is not vLLM")
    contract = installed_contract(vllm_version) if engine.startswith("vllm") else None
    facts = contract.validate_facts() if contract is not None else None

    if save:
        from dsparkhub.layouts.reading import open_draft
        from dsparkhub.target import open_target
        from dsparkhub.validate import validate_base
        from dsparkhub.validate.record import make_record, write_record
        from dsparkhub.validate.settings import check_engine

        check_engine(engine)
        d = open_draft(draft, layout=layout)
        if d.checkpoint.remote:
            raise click.UsageError("--save writes into a local drafter folder; this drafter is on the Hub")
        t = open_target(target) if target else None
        base = validate_base(d, t, deep=deep)
        report = base.report(str(d.checkpoint.path), num_speculative_tokens=num_speculative_tokens, engine=engine,
                             vllm=facts)
        click.echo(f"wrote {write_record(d.checkpoint.path, make_record(base, d, t))}", err=True)
    else:
        report = run_validate(draft, target, num_speculative_tokens=num_speculative_tokens, layout=layout,
                              engine=engine, deep=deep, vllm=facts)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"{report.draft}  [{report.layout}]")
        if contract is not None:
            click.echo(f"vLLM contract: line {contract.line} (vLLM {contract.version})"
                       + (f"; note: {contract.note()}" if contract.note() else ""))
        print_report(report)
    if not report.ok:
        fail()


@click.command()
@click.argument("src", type=click.Path())
@click.option("--target", help="Target: local HF folder, Hub repo id or manifest name (required unless --attach).")
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder (must not exist, unless "
              "--overwrite and dsparkhub wrote it).")
@click.option("--to", "to", default="vllm", show_default=True, callback=lambda ctx, param, v: layout_name(param, v),
              help="Output layout (a converters/ recipe name).")
@click.option("--layout", help="Force the source layout instead of detecting it.")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@click.option("--force", is_flag=True, help="Convert even when validation against the target finds errors.")
@click.option("--keep-embeddings", is_flag=True, help="Keep embed_tokens / lm_head copies even when identical "
              "to the target's.")
@click.option("--allow-different-embeddings", is_flag=True, help="Convert even when a frozen embedding / LM-head "
              "copy (DeepSpec) differs from the target's (DSH312: trained for another target); the copy is kept.")
@click.option("--max-shard-size", type=ByteSize(), help="Output shard cap: bytes, or 500MB / 4GiB / ... (default: "
              "largest tensor + 256 MiB).")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan / result as JSON.")
@click.option("--draft-vocab", type=click.IntRange(min=1), help="Write a reduced draft vocab of this many tokens "
              "(lm_head / markov_w2 rows + d2t), the most frequent in --draft-vocab-from.")
@click.option("--draft-vocab-from", multiple=True, help="Text to count for --draft-vocab: JSONL files (turns / "
              "prompt / prompt_token_ids) or builtin[:math|code|chat]; ideally samples of the target's own outputs.")
@click.option("--declare-block-layout", type=click.Choice(["anchor_first", "one_plus_n"]),
              help="State the drafter's block layout when its config implies the other one; the output then "
                   "proposes a different number of tokens per block (recorded in provenance).")
@click.option("--attach", "attach_to", type=click.Path(), help="Write OUT = this DeepSeek-V4-style target folder "
              "with the drafter attached (mtp.* shards, dspark_* keys); target shards are hard-linked, not rewritten.")
@click.option("--attach-as", type=click.Choice(["mtp", "dspark-subfolder"]), default="mtp", show_default=True,
              help="With --attach: `mtp` = the DeepSeek-V4 form (mtp.* shards, dspark_* keys); `dspark-subfolder` = "
                   "any target with the converted drafter under dspark/, which SGLang 0.5.23 finds by itself.")
@click.option("--symlink", "link", flag_value="symlink", help="With --attach: symlink the target's files.")
@click.option("--copy", "link", flag_value="copy", help="With --attach: copy the target's files.")
@click.option("--allow-pickle", is_flag=True, help=ALLOW_PICKLE_HELP)
@click.option("--base-model", help="The target's Hub repo id, written wherever the output names the target "
              "(speculators' verifier, provenance, validation.json; the card) instead of a local path (default: the "
              "target's config `_name_or_path`, or the manifest its headers match).")
def convert(src, target, out, to, layout, overwrite, force, keep_embeddings, allow_different_embeddings,
            max_shard_size, dry_run, as_json, draft_vocab, draft_vocab_from, declare_block_layout, attach_to, attach_as,
            link, allow_pickle, base_model):
    """Convert a trained drafter (DeepSpec step/run folder, ...) into a checkpoint vLLM 0.32 loads."""
    from dsparkhub.convert import PROVENANCE_FILE, convert as run_convert
    from dsparkhub.convert.plan import plan_conversion
    from dsparkhub.io.output import refuse_overlap
    from dsparkhub.io.ownership import claim_output

    # OUT first, before anything is read, planned or printed: a refusal costs nothing (and names OUT)
    local_target = attach_to or (target if target and Path(target).is_dir() else None)
    refuse_overlap(out, {"drafter": src, "target": local_target})
    claim_output(out, overwrite=overwrite)
    named, src = src, pickle_source(src, allow_pickle)

    if attach_to:
        if dry_run:
            raise click.UsageError("--dry-run plans standalone conversions; --attach has no dry run (it writes OUT "
                                   "from hard links, which is cheap: write it and `dsparkhub detach` to inspect)")
        if draft_vocab:
            raise click.UsageError("--draft-vocab is for standalone outputs: an attached V4 drafter shares the "
                                   "target's LM head")
        if attach_as == "dspark-subfolder":
            from dsparkhub.attach_subfolder import attach_subfolder

            with working("attaching: linking the target's files, writing the drafter under dspark/"):
                r = attach_subfolder(src, attach_to, out, layout=layout, link=link or "auto", overwrite=overwrite,
                                     force=force, max_shard_bytes=max_shard_size)
            if as_json:
                echo_json({"out": str(r.out), "linked": r.linked, "draft_files": r.draft_files, "notes": r.notes})
                return
            click.echo(f"attached {src} as {r.out}/dspark ({len(r.linked)} target file(s) linked; "
                       f"{', '.join(r.draft_files)}); SGLang finds it without --speculative-draft-model-path, "
                       f"vLLM with \"model\": \"{r.out}/dspark\"")
            return
        _attach(src, attach_to, out, layout=layout, link=link or "auto", overwrite=overwrite, force=force,
                max_shard_size=max_shard_size, as_json=as_json)
        return
    if not target:
        raise click.UsageError("--target is required (or --attach TARGET_DIR)")
    if bool(draft_vocab) != bool(draft_vocab_from):
        raise click.UsageError("--draft-vocab N and --draft-vocab-from DATASET go together")
    plan = plan_conversion(src, target, to=to, layout=layout, force=force, keep_embeddings=keep_embeddings,
                           declare_block_layout=declare_block_layout, draft_vocab=draft_vocab,
                           draft_vocab_from=list(draft_vocab_from),
                           allow_different_embeddings=allow_different_embeddings, base_model=base_model)
    if dry_run:
        from dsparkhub.convert import check_output

        check_output(out, plan, src=src, overwrite=overwrite, pickle_origin=named if src != named else None)
        if as_json:
            echo_json(plan.to_dict())
            return
        print_plan(plan)
        click.echo("dry run: nothing written")
        return
    if not as_json:
        print_plan(plan)  # before writing: a long copy starts with what it will do
    with convert_bars() as progress:
        result = run_convert(src, out, target, overwrite=overwrite, max_shard_bytes=max_shard_size, plan=plan,
                             pickle_origin=named if src != named else None, base_model=base_model, progress=progress)
    if as_json:
        echo_json({"out": str(result.out), "files": result.files, "provenance": result.provenance})
        return
    index = ["model.safetensors.index.json"] if (Path(result.out) / "model.safetensors.index.json").exists() else []
    click.echo(f"wrote {result.out} ({', '.join([*result.files, *index])}, config.json, {PROVENANCE_FILE})")


def _attach(src, target_dir, out, *, layout, link, overwrite, force, max_shard_size, as_json) -> None:
    from dsparkhub.attach import attach

    with working("attaching: checking the target, linking its shards, writing the mtp.* shards"):
        r = attach(src, target_dir, out, layout=layout, link=link, overwrite=overwrite, force=force,
                   max_shard_bytes=max_shard_size)
    if as_json:
        echo_json({"out": str(r.out), "linked": r.linked, "added_files": r.added_files, "tensors": r.tensors,
                   "dropped": r.dropped, "config_keys": r.config_keys,
                   "target_data_bytes_read": r.target_data_bytes_read, "drafter_bytes_written": r.drafter_bytes_written,
                   "notes": r.notes})
        return
    kinds: dict[str, int] = {}
    for how in r.linked.values():
        kinds[how] = kinds.get(how, 0) + 1
    click.echo(f"attached {src} into {target_dir} -> {r.out}")
    click.echo(f"  target files: {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} (none rewritten)")
    click.echo(f"  drafter: {len(r.tensors)} tensors, {fmt_bytes(r.drafter_bytes_written)} in "
               f"{', '.join(r.added_files)}")
    for x in r.dropped:
        click.echo(f"  left out {x['name']}: {x['reason']}")
    click.echo(f"  config keys: {json.dumps(r.config_keys)}")
    click.echo(f"  target tensor bytes read: {r.target_data_bytes_read}")
    for note in r.notes:
        click.echo(f"  note: {note}")


@click.command()
@click.argument("attached", type=click.Path())
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder for the drafter.")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
def detach(attached: str, out: str, overwrite: bool) -> None:
    """Extract the drafter of an attached (DeepSeek-V4-style) checkpoint into a standalone folder."""
    from dsparkhub.attach import detach as run_detach

    with working("detaching: reading the mtp.* tensors, writing the drafter"):
        r = run_detach(attached, out, overwrite=overwrite)
    how = "restored exactly as attached" if r.restored else "mtp.* tensors + config (deepseek-v4 layout)"
    click.echo(f"wrote {r.out} ({', '.join(r.files)}): {how}; layout {r.layout}; "
               f"{fmt_bytes(r.drafter_bytes_read)} of drafter tensors read")
