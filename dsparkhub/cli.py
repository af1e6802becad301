"""The ``dsparkhub`` command line: one click group, an error -> message table, exit codes.

Exit codes: 0 ok; 1 when the command could not do its job (bad input, validation errors, lossless broken, engine
refused); 2 for usage errors (click's own); 130 when interrupted (Ctrl-C). ``--debug`` or ``DSPARKHUB_DEBUG=1`` shows
tracebacks.

Only this module prints. Each command parses its options, calls one library function and renders its result.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
import traceback
from pathlib import Path

import click

from dsparkhub import __version__
from dsparkhub.errors import DsparkhubError


def _debug_enabled(ctx: click.Context | None) -> bool:
    if os.environ.get("DSPARKHUB_DEBUG", "") not in ("", "0"):
        return True
    while ctx is not None:
        if ctx.obj and ctx.obj.get("debug"):
            return True
        ctx = ctx.parent
    return False


def _redact(text: str) -> str:
    """Remove any Hugging Face token value present in the environment from ``text``."""
    from dsparkhub.secrets import redact

    return redact(text)


def handle_errors(fn):
    """Turn dsparkhub's own errors (and OS errors on the user's files) into one paragraph and exit code 1; Ctrl-C
    into exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            # shells expect 128 + SIGINT; click would turn this into "Aborted!" and exit 1. Outputs are written
            # through temporary files and renames, so nothing half-written is left under the final names.
            click.echo("\ninterrupted (Ctrl-C): nothing half-written was left in place", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # the reader of our stdout left (`dsparkhub inspect X | head`): stop quietly, as the Python docs advise
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except (DsparkhubError, OSError) as exc:
            ctx = click.get_current_context(silent=True)
            if _debug_enabled(ctx):
                click.echo(_redact(traceback.format_exc()), err=True)
            name = type(exc).__name__
            click.echo(_redact(f"Error ({name}): {exc}"), err=True)
            sys.exit(1)

    return wrapper


def _hide_transformers_progress() -> None:
    """--quiet: also hide transformers' own "Loading weights" bar."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def echo_json(obj) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dsparkhub")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors (also DSPARKHUB_DEBUG=1).")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Convert, validate, verify, card and push DSpark speculative-decoding drafters."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# ---- commands (one section each; keep each command thin: parse options, call the library, render) ----------


# ---- inspect / convert / validate (lead) ----------------------------------------------------------------------


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_spec(summary: dict, files: list[str]) -> None:
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
        ("parameters", f"{s['num_parameters']:,}"), ("bytes", _fmt_bytes(s["total_bytes"])),
        ("files", ", ".join(files)),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"  {k:<{width}}  {v}")
    for note in s.get("notes") or []:
        click.echo(f"  note: {note}")


class _ByteSize(click.ParamType):
    """A positive byte count: ``123456``, ``500MB``, ``4GiB`` (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB)."""

    name = "size"
    UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            n = value
        else:
            text = str(value).strip().replace("_", "")
            num = text.rstrip("BbIiKkMmGgTt")
            unit = text[len(num):].upper()
            try:
                n = int(float(num) * self.UNITS[unit])
            except (ValueError, KeyError, OverflowError):  # OverflowError: inf, 1e400
                self.fail(f"{value!r} is not a size (e.g. 1000000, 500MB, 4GiB)", param, ctx)
        if n < 1:
            self.fail(f"{value!r}: a shard cap must be at least 1 byte", param, ctx)
        return n


def _layout_name(param, value: str | None) -> str | None:
    """A ``converters/`` recipe name, or a usage error (exit 2) that lists the known ones."""
    from dsparkhub.layouts.recipes import load_recipes

    if value is None:
        return None
    names = [r.name for r in load_recipes()]
    if value not in names:
        import difflib

        close = difflib.get_close_matches(value, names, n=2)
        raise click.BadParameter(f"unknown layout {value!r}" + (f" (did you mean {' or '.join(close)}?)" if close
                                                                  else "") + f"; known: {', '.join(names)}",
                                 param=param)
    return value


_ALLOW_PICKLE_HELP = ("When the only weights are .bin / .pt / .pth pickle files, read them with "
                      "torch.load(weights_only=True) (never a full unpickle) into a temporary safetensors copy.")


def _pickle_source(path: str, allow_pickle: bool) -> str:
    """``path``, or with ``--allow-pickle`` a temporary safetensors copy of a pickle-only checkpoint."""
    if not allow_pickle:
        return path
    from dsparkhub.io.checkpoint import resolve_pickle

    resolved = resolve_pickle(path)
    if str(resolved) != str(path):
        click.echo(f"note: read pickle weights of {path} with torch.load(weights_only=True) into {resolved}",
                   err=True)
    return str(resolved)


@main.command()
@click.argument("path", type=click.Path())
@click.option("--layout", help="Force the source layout (a converters/ recipe name) instead of detecting it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with the tensor list) instead of a summary.")
@click.option("--allow-pickle", is_flag=True, help=_ALLOW_PICKLE_HELP)
@handle_errors
def inspect(path: str, layout: str | None, as_json: bool, allow_pickle: bool) -> None:
    """Describe a drafter checkpoint (any known layout) from its config and safetensors headers."""
    from dsparkhub.layouts.recipes import open_draft

    d = open_draft(_pickle_source(path, allow_pickle), layout=layout)
    if as_json:
        echo_json({**d.spec.to_dict(), "path": d.checkpoint.path, "files": d.checkpoint.files})
        return
    click.echo(f"{d.checkpoint.path}  [{d.recipe.title}]")
    _print_spec(d.spec.summary(), d.checkpoint.files)


def _print_report(report) -> None:
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


@main.command()
@click.argument("draft", type=click.Path())
@click.option("--target", help="Target: local HF folder, Hub repo id (headers only are read) or manifest name "
              "(`dsparkhub manifests list`).")
@click.option("--num-speculative-tokens", "-n", callback=lambda ctx, param, v: None if v is None else
              max(_int_list(ctx, param, v)), help="The n you will serve with (3,5,7: the largest is checked).")
@click.option("--layout", help="Force the drafter's layout instead of detecting it.")
@click.option("--engine", type=click.Choice(["vllm", "reference"]), default="vllm", show_default=True,
              help="The engine that will read the target's hidden states (the last layer is pre-norm in vLLM, normed "
                   "in the reference engine's HF output_hidden_states).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--deep", is_flag=True, help="Also read the drafter's tensor data and report NaN / Inf (DSH207).")
@handle_errors
def validate(draft: str, target: str | None, num_speculative_tokens: int | None, layout: str | None,
             engine: str, as_json: bool, deep: bool) -> None:
    """Check a drafter against its target and vLLM 0.32's contract (configs and headers only; --deep reads the
    data too). Exit 1 on errors."""
    from dsparkhub.validate import validate as run_validate

    report = run_validate(draft, target, num_speculative_tokens=num_speculative_tokens, layout=layout,
                          engine=engine, deep=deep)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"{report.draft}  [{report.layout}]")
        _print_report(report)
    if not report.ok:
        sys.exit(1)


@main.command()
@click.argument("src", type=click.Path())
@click.option("--target", help="Target: local HF folder, Hub repo id or manifest name (required unless --attach).")
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder (must not exist).")
@click.option("--to", "to", default="vllm", show_default=True, callback=lambda ctx, param, v: _layout_name(param, v),
              help="Output layout (a converters/ recipe name).")
@click.option("--layout", help="Force the source layout instead of detecting it.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder (atomically).")
@click.option("--force", is_flag=True, help="Convert even when validation against the target finds errors.")
@click.option("--keep-embeddings", is_flag=True, help="Keep embed_tokens / lm_head copies even when identical "
              "to the target's.")
@click.option("--allow-different-embeddings", is_flag=True, help="Convert even when a frozen embedding / LM-head "
              "copy (DeepSpec) differs from the target's (DSH312: trained for another target); the copy is kept.")
@click.option("--max-shard-size", type=_ByteSize(), help="Output shard cap: bytes, or 500MB / 4GiB / ... (default: "
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
@click.option("--allow-pickle", is_flag=True, help=_ALLOW_PICKLE_HELP)
@click.option("--base-model", help="The target's Hub repo id, recorded in provenance for the card (default: the "
              "target's config `_name_or_path`, or the manifest its headers match).")
@handle_errors
def convert(src, target, out, to, layout, overwrite, force, keep_embeddings, allow_different_embeddings,
            max_shard_size, dry_run, as_json, draft_vocab, draft_vocab_from, declare_block_layout, attach_to, attach_as,
            link, allow_pickle, base_model):
    """Convert a trained drafter (DeepSpec step/run folder, ...) into a checkpoint vLLM 0.32 loads."""
    from dsparkhub.convert import convert as run_convert, plan_conversion

    named, src = src, _pickle_source(src, allow_pickle)

    if attach_to:
        if dry_run:
            raise click.UsageError("--dry-run plans standalone conversions; --attach has no dry run (it writes OUT "
                                   "from hard links, which is cheap: write it and `dsparkhub detach` to inspect)")
        if draft_vocab:
            raise click.UsageError("--draft-vocab is for standalone outputs: an attached V4 drafter shares the "
                                   "target's LM head")
        if attach_as == "dspark-subfolder":
            from dsparkhub.attach_subfolder import attach_subfolder

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
                           allow_different_embeddings=allow_different_embeddings)
    if dry_run:
        from dsparkhub.convert import check_output

        check_output(out, plan, src=src, overwrite=overwrite, pickle_origin=named if src != named else None)
        if as_json:
            echo_json(plan.to_dict())
            return
        _print_plan(plan)
        click.echo("dry run: nothing written")
        return
    if not as_json:
        _print_plan(plan)  # before writing: a long copy starts with what it will do
    with _convert_bars() as progress:
        result = run_convert(src, out, target, overwrite=overwrite, max_shard_bytes=max_shard_size, plan=plan,
                             pickle_origin=named if src != named else None, base_model=base_model, progress=progress)
    if as_json:
        echo_json({"out": str(result.out), "files": result.files, "provenance": result.provenance})
        return
    index = ["model.safetensors.index.json"] if (Path(result.out) / "model.safetensors.index.json").exists() else []
    click.echo(f"wrote {result.out} ({', '.join([*result.files, *index])}, config.json, dsparkhub_provenance.json)")


@contextlib.contextmanager
def _convert_bars():
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


def _print_plan(plan) -> None:
    d = plan.draft
    click.echo(f"convert {d.checkpoint.path} [{d.recipe.name}] -> [{plan.recipe.name}]"
               + (f" for target {plan.target.source}" if plan.target else ""))
    copies = plan.copies
    count = len(copies) + len(plan.derived) + len(plan.reduced)
    click.echo(f"  tensors to write: {count} ({_fmt_bytes(plan.out_bytes)})")
    for note in d.spec.notes:  # e.g. a block layout declared with --declare-block-layout
        click.echo(f"  note: {note}")
    for x in plan.decisions:
        if x.action == "drop" or x.reason:
            click.echo(f"  {x.action:5} {x.name}: {x.reason}")
    if plan.report.findings:
        _print_report(plan.report)


# ---- attach / detach / manifests / skeleton (helper E) ---------------------------------------------------------


def _attach(src, target_dir, out, *, layout, link, overwrite, force, max_shard_size, as_json) -> None:
    from dsparkhub.attach import attach

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
    click.echo(f"  drafter: {len(r.tensors)} tensors, {_fmt_bytes(r.drafter_bytes_written)} in "
               f"{', '.join(r.added_files)}")
    for x in r.dropped:
        click.echo(f"  left out {x['name']}: {x['reason']}")
    click.echo(f"  config keys: {json.dumps(r.config_keys)}")
    click.echo(f"  target tensor bytes read: {r.target_data_bytes_read}")
    for note in r.notes:
        click.echo(f"  note: {note}")


@main.command()
@click.argument("attached", type=click.Path())
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder for the drafter.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder (atomically).")
@handle_errors
def detach(attached: str, out: str, overwrite: bool) -> None:
    """Extract the drafter of an attached (DeepSeek-V4-style) checkpoint into a standalone folder."""
    from dsparkhub.attach import detach as run_detach

    r = run_detach(attached, out, overwrite=overwrite)
    how = "restored exactly as attached" if r.restored else "mtp.* tensors + config (deepseek-v4 layout)"
    click.echo(f"wrote {r.out} ({', '.join(r.files)}): {how}; layout {r.layout}; "
               f"{_fmt_bytes(r.drafter_bytes_read)} of drafter tensors read")


@main.group()
def manifests() -> None:
    """Targets and seed releases dsparkhub knows (manifests/)."""


@manifests.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def manifests_list(as_json: bool) -> None:
    """List target and release manifests."""
    from dsparkhub.layouts.manifests import load_manifests

    targets, releases = load_manifests()
    if as_json:
        echo_json({"targets": {n: t.to_dict() for n, t in targets.items()},
                   "releases": {n: r.to_dict() for n, r in releases.items()}})
        return
    click.echo("targets:")
    for n, t in sorted(targets.items()):
        unverified = sorted(k for k, f in t.facts.items() if not f.get("verified"))
        click.echo(f"  {n:<18} {t.repo_id:<34} {t.model_type:<13} H {t.hidden_size:<5} L {t.num_hidden_layers:<3} "
                   f"V {t.vocab_size:<7}" + (f" unverified: {', '.join(unverified)}" if unverified else ""))
    click.echo("releases:")
    for n, r in sorted(releases.items()):
        click.echo(f"  {n:<30} {r.publisher:<11} target {r.target:<18} {r.layout} ({r.variant}), "
                   f"{len(r.published)} published number(s)")


@manifests.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def manifests_show(name: str, as_json: bool) -> None:
    """Show one manifest, with the provenance of each value."""
    import yaml

    from dsparkhub.layouts.manifests import get_manifest, unshipped_citations

    m = get_manifest(name)
    data = m.to_dict()
    if as_json:
        echo_json(data)
        return
    data.pop("checkpoint", None)
    facts = data.pop("facts", {})
    click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=116).rstrip())
    click.echo("provenance:")
    unshipped: set[str] = set()
    for k, f in facts.items():
        cites = unshipped_citations(f["source"])
        unshipped.update(cites)
        click.echo(f"  {k}: {'verified' if f['verified'] else 'NOT verified'} — {f['source']}"
                   + (" [*]" if cites else ""))
    if unshipped:
        click.echo(f"  [*] cites the project's working notes ({', '.join(sorted(unshipped))}), which are not in "
                   "this repository: a value resting on them alone cannot be checked from here")


@main.command()
@click.argument("manifest")
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder.")
@click.option("--tiny", is_flag=True, help="Tiny dimensions with random values instead of a real-size sparse file.")
@click.option("--with-drafter", is_flag=True, help="DeepSeek-V4: also write the attached mtp.* drafter stages.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
@handle_errors
def skeleton(manifest: str, out: str, tiny: bool, with_drafter: bool, overwrite: bool) -> None:
    """Write a target checkpoint from a manifest: real names / shapes / dtypes / shards as sparse files."""
    from dsparkhub.skeleton import write_skeleton

    r = write_skeleton(manifest, out, tiny=tiny, with_drafter=with_drafter, overwrite=overwrite)
    if r.manifest and r.manifest != manifest and not r.manifest.startswith(manifest):
        click.echo(f"note: {manifest} is a release; wrote its target {r.manifest}", err=True)
    click.echo(f"wrote {r.out}: {r.num_tensors} tensors in {len(r.files)} shard(s), {_fmt_bytes(r.logical_bytes)} "
               f"logical, {_fmt_bytes(r.disk_bytes)} on disk" + (" (sparse)" if r.sparse else ""))


# ---- verify / card (helper C) -------------------------------------------------------------------------------


def _int_list(ctx, param, value: str) -> list[int]:
    try:
        ns = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 3,5,7, found {value!r}") from None
    if not ns or min(ns) < 1 or len(set(ns)) != len(ns):
        raise click.BadParameter(f"expected distinct positive integers, found {value!r}")
    return ns


def _json_dict(ctx, param, value: str | None) -> dict | None:
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(obj, dict):
        raise click.BadParameter(f"expected a JSON object, found {value!r}")
    return obj


@main.command()
@click.argument("draft", type=click.Path())
@click.option("--target", required=True, help="Target: HF folder (with tokenizer), or Hub repo id / served model "
              "name for the vLLM backends.")
@click.option("--backend", type=click.Choice(["reference", "vllm", "vllm-serve", "sglang-serve"]), default="reference",
              show_default=True, help="reference = dsparkhub's PyTorch engine (CPU); vllm = offline LLM; "
              "vllm-serve = a running `vllm serve` (--server-url); sglang-serve = a running SGLang server "
              "(--server-url).")
@click.option("--num-speculative-tokens", "-n", "ns", default="3,5,7", show_default=True, callback=_int_list,
              help="Comma-separated n values; each is measured against the same baseline.")
@click.option("--datasets", multiple=True, help="Comma-separated or repeated: PATH.jsonl, NAME=PATH, builtin, "
              "builtin:math|code|chat, hub:owner/name[:file.jsonl]. Default: the built-in smoke set.")
@click.option("--max-prompts", type=click.IntRange(min=1), help="Use at most this many prompts per dataset.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy, which also checks that outputs are lossless.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--method", type=click.Choice(["dspark", "dflash", "eagle3"]),
              help="Speculative method (default: read from the drafter's config.json).")
@click.option("--out", type=click.Path(), default="results.json", show_default=True, help="Results file.")
@click.option("--device", help="Reference engine device (cpu, cuda).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel size (vLLM).")
@click.option("--max-model-len", type=click.IntRange(min=1), help="Engine context length (vLLM).")
@click.option("--compilation-config", callback=_json_dict, help="vLLM compilation config as JSON.")
@click.option("--server-url", help="Base URL of a running `vllm serve` started with the drafter "
              "(--backend vllm-serve), or an SGLang server started with --speculative-algorithm "
              "(--backend sglang-serve).")
@click.option("--baseline-url", "--vllm-baseline-url", "baseline_url",
              help="Base URL of a server of the same target without a drafter (--backend vllm-serve / sglang-serve).")
@click.option("--confidence-threshold", type=click.FloatRange(0.0, 1.0),
              help="Truncate drafts where the cumulative confidence drops below this (reference engine).")
@click.option("--overwrite", is_flag=True, help="Replace an existing results file --out.")
@click.option("--concurrency", "concurrency", default="1", show_default=True, callback=_int_list,
              help="Comma-separated requests in flight (e.g. 1,8,32); each is measured with and without the "
              "drafter (reference engine: batched decoding).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repeats per configuration, baseline and drafter interleaved; speedups are medians and a "
              "wide spread marks them unreliable.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Torch intra-op threads for the reference engine on CPU (default: chosen by model size).")
@click.option("--adaptive-verification", type=click.Choice(["off", "on", "both"]), default="off", show_default=True,
              help="vLLM 0.32 enable_adaptive_verification for a DSpark drafter with a confidence head (--backend "
              "vllm, GPU only); both = one results file per arm (OUT.adaptive-off.json, OUT.adaptive-on.json).")
@click.option("--speculative-option", "speculative_options", multiple=True, metavar="KEY=VALUE",
              help="Extra vLLM speculative_config key (repeat; VALUE as JSON). A lossy rejection_sample_method "
              "(fly, synthetic) is refused at temperature 0.")
@click.option("--lossless-at-block-size", is_flag=True,
              help="Also measure n = the drafter's block_size (sglang#32038 saw corruption only there).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@handle_errors
def verify(draft, target, backend, ns, datasets, max_prompts, max_new_tokens, temperature, seed, method, out,
           device, tp, max_model_len, compilation_config, server_url, baseline_url, confidence_threshold,
           overwrite, concurrency, repeats, threads, adaptive_verification, speculative_options,
           lossless_at_block_size, quiet) -> None:
    """Measure a drafter: lossless check, acceptance length τ, per-position acceptance, speedup. Exit 1 on a
    lossless failure or when the engine refuses."""
    from dsparkhub.verify.runner import LoadOptions, VerifyArgumentError, run_verify
    from dsparkhub.verify.spec_options import SpecOptionError, parse_speculative_options, run_verify_arms

    if quiet:
        _hide_transformers_progress()

    try:
        arms = run_verify_arms(run_verify, mode=adaptive_verification, lossless_at_block_size=lossless_at_block_size,
                             speculative_config=parse_speculative_options(speculative_options),
                             draft=draft, target=target, backend=backend, num_speculative_tokens=ns,
                             datasets=list(datasets),
                             max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, max_prompts=max_prompts,
                             method=method, device=device, tensor_parallel_size=tp, max_model_len=max_model_len,
                             compilation_config=compilation_config, confidence_threshold=confidence_threshold,
                             server_url=server_url, baseline_url=baseline_url, out=out, overwrite=overwrite,
                             progress=not quiet,
                             raise_on_mismatch=False, warn=lambda line: click.echo(line, err=True),
                             load=LoadOptions(concurrency=tuple(concurrency), repeats=repeats,
                                              intra_op_threads=threads))
    except (VerifyArgumentError, SpecOptionError) as exc:  # a bad combination of arguments: a usage error (exit 2)
        raise click.UsageError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None
    if Path(draft).is_dir():  # a DeepSpec run folder was measured through its step_latest
        from dsparkhub.io.checkpoint import resolve_step_dir

        draft = resolve_step_dir(draft)
    for out, results in arms:  # one results file per adaptive-verification arm (dsparkhub.verify.spec_options)
        _print_verify(results, draft, out, temperature, max_new_tokens)


def _print_verify(results, draft, out, temperature, max_new_tokens) -> None:
    from dsparkhub.verify.results import format_summary_table

    s = results.settings
    load = "batch 1" if s.concurrency == [1] else f"concurrency {', '.join(map(str, s.concurrency))}"
    click.echo(f"{results.method} drafter {draft} on {results.engine.backend} ({results.engine.version}, "
               f"{results.engine.device}); {load}, {s.repeats} repeat(s) {s.order}, temperature {temperature}, "
               f"max {max_new_tokens} new tokens")
    click.echo(format_summary_table(results))
    click.echo(f"wrote {out}")
    if results.lossless is False:
        raise results.lossless_error()
    click.echo(f"next: dsparkhub card {shlex.quote(str(draft))} --results {shlex.quote(str(out))}")


@main.command()
@click.argument("draft", type=click.Path())
@click.option("--target", required=True, help="Target: HF folder (with tokenizer).")
@click.option("--datasets", multiple=True, help="As for verify: PATH.jsonl, NAME=PATH, builtin, builtin:math|code|chat, "
              "hub:owner/name[:file.jsonl]. Default: the built-in smoke set.")
@click.option("--max-prompts", type=click.IntRange(min=2), help="Use at most this many prompts per dataset.")
@click.option("--max-new-tokens", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy acceptance (as SGLang's collector).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling and fit / held-out split seed.")
@click.option("--fit-fraction", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.5,
              show_default=True, help="Share of each dataset's prompts the temperatures are fitted on.")
@click.option("--min-samples", type=click.IntRange(min=1), default=100, show_default=True,
              help="A position with fewer fit samples is pooled with its thin neighbours.")
@click.option("--min-class", type=click.IntRange(min=1), default=10, show_default=True,
              help="... or with fewer accepted or rejected samples.")
@click.option("--refine", is_flag=True, help="Refine SGLang's 41-point grid with a golden-section search.")
@click.option("--device", help="Reference engine device (cpu, cuda).")
@click.option("--out", type=click.Path(dir_okay=False), help="Sidecar path (default DRAFT/dspark_sts.json).")
@click.option("--overwrite", is_flag=True, help="Replace an existing sidecar.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@handle_errors
def calibrate(draft, target, datasets, max_prompts, max_new_tokens, temperature, seed, fit_fraction, min_samples,
              min_class, refine, device, out, overwrite, quiet) -> None:
    """Fit the confidence head's per-position temperatures (SGLang STS) on a fit split of the reference engine's
    verify steps; report ECE / Brier / AUROC before and after on the held-out split and a threshold sweep; write
    dspark_sts.json (SGLang --speculative-dspark-confidence-sts-path) next to the drafter."""
    from dsparkhub.calibrate import format_report, run_calibration
    from dsparkhub.verify.runner import VerifyArgumentError

    if quiet:
        _hide_transformers_progress()
    try:
        sidecar, path = run_calibration(draft, target, datasets=list(datasets), max_prompts=max_prompts,
                                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                        fit_fraction=fit_fraction, min_samples=min_samples, min_class=min_class,
                                        refine=refine, device=device, out=out, overwrite=overwrite,
                                        progress=not quiet, warn=lambda line: click.echo(line, err=True))
    except VerifyArgumentError as exc:  # --device that is not a torch device: a usage error
        raise click.UsageError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None
    click.echo(format_report(sidecar))
    click.echo(f"wrote {path}")
    click.echo(f"serve with SGLang: --speculative-dspark-confidence-sts-path {shlex.quote(str(path))}")


@main.command()
@click.argument("draft", type=click.Path())
@click.option("--results", "results_paths", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Results file from `dsparkhub verify` (repeat for several engines / dataset sets).")
@click.option("--template", type=click.Path(), help="Jinja2 template replacing dsparkhub's model_card.md.j2.")
@click.option("--license", "license_", default="apache-2.0", show_default=True, help="Hub license id.")
@click.option("--base-model", help="Target repo id for the card's base_model (default: from provenance/results).")
@click.option("--repo-id", help="This drafter's Hub repo id (NS/NAME), used in the serve commands.")
@click.option("--overwrite", is_flag=True, help="Replace a README.md that dsparkhub did not write.")
@click.option("--checks", "check_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`vllm-check --json` / `sglang-check --json` report: the card says which engines' checks passed.")
@click.option("--compare", "compare_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Results file of another drafter of the same target (repeat): the card gets the comparison tables.")
@handle_errors
def card(draft, results_paths, template, license_, base_model, repo_id, overwrite, check_paths,
         compare_paths) -> None:
    """Write README.md (model card) and plots into the drafter folder from verify results files."""
    from dsparkhub.card import write_card

    out = write_card(draft, list(results_paths), template=template, license=license_, base_model=base_model,
                     repo_id=repo_id, overwrite=overwrite, checks=list(check_paths), compare=list(compare_paths))
    click.echo(f"wrote {out.readme}")
    for p in out.plots:
        click.echo(f"wrote {p}")


@main.command("compare")
@click.argument("results_paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@handle_errors
def compare_cmd(results_paths) -> None:
    """Compare drafters from `dsparkhub verify` results files: per target, mean speedup at n=3 / n=7 and the
    change, and τ / tokens/s per concurrency with the crossover (means unweighted over datasets)."""
    from dsparkhub.compare import compare, format_text, load_sources

    click.echo(format_text(compare(load_sources(list(results_paths)))))


# ---- push (helper B) --------------------------------------------------------------------------------------------


def _print_push(report) -> None:
    plan = report.plan
    where = f"{plan.repo_id}@{plan.revision}"
    state = ("new repo" if not plan.repo_exists else "new branch from main" if not plan.branch_exists
             else f"head {plan.parent_commit[:12]}")
    click.echo(f"{'Plan' if report.dry_run else 'Push'}: {where} ({state})")
    width = max([len(f.path) for f in plan.files] + [4])
    click.echo(f"  {'action':<9} {'path':<{width}} {'local':>10} {'remote':>10}")
    for f in plan.files:
        local = _fmt_bytes(f.size) if f.size is not None else "-"
        remote = _fmt_bytes(f.remote_size) if f.remote_size is not None else "-"
        click.echo(f"  {f.action:<9} {f.path:<{width}} {local:>10} {remote:>10}")
    counts = ", ".join(f"{len(plan.by_action(a))} {word}" for a, word in
                       (("add", "added"), ("change", "changed"), ("delete", "deleted"), ("unchanged", "unchanged"),
                        ("keep", "kept on the Hub")))
    click.echo(f"  {counts}; {_fmt_bytes(plan.bytes_to_send)} to send at most")
    if report.validation is not None:
        v = report.validation
        click.echo(f"validation: {'ok' if v['ok'] else 'FORCED'} ({v['errors']} error(s), {v['warnings']} warning(s))")
    for note in report.notes:
        click.echo(f"note: {note}")
    if report.dry_run:
        click.echo("dry run: nothing was written to the Hub")
        if plan.parent_commit:
            click.echo(f"to push exactly this plan: --expect-head {plan.parent_commit}")
    elif report.committed:
        click.echo(f"bytes uploaded: {report.bytes_uploaded} ({_fmt_bytes(report.bytes_uploaded)})")
        click.echo(f"commit: {report.commit_url}")
        if report.pr_url:
            click.echo(f"pull request: {report.pr_url}")
        click.echo(f"remote check: {report.remote_check} (sizes and hashes of the pushed files match)")
    else:
        click.echo("unchanged: the Hub already holds these files; no commit made, 0 bytes uploaded")


@main.command()
@click.argument("draft", type=click.Path(file_okay=False))
@click.option("--repo", "repo_id", required=True, help="Hub repo id NAMESPACE/NAME (created when missing).")
@click.option("--revision", help="Branch to push to (default main; created from main when missing).")
@click.option("--private", is_flag=True, help="Create the repo private (no effect on an existing repo).")
@click.option("--dry-run", is_flag=True, help="Show the plan; send only read requests.")
@click.option("--force", is_flag=True, help="Push despite validation errors (recorded in the commit message).")
@click.option("--endpoint", help="Hub URL (default HF_ENDPOINT or https://huggingface.co).")
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
@handle_errors
def push(draft, repo_id, revision, private, dry_run, force, endpoint, target, expect_head, token, include, exclude,
         delete, commit_message, commit_description, create_pr, as_json) -> None:
    """Push a drafter folder to the Hub as one commit, as `hf upload` does (files on the Hub that the folder lacks
    are kept unless --delete), after validation and a check of the card's serve commands."""
    from dsparkhub.hub.push import push as push_folder

    if create_pr and revision not in (None, "main"):
        raise click.UsageError("--create-pr opens a pull request against main; drop --revision")
    report = push_folder(draft, repo_id, revision=revision, private=private, dry_run=dry_run, force=force,
                         endpoint=endpoint, target=target, expect_head=expect_head, token=token,
                         include=list(include), exclude=list(exclude), delete=list(delete),
                         commit_message=commit_message, commit_description=commit_description, create_pr=create_pr)
    if as_json:
        click.echo(_redact(json.dumps(report.to_dict(), indent=2, default=str)))
    else:
        _print_push(report)


