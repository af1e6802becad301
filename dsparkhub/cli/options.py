"""Option types and option sets shared by several commands (defined once)."""

from __future__ import annotations

import json

import click


class ByteSize(click.ParamType):
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


def layout_name(param, value: str | None) -> str | None:
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


ALLOW_PICKLE_HELP = ("When the only weights are .bin / .pt / .pth pickle files, read them with "
                      "torch.load(weights_only=True) (never a full unpickle) into a temporary safetensors copy.")
OVERWRITE_HELP = ("Replace an existing output folder, atomically, when dsparkhub wrote it and it holds nothing else; "
                  "any other folder is refused.")


def pickle_source(path: str, allow_pickle: bool) -> str:
    """``path``, or with ``--allow-pickle`` a temporary safetensors copy of a pickle-only checkpoint."""
    if not allow_pickle:
        return path
    from dsparkhub.layouts.deepspec_run import resolve_pickle

    resolved = resolve_pickle(path)
    if str(resolved) != str(path):
        click.echo(f"note: read pickle weights of {path} with torch.load(weights_only=True) into {resolved}",
                   err=True)
    return str(resolved)


def int_list(ctx, param, value: str) -> list[int]:
    try:
        ns = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 3,5,7, found {value!r}") from None
    if not ns or min(ns) < 1 or len(set(ns)) != len(ns):
        raise click.BadParameter(f"expected distinct positive integers, found {value!r}")
    return ns


def json_dict(ctx, param, value: str | None) -> dict | None:
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(obj, dict):
        raise click.BadParameter(f"expected a JSON object, found {value!r}")
    return obj


def generation_options(*, minimum: int, temperature_help: str, seed_help: str | None = None):
    """The four generation options ``verify`` and ``calibrate`` share, in this order: ``--max-prompts`` (at least
    ``minimum``), ``--max-new-tokens`` (default 128, at least ``minimum``), ``--temperature`` (default 0.0 =
    greedy) and ``--seed`` (default 0). ``calibrate`` needs ``minimum=2``: a fit and a held-out split."""
    decorators = [
        click.option("--max-prompts", type=click.IntRange(min=minimum),
                     help="Use at most this many prompts per dataset."),
        click.option("--max-new-tokens", type=click.IntRange(min=minimum), default=128, show_default=True),
        click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
                     help=temperature_help),
        click.option("--seed", type=int, default=0, show_default=True, help=seed_help),
    ]

    def apply(fn):
        for decorator in reversed(decorators):  # click lists options in decorator order, top first
            fn = decorator(fn)
        return fn

    return apply
