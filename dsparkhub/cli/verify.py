"""Commands that run engines: ``verify``, ``calibrate``, ``vllm-check``, ``sglang-check``."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from dsparkhub.cli.errors import fail
from dsparkhub.cli.options import generation_options, int_list, json_dict
from dsparkhub.cli.render import echo_json, echo_stages, hide_transformers_progress, working
from dsparkhub.serving import engine_names, method_names, sglang_algorithms


@click.command()
@click.argument("draft", type=click.Path())
@click.option("--target", required=True, help="Target: HF folder (with tokenizer), or Hub repo id / served model "
              "name for the vLLM backends.")
@click.option("--backend", type=click.Choice(engine_names()), default="reference",
              show_default=True, help="reference = dsparkhub's PyTorch engine (CPU); vllm = offline LLM; "
              "vllm-serve = a running `vllm serve` (--server-url); sglang-serve = a running SGLang server "
              "(--server-url).")
@click.option("--num-speculative-tokens", "-n", "ns", default="3,5,7", show_default=True, callback=int_list,
              help="Comma-separated n values; each is measured against the same baseline.")
@click.option("--datasets", multiple=True, help="Comma-separated or repeated: PATH.jsonl, NAME=PATH, builtin, "
              "builtin:math|code|chat, hub:owner/name[:file.jsonl]. Default: the built-in smoke set.")
@generation_options(minimum=1, temperature_help="0 = greedy, which also checks that outputs are lossless.")
@click.option("--method", type=click.Choice(method_names()),
              help="Speculative method (default: read from the drafter's config.json).")
@click.option("--out", type=click.Path(), default="results.json", show_default=True, help="Results file.")
@click.option("--device", help="Reference engine device (cpu, cuda).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel size (vLLM).")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline-parallel size (vLLM): the target's layers split over PP stages of TP ranks each; "
                   "checked against the node or Ray cluster before anything loads.")
@click.option("--distributed-executor-backend", "executor", type=click.Choice(["ray", "mp"]),
              help="vLLM's executor: ray (a Ray cluster, several nodes) or mp (one node); default vLLM's choice.")
@click.option("--ray-address", help="Ray cluster to run on and check (`ray start --head`'s HOST:PORT); implies "
                                    "--distributed-executor-backend ray.")
@click.option("--max-model-len", type=click.IntRange(min=1), help="Engine context length (vLLM).")
@click.option("--compilation-config", callback=json_dict, help="vLLM compilation config as JSON.")
@click.option("--server-url", help="Base URL of a running `vllm serve` started with the drafter "
              "(--backend vllm-serve), or an SGLang server started with --speculative-algorithm "
              "(--backend sglang-serve).")
@click.option("--baseline-url", "--vllm-baseline-url", "baseline_url",
              help="Base URL of a server of the same target without a drafter (--backend vllm-serve / sglang-serve).")
@click.option("--confidence-threshold", type=click.FloatRange(0.0, 1.0),
              help="Truncate drafts where the cumulative confidence drops below this (reference engine).")
@click.option("--overwrite", is_flag=True, help="Replace an existing results file --out (only a results file).")
@click.option("--allow-beyond-context", is_flag=True, help="Measure even when a prompt plus --max-new-tokens "
              "exceeds the target's context (--max-model-len, else max_position_embeddings); refused otherwise.")
@click.option("--concurrency", "concurrency", default="1", show_default=True, callback=int_list,
              help="Comma-separated requests in flight (e.g. 1,8,32); each is measured with and without the "
              "drafter (reference engine: batched decoding; vllm: a closed loop over vLLM's engine API with exactly C "
              "requests in flight; vllm-serve: `vllm bench serve`).")
@click.option("--load-driver", "load_driver", type=click.Choice(["engine-loop", "bench-serve"]),
              help="How --backend vllm drives --concurrency: engine-loop (default: LLM.llm_engine in dsparkhub's "
              "child, vLLM's per-request metrics) or bench-serve (dsparkhub starts `vllm serve` per configuration "
              "and drives it with `vllm bench serve`).")
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
@click.option("--baseline", "baseline", default="none", show_default=True,
              metavar="none|mtp:N|PATH[@n]|RESULTS.json[@n]",
              help="What speedups are measured against: none (no speculation), mtp:N (the target's own MTP "
              "layers, vLLM backends), another drafter folder at n (default: the tokens one trained block of it "
              "proposes; reference engine), or another verify --out file of the same target, engine, prompts, "
              "temperature, max-new-tokens and concurrency at its n (default: its best n per concurrency; @0: its "
              "own baseline run; not interleaved, so every speedup is marked unreliable).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def verify(draft, target, backend, ns, datasets, max_prompts, max_new_tokens, temperature, seed, method, out,
           device, tp, pp, executor, ray_address, max_model_len, compilation_config, server_url, baseline_url,
           confidence_threshold, overwrite, allow_beyond_context, concurrency, load_driver, repeats, threads,
           adaptive_verification,
           speculative_options, lossless_at_block_size, baseline, quiet) -> None:
    """Measure a drafter: lossless check, acceptance length τ, per-position acceptance, speedup. Exit 1 on a
    lossless failure or when the engine refuses; Ctrl-C keeps the configurations measured so far in --out."""
    from dsparkhub.verify.runner import open_inputs, run_verify
    from dsparkhub.verify.settings import LoadOptions, VerifyArgumentError, VerifySettings
    from dsparkhub.verify.spec_options import SpecOptionError, parse_speculative_options, run_verify_arms

    if quiet:
        hide_transformers_progress()

    opened, target_spec = open_inputs(draft, target)  # read once here, handed down as values
    try:
        arms = run_verify_arms(
            run_verify, mode=adaptive_verification, lossless_at_block_size=lossless_at_block_size,
            speculative_config=parse_speculative_options(speculative_options), draft=opened, target=target_spec,
            settings=VerifySettings(
                num_speculative_tokens=ns, datasets=list(datasets), max_new_tokens=max_new_tokens,
                temperature=temperature, seed=seed, max_prompts=max_prompts, method=method, device=device,
                tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_executor_backend=executor,
                ray_address=ray_address, max_model_len=max_model_len, compilation_config=compilation_config,
                confidence_threshold=confidence_threshold, server_url=server_url, baseline_url=baseline_url,
                load=LoadOptions(concurrency=tuple(concurrency), repeats=repeats, intra_op_threads=threads,
                                 driver=load_driver),
                allow_beyond_context=allow_beyond_context, baseline=baseline),
            backend=backend, out=out, overwrite=overwrite, progress=not quiet,
            raise_on_mismatch=False, warn=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt as exc:
        if getattr(exc, "partial_results", None):  # set by run_verify once the measured part is saved
            click.echo(f"\nthe configurations measured before Ctrl-C were written to {exc.partial_results} "
                       "(marked `incomplete`)", err=True)
        raise
    except (VerifyArgumentError, SpecOptionError) as exc:  # a bad combination of arguments: a usage error (exit 2)
        raise click.UsageError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None
    for path, results in arms:  # one results file per adaptive-verification arm (dsparkhub.verify.spec_options)
        _print_verify(results, opened, path, temperature, max_new_tokens)


def _print_verify(results, draft, out, temperature, max_new_tokens) -> None:
    """The terminal report of one results file; raises the lossless error after printing it."""
    from dsparkhub.verify.results.table import format_summary_table

    if not isinstance(draft, str):  # opened (dsparkhub.verify.runner.open_inputs): a run folder's step_latest
        draft = draft.checkpoint.path
    elif Path(draft).is_dir():  # a DeepSpec run folder was measured through its step_latest
        from dsparkhub.layouts.deepspec_run import resolve_step_dir

        draft = resolve_step_dir(draft)
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


@click.command()
@click.argument("draft", type=click.Path())
@click.option("--target", required=True, help="Target: HF folder (with tokenizer).")
@click.option("--datasets", multiple=True, help="As for verify: PATH.jsonl, NAME=PATH, builtin, builtin:math|code|chat, "
              "hub:owner/name[:file.jsonl]. Default: the built-in smoke set.")
@generation_options(minimum=2, temperature_help="0 = greedy acceptance (as SGLang's collector).",
                    seed_help="Sampling and fit / held-out split seed.")
@click.option("--fit-fraction", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.5,
              show_default=True, help="Share of each dataset's prompts the temperatures are fitted on.")
@click.option("--min-samples", type=click.IntRange(min=1), default=100, show_default=True,
              help="A position with fewer fit samples is pooled with its thin neighbours.")
@click.option("--min-class", type=click.IntRange(min=1), default=10, show_default=True,
              help="... or with fewer accepted or rejected samples.")
@click.option("--refine", is_flag=True, help="Refine SGLang's 41-point grid with a golden-section search.")
@click.option("--device", help="Reference engine device (cpu, cuda).")
@click.option("--out", type=click.Path(dir_okay=False), help="Sidecar path (default DRAFT/dspark_sts.json).")
@click.option("--overwrite", is_flag=True, help="Replace an existing sidecar (never a file of another kind).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def calibrate(draft, target, datasets, max_prompts, max_new_tokens, temperature, seed, fit_fraction, min_samples,
              min_class, refine, device, out, overwrite, quiet) -> None:
    """Fit the confidence head's per-position temperatures (SGLang STS) on a fit split of the reference engine's
    verify steps; report ECE / Brier / AUROC before and after on the held-out split and a threshold sweep; write
    dspark_sts.json (SGLang --speculative-dspark-confidence-sts-path) next to the drafter."""
    from dsparkhub.calibrate import format_report, run_calibration
    from dsparkhub.verify.runner import VerifyArgumentError

    if quiet:
        hide_transformers_progress()
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


@click.command("vllm-check")
@click.argument("draft", type=click.Path(exists=True, file_okay=False))
@click.option("--target", required=True, help="Target: local HF folder (or a Hub id already in the HF cache).")
@click.option("--num-speculative-tokens", "-n", type=click.IntRange(min=1),
              help="n for vLLM's speculative config (default: the drafter's block_size, or a speculators config's "
                   "speculative_tokens).")
@click.option("--method", type=click.Choice(method_names()),
              help="Speculative method to check the drafter with (default: read from its config.json).")
@click.option("--dtype", default="auto", show_default=True, help="vLLM dtype for the target config.")
@click.option("--vllm-version", help="Judge with this vLLM version's contract (what it shares from the target, which "
                                     "loader guards it applies), for a node you are not on; default: the installed "
                                     "vLLM's.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def vllm_check(draft: str, target: str, num_speculative_tokens: int | None, method: str | None, dtype: str,
               vllm_version: str | None, as_json: bool) -> None:
    """Run the installed vLLM's own checks (0.32 - 0.34) of a converted DSpark, DFlash or EAGLE-3 drafter on CPU,
    with the drafter's own method: config, load_weights, engine. Exit 1 on failure (a refused engine stage on CPU is
    expected for DSpark and not a failure)."""
    from dsparkhub.verify.vllm.checks import check_with_vllm
    from dsparkhub.verify.vllm.contract import VllmContract

    with working("vLLM's checks (config, load_weights, engine) in a child process", show=not as_json):
        report = check_with_vllm(draft, target, method=method, num_speculative_tokens=num_speculative_tokens,
                                 dtype=dtype, vllm_version=vllm_version)
    if as_json:
        echo_json(report.to_dict())
    else:
        judged = VllmContract.from_dict(report.contract) if report.contract else None
        as_of = f", judged as vLLM {judged.version}" if judged and judged.version != report.vllm_version else ""
        echo_stages(f"{report.draft}  (vLLM {report.vllm_version}{as_of}, method {report.method}, "
                    f"n={report.num_speculative_tokens})", report.stages)
        if report.stand_in:
            click.echo(f"stand-in: {report.stand_in}")
        if judged and judged.note():
            click.echo(f"note: {judged.note()}")
    if not report.ok:
        fail()


@click.command("sglang-check")
@click.argument("draft", type=click.Path(exists=True, file_okay=False), required=False)
@click.option("--target", required=True, help="Target: local HF folder (SGLang reads its config.json).")
@click.option("--algorithm", type=click.Choice(sglang_algorithms()),
              help="SGLang --speculative-algorithm (default: DSPARK for a Markov-head drafter, else DFLASH).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def sglang_check(draft: str | None, target: str, algorithm: str | None, as_json: bool) -> None:
    """Run SGLang 0.5.23's own checks of a drafter on CPU from .venv-sglang (scripts/setup_sglang.sh): server-argument
    resolution and draft-config parsing, load_weights, engine. Without DRAFT, SGLang finds the drafter in the target
    (dspark_* keys or a dspark/ subfolder). Exit 1 on failure (the engine stage is refused on CPU: SGLang serves
    DSpark on CUDA / NPU / XPU only)."""
    from dsparkhub.verify.sglang.checks import check_with_sglang

    with working("SGLang's checks (config, load_weights, engine) in .venv-sglang", show=not as_json):
        report = check_with_sglang(draft, target, algorithm=algorithm)
    if as_json:
        echo_json(report.to_dict())
    else:
        # without DRAFT, SGLang resolves the drafter itself; when it cannot, there is no path to name
        what = report.draft or f"(no drafter path: SGLang looked for one in {report.target})"
        echo_stages(f"{what}  (SGLang {report.sglang_version}, --speculative-algorithm {report.algorithm})",
                    report.stages)
    if not report.ok:
        fail()