# ---- example (helper A) -------------------------------------------------------------------------------------------


@main.group()
def example() -> None:
    """The embedded example: a tiny trained Qwen3 target with a DSpark and a DFlash drafter (built offline)."""


@example.command("build")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache root (default $DSPARKHUB_CACHE or "
              "~/.cache/dsparkhub).")
@click.option("--force", is_flag=True, help="Redo the cached folder even when a complete one exists.")
@click.option("--from-scratch", is_flag=True, help="Train a new build (minutes on 2 cores; float training differs "
              "across CPUs, so its τ differs a little from the shipped build's).")
@click.option("--json", "as_json", is_flag=True, help="Print paths and info as JSON.")
@handle_errors
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


# ---- vllm-check (helper D) --------------------------------------------------------------------------------------


@main.command("vllm-check")
@click.argument("draft", type=click.Path(exists=True, file_okay=False))
@click.option("--target", required=True, help="Target: local HF folder (or a Hub id already in the HF cache).")
@click.option("--num-speculative-tokens", "-n", type=click.IntRange(min=1),
              help="n for vLLM's speculative config (default: the drafter's block_size, or a speculators config's "
                   "speculative_tokens).")
@click.option("--method", type=click.Choice(["dspark", "dflash", "eagle3"]),
              help="Speculative method to check the drafter with (default: read from its config.json).")
