"""The ``dsparkhub`` command line: one click group; commands grouped by stage.

Modules: :mod:`~dsparkhub.cli.source` (inspect, validate, convert, detach), :mod:`~dsparkhub.cli.manifests`
(manifests, skeleton), :mod:`~dsparkhub.cli.verify` (verify, calibrate, vllm-check, sglang-check),
:mod:`~dsparkhub.cli.schedule` (schedule), :mod:`~dsparkhub.cli.release` (card, compare, push, example, quickstart).
The error -> message mapping and the exit codes are in :mod:`~dsparkhub.cli.errors`; shared option types and option sets in :mod:`~dsparkhub.cli.options`; printing in
:mod:`~dsparkhub.cli.render`.

Only this package prints. Each command parses its options, calls one library function (the multi-step flows live
in :mod:`dsparkhub.pipeline`) and renders its result.
"""

from __future__ import annotations

import click

from dsparkhub import __version__
from dsparkhub.cli import manifests as manifests_cmds
from dsparkhub.cli import release, source
from dsparkhub.cli import schedule as schedule_cmds
from dsparkhub.cli import verify as verify_cmds


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dsparkhub")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors (also DSPARKHUB_DEBUG=1).")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Convert, validate, verify, card and push DSpark speculative-decoding drafters."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# in the order `dsparkhub --help` has always listed them (click sorts by name)
for _command in (source.inspect, source.validate, source.convert, source.detach, manifests_cmds.manifests,
                 manifests_cmds.skeleton, verify_cmds.verify, verify_cmds.calibrate, release.card, release.compare,
                 release.push,
                 release.example, verify_cmds.vllm_check, verify_cmds.sglang_check, release.quickstart,
                 schedule_cmds.schedule):
    main.add_command(_command)

