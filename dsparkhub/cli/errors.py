"""Errors -> one paragraph on stderr and an exit code, in one place.

Exit codes: :data:`EXIT_OK` 0; :data:`EXIT_FAILED` 1 when the command could not do its job (bad input, validation
errors, lossless broken, engine refused: every :class:`~dsparkhub.errors.DsparkhubError`, and OS errors on the
user's files); :data:`EXIT_USAGE` 2 for usage errors (click's own); :data:`EXIT_INTERRUPTED` 130 on Ctrl-C.
``--debug`` or ``DSPARKHUB_DEBUG=1`` shows tracebacks. Messages are ``Error (TYPE): message`` plus the error's own
``Hint:`` line; any Hugging Face token is redacted.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import traceback
from collections.abc import Callable

import click

from dsparkhub.errors import DsparkhubError
from dsparkhub.secrets import redact

EXIT_OK = 0
#: the command could not do its job: a DsparkhubError (bad input, validation errors, lossless broken, engine
#: refused), an OS error on the user's files, or a report that says "failed" (validate, vllm-check, sglang-check).
EXIT_FAILED = 1
#: usage errors: click's own (unknown option, missing argument, bad value); listed here, raised by click.
EXIT_USAGE = 2
#: interrupted (Ctrl-C): 128 + SIGINT, what shells expect.
EXIT_INTERRUPTED = 130

#: what the CLI catches and prints as one paragraph (``Error (TYPE): message`` + ``Hint:``) with EXIT_FAILED; the
#: message and hint are the error's own (see ``dsparkhub.errors``). huggingface_hub errors arrive as HubError.
HANDLED = (DsparkhubError, OSError)


def _debug_enabled(ctx: click.Context | None) -> bool:
    if os.environ.get("DSPARKHUB_DEBUG", "") not in ("", "0"):
        return True
    while ctx is not None:
        if ctx.obj and ctx.obj.get("debug"):
            return True
        ctx = ctx.parent
    return False


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands(group: click.Group, prefix: str = "dsparkhub"):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def _flags(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def hint_for(ctx: click.Context, hint: str) -> str:
    """``hint`` as the running command should print it: a dsparkhub option the hint names that this command lacks is
    followed by the commands that have it (library errors are raised from several commands: "pass --layout NAME"
    means `dsparkhub convert --layout` when `verify` meets the drafter). Flags no dsparkhub command has (vLLM's
    ``--speculative-config``, SGLang's ...) and options of a command the hint itself names are left alone."""
    own = _flags(ctx.command)
    others = dict(_commands(ctx.find_root().command)) if isinstance(ctx.find_root().command, click.Group) else {}
    notes = []
    for flag in dict.fromkeys(_FLAG.findall(hint)):
        owners = [name for name, command in others.items() if flag in _flags(command)]
        if flag in own or not owners or any(re.search(rf"\b{re.escape(n.split()[-1])}\b", hint) for n in owners):
            continue
        notes.append(f"{flag} is an option of {', '.join(f'`{n}`' for n in owners)}")
    return hint + (f" ({'; '.join(notes)})" if notes else "")


def _interrupted(exc: BaseException, ctx: click.Context | None) -> int:
    # shells expect 128 + SIGINT; click would turn this into "Aborted!" and exit 1. Outputs are written through
    # temporary files and renames, so nothing half-written is left under the final names.
    click.echo("\ninterrupted (Ctrl-C): nothing half-written was left in place", err=True)
    return EXIT_INTERRUPTED


def _broken_pipe(exc: BaseException, ctx: click.Context | None) -> int:
    # the reader of our stdout left (`dsparkhub inspect X | head`): stop quietly, as the Python docs advise
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_FAILED


def _paragraph(exc: BaseException, ctx: click.Context | None) -> int:
    if _debug_enabled(ctx):
        click.echo(redact(traceback.format_exc()), err=True)
    if isinstance(exc, DsparkhubError) and exc.hint and ctx is not None:
        exc.hint = hint_for(ctx, exc.hint)
    click.echo(redact(f"Error ({type(exc).__name__}): {exc}"), err=True)
    return EXIT_FAILED


#: the one error boundary, in order (the first class an error is an instance of decides; an entry is never shadowed
#: by an earlier one, tests/test_cli_boundary.py): exception class -> renderer, which prints and returns the exit
#: code. As huggingface_hub's CLI maps its errors in one place. Anything else (click's usage errors, SystemExit)
#: passes through to click.
ERRORS: tuple[tuple[type[BaseException], Callable[[BaseException, click.Context | None], int]], ...] = (
    (KeyboardInterrupt, _interrupted),
    (BrokenPipeError, _broken_pipe),  # an OSError, but not one on the user's files
    *((cls, _paragraph) for cls in HANDLED),
)


def boundary(fn):
    """``fn`` (a command's callback) with its errors mapped by :data:`ERRORS` to a message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            for cls, render in ERRORS:
                if isinstance(exc, cls):
                    sys.exit(render(exc, click.get_current_context(silent=True)))
            raise

    return wrapper


def install_boundary(group: click.Group) -> None:
    """Put every command of ``group`` (and of its subgroups) behind :func:`boundary`, once: the commands themselves
    carry no error handling."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            install_boundary(command)
        elif command.callback is not None and not getattr(command.callback, "_dsparkhub_boundary", False):
            command.callback = boundary(command.callback)
            command.callback._dsparkhub_boundary = True


def fail() -> None:
    """End a command whose report says it failed (validation errors, a failed engine check): :data:`EXIT_FAILED`."""
    sys.exit(EXIT_FAILED)