@click.option("--dtype", default="auto", show_default=True, help="vLLM dtype for the target config.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def vllm_check(draft: str, target: str, num_speculative_tokens: int | None, method: str | None, dtype: str,
               as_json: bool) -> None:
    """Run vLLM 0.32's own checks of a converted DSpark, DFlash or EAGLE-3 drafter on CPU, with the drafter's own
    method: config, load_weights, engine. Exit 1 on failure (a refused engine stage on CPU is expected for DSpark and
    not a failure)."""
    from dsparkhub.verify.vllm.checks import check_with_vllm

    report = check_with_vllm(draft, target, method=method, num_speculative_tokens=num_speculative_tokens,
                             dtype=dtype)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"{report.draft}  (vLLM {report.vllm_version}, method {report.method}, "
                   f"n={report.num_speculative_tokens})")
        for s in report.stages:
            click.echo(f"  {s.name:<13} {s.status:<8} {s.message}")
            for name in s.details.get("missing", [])[:20]:
                click.echo(f"      missing: {name}")
    if not report.ok:
        sys.exit(1)


# ---- sglang-check ------------------------------------------------------------------------------------------------


@main.command("sglang-check")
@click.argument("draft", type=click.Path(exists=True, file_okay=False), required=False)
@click.option("--target", required=True, help="Target: local HF folder (SGLang reads its config.json).")
@click.option("--algorithm", type=click.Choice(["DSPARK", "DFLASH"]),
              help="SGLang --speculative-algorithm (default: DSPARK for a Markov-head drafter, else DFLASH).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def sglang_check(draft: str | None, target: str, algorithm: str | None, as_json: bool) -> None:
    """Run SGLang 0.5.23's own checks of a drafter on CPU from .venv-sglang (scripts/setup_sglang.sh): server-argument
    resolution and draft-config parsing, load_weights, engine. Without DRAFT, SGLang finds the drafter in the target
    (dspark_* keys or a dspark/ subfolder). Exit 1 on failure (the engine stage is refused on CPU: SGLang serves
    DSpark on CUDA / NPU / XPU only)."""
    from dsparkhub.verify.sglang.checks import check_with_sglang

    report = check_with_sglang(draft, target, algorithm=algorithm)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"{report.draft}  (SGLang {report.sglang_version}, --speculative-algorithm {report.algorithm})")
        for s in report.stages:
            click.echo(f"  {s.name:<13} {s.status:<8} {s.message}")
            for name in s.details.get("missing", [])[:20]:
                click.echo(f"      missing: {name}")
    if not report.ok:
        sys.exit(1)


