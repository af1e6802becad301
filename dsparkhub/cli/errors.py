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
import sys
import traceback

import click

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
