"""The ``dsparkhub`` command line: one click group; commands grouped by stage.

Modules: :mod:`~dsparkhub.cli.source` (inspect, validate, convert, detach), :mod:`~dsparkhub.cli.manifests`
(manifests, skeleton), :mod:`~dsparkhub.cli.verify` (verify, calibrate, vllm-check, sglang-check),
:mod:`~dsparkhub.cli.schedule` (schedule), :mod:`~dsparkhub.cli.release` (card, compare, push, example,
quickstart), :mod:`~dsparkhub.cli.hub` (hub serve). The error -> message mapping (one boundary, installed on
every command here) and the exit codes are in :mod:`~dsparkhub.cli.errors`; shared option types and option sets in
:mod:`~dsparkhub.cli.options`; printing in :mod:`~dsparkhub.cli.render`. ``--debug`` is accepted before and after the subcommand (:func:`_add_debug_option`).

Only this package prints. Each command parses its options, calls one library function (the multi-step flows live
in :mod:`dsparkhub.pipeline`) and renders its result.
"""

from __future__ import annotations

import click

from dsparkhub import __version__
from dsparkhub.cli import manifests as manifests_cmds
from dsparkhub.cli import hub as hub_cmds
from dsparkhub.cli import release, source
from dsparkhub.cli import schedule as schedule_cmds
from dsparkhub.cli import verify as verify_cmds
from dsparkhub.cli.errors import install_boundary


DEBUG_HELP = "Show tracebacks on errors (also DSPARKHUB_DEBUG=1)."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dsparkhub")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
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
                 schedule_cmds.schedule, hub_cmds.hub):
    main.add_command(_command)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(dict)["debug"] = True  # the group's dict: cli.errors reads it up the context chain


def _add_debug_option(command: click.Command) -> None:
    """``--debug`` after the subcommand too (``dsparkhub convert ... --debug``), on every command and subcommand."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_debug_option(sub)
        return
    if not any(p.name == "debug" for p in command.params):
        command.params.append(click.Option(["--debug"], is_flag=True, expose_value=False, callback=_set_debug,
                                           help=DEBUG_HELP))


_add_debug_option(main)
install_boundary(main)  # one error boundary for every command (cli.errors.ERRORS)