# ---- quickstart (lead) ------------------------------------------------------------------------------------------


@main.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--repo", "repo_id", help="Also plan a push to this real Hub repo (--dry-run: read requests only).")
@click.option("--max-new-tokens", type=click.IntRange(min=8), default=96, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@handle_errors
def quickstart(outdir: str, repo_id: str | None, max_new_tokens: int, quiet: bool) -> None:
    """Run the main job on the embedded example: build it (cached), inspect, convert, validate, verify (reference
    engine), card, and push to a local Hub started for the occasion. Re-running replaces OUTDIR's contents."""
    import tempfile
    from pathlib import Path

    from dsparkhub.card import write_card
    from dsparkhub.convert import convert as run_convert
    from dsparkhub.example import build_example
    from dsparkhub.hub.push import push as push_folder
    from dsparkhub.layouts.recipes import open_draft
    from dsparkhub.testing.hub_server import LocalHub
    from dsparkhub.validate import validate as run_validate
    from dsparkhub.verify.results import format_summary_table
    from dsparkhub.verify.runner import LoadOptions, run_verify

    if quiet:
        _hide_transformers_progress()

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    click.echo("== 1/7 example: a tiny Qwen3 target and a DSpark drafter trained on it (DeepSpec layout)")
    ex = build_example()
    click.echo(f"  target        {ex.target}\n  drafter run   {ex.deepspec_run}")
    click.echo("== 2/7 inspect the training output (headers only)")
    d = open_draft(ex.deepspec_run)
    click.echo(f"{d.checkpoint.path}  [{d.recipe.title}]")
    _print_spec(d.spec.summary(), d.checkpoint.files)
    click.echo("== 3/7 convert to the layout vLLM 0.32 loads")
    drafter = out / "example-qwen3-dspark"
    result = run_convert(ex.deepspec_run, drafter, ex.target, overwrite=True)
    _print_plan(result.plan)
    click.echo(f"wrote {result.out}")
    click.echo("== 4/7 validate against the target (headers only)")
    report = run_validate(drafter, ex.target, num_speculative_tokens=7)
    click.echo(f"{report.draft}  [{report.layout}]")
    _print_report(report)
    if not report.ok:
        sys.exit(1)
    click.echo("== 5/7 verify with the reference engine (CPU): lossless, τ, speedup per num_speculative_tokens")
    results_path = out / "results.json"
    results = run_verify(drafter, ex.target, backend="reference", num_speculative_tokens=(3, 5, 7),
                         datasets=[f"heldout={ex.prompts}"], max_new_tokens=max_new_tokens, out=results_path,
                         overwrite=True,
                         progress=not quiet, load=LoadOptions(repeats=3))  # interleaved, medians: honest timing
    click.echo(format_summary_table(results))
    click.echo(f"wrote {results_path}")
    click.echo("== 6/7 model card from the results")
    # the example target lives only on this machine: the card names it by the id the local Hub below would give it
    card_out = write_card(drafter, [results_path], repo_id="dsparkhub-example/qwen3-tiny-dspark",
                          base_model="dsparkhub-example/qwen3-tiny")
    for p in card_out.plots:
        click.echo(f"wrote {p}")
    click.echo("== 7/7 push")
    if repo_id:
        _print_push(push_folder(drafter, repo_id, dry_run=True, target=str(ex.target)))
    else:
        token = "hf_quickstartLocalHubToken00000000"
        with tempfile.TemporaryDirectory(prefix="dsparkhub-localhub-") as hub_root, \
                LocalHub(hub_root, tokens={token: "dsparkhub-example"}) as hub, hub.client_settings():
            click.echo(f"  local Hub at {hub.url} (pass --repo NS/NAME to plan a push to the real Hub instead)")
            _print_push(push_folder(drafter, "dsparkhub-example/qwen3-tiny-dspark", token=token, endpoint=hub.url,
                                    target=str(ex.target)))
    click.echo(f"card: {card_out.readme}")


if __name__ == "__main__":  # pragma: no cover
    main()
