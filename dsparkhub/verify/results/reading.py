"""Reading a results file: strict validation of every key (schema ``/2``), the in-memory upgrade of ``/1`` files,
and error messages that name the key path in the schema's own spelling (``datasets[1].runs[0].tau``).

The schema is :mod:`dsparkhub.verify.results.schema`; a ``/1`` file lacks the derived views (conditional
acceptance, the latency-law check, summary and load rows), which are recomputed here with
:mod:`~dsparkhub.verify.results.derive` after validation.
"""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dsparkhub.errors import ResultsError
from dsparkhub.serving import ENGINES
from dsparkhub.verify.results.derive import assess_run, conditional_acceptance, load_rows, summarize
from dsparkhub.verify.results.per_request import category_rows
from dsparkhub.verify.results.schema import (BASELINE_KINDS, METHODS, ORDERS, SCHEMA, SCHEMA_V1,
                                             SCHEMA_V2, VerifyResults)

_ADAPTER = TypeAdapter(VerifyResults)


def results_from_dict(data: Any, *, path: str | Path | None = None) -> VerifyResults:
    """Build from a dict (schema /3, or /2 and /1 upgraded in memory), checking every key and every type.

    Raises:
        ResultsError: not a dict, unknown ``schema``, or keys missing, unexpected or wrongly typed (the message
            names every such key path, e.g. ``datasets[1].runs[0].tau``, and the file when ``path`` is given).
    """
    if not isinstance(data, dict):
        raise _error([("<root>", "a JSON object", data)], path)
    schema = data.get("schema")
    if schema not in (SCHEMA, SCHEMA_V2, SCHEMA_V1):
        raise ResultsError(f"unknown results schema {schema!r}, expected {SCHEMA!r} (or {SCHEMA_V2!r}, "
                           f"{SCHEMA_V1!r})",
                           path=path,
                           hint="this file was not written by `dsparkhub verify`, or by an incompatible version")
    v1 = schema == SCHEMA_V1
    if v1:
        data = _upgrade_v1(data)
    elif schema == SCHEMA_V2:  # /3 only adds keys (the baseline's identity), whose defaults say no speculation
        data = {**data, "schema": SCHEMA}
    try:
        out = _ADAPTER.validate_json(json.dumps(data))
    except ValidationError as exc:
        raise _error([_describe_error(e) for e in exc.errors()], path) from None
    if out.method not in METHODS:
        raise ResultsError(f"key `method` is {out.method!r}, expected one of {', '.join(METHODS)}", path=path)
    if out.engine.backend not in ENGINES:
        raise ResultsError(f"key `engine.backend` is {out.engine.backend!r}, expected one of "
                           f"{', '.join(ENGINES)}", path=path)
    if out.baseline.kind not in BASELINE_KINDS:
        raise ResultsError(f"key `baseline.kind` is {out.baseline.kind!r}, expected one of "
                           f"{', '.join(BASELINE_KINDS)}", path=path)
    if out.settings.order not in ORDERS:
        raise ResultsError(f"key `settings.order` is {out.settings.order!r}, expected one of "
                           f"{', '.join(ORDERS)}", path=path)
    if v1:  # derived views a /1 file lacks: conditional acceptance, the latency-law check, load rows
        for ds in out.datasets:
            for run in ds.runs:
                run.conditional_acceptance = conditional_acceptance(run.accepted_per_pos, run.num_drafts)
                run.unreliable = assess_run(run, out.settings)
        out.summary, out.change = summarize(out.datasets, out.settings.num_speculative_tokens,
                                            out.settings.concurrency)
        out.load, out.stops_paying_at = load_rows(out.summary, out.settings.concurrency)
    if not out.categories and "categories" not in data:  # a file older than the matrix: derive it (issue 25)
        out.categories = category_rows(out.datasets)
    return out


def read_results(path: str | Path) -> VerifyResults:
    """Read and check a results file (schema /3, /2 or /1).

    Raises:
        FileNotFoundError: the file does not exist.
        ResultsError: invalid JSON, unknown schema version, a missing key or a wrongly typed value.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                           path=path) from None
    except UnicodeDecodeError:
        raise ResultsError("not a UTF-8 text file", path=path) from None
    return results_from_dict(data, path=path)



def _upgrade_v1(data: dict) -> dict:
    """A /1 dict in /2 shape: ``datasets[].baseline`` becomes ``baselines`` at concurrency 1; everything else new
    takes its default (derived views are recomputed after validation). Malformed parts are left for the validator,
    which names them."""
    d = copy.deepcopy(data)
    d["schema"] = SCHEMA
    for ds in d.get("datasets") if isinstance(d.get("datasets"), list) else []:
        if isinstance(ds, dict) and "baseline" in ds:
            b = ds.pop("baseline")
            if isinstance(b, dict) and isinstance(b.get("tokens_per_s"), (int, float)):
                b = {**b, "tokens_per_s_repeats": [b["tokens_per_s"]]}
            ds["baselines"] = [b]
    return d


def _error(problems: list[tuple[str, str, Any]], path) -> ResultsError:
    lines = [f"key `{k}`: " + (f"expected {exp}, found " + _shown(found) if exp else str(found))
             for k, exp, found in problems]
    extra = "" if len(lines) == 1 else f" (and {len(lines) - 1} more problem(s):\n  " + "\n  ".join(lines[1:]) + ")"
    return ResultsError(lines[0] + extra, path=path,
                        hint="results files are written by `dsparkhub verify`; do not edit them by hand")


_MISSING = object()


def _shown(found: Any) -> str:
    return "missing" if found is _MISSING else f"{type(found).__name__} {found!r}"[:120]


def _describe_error(err: dict) -> tuple[str, str, Any]:
    """(key path, expected in words, found) of one pydantic error, the key path in the schema's own spelling."""
    key, typ = _walk(err["loc"])
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return key, "", "unexpected key (the schema has no such key)"
    found = _MISSING if err["type"] == "missing" else err.get("input")
    return key or "<root>", _type_name(typ), found


def _walk(loc: tuple) -> tuple[str, Any]:
    """Follow ``loc`` through the dataclass annotations: (``datasets[1].runs[0].tau``, annotation at that key)."""
    typ: Any = VerifyResults
    parts: list[str] = []
    for item in loc:
        typ = _unwrap(typ)
        if isinstance(item, int) and typing.get_origin(typ) is list:
            parts[-1] += f"[{item}]"
            typ = typing.get_args(typ)[0]
        elif isinstance(item, str) and hasattr(typ, "__dataclass_fields__") and item in _hints(typ):
            parts.append(item)
            typ = _hints(typ)[item]
        elif isinstance(item, str) and hasattr(typ, "__dataclass_fields__"):
            parts.append(item)  # an unexpected key
            typ = None
        else:
            break  # a union member tag pydantic adds ("float", "none"): the key is complete
    return ".".join(parts), typ


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(typ):
    args = typing.get_args(typ)
    if args and type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return typ


def _type_name(typ) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "an object",
             list: "a list", None: "a value"}
    args = typing.get_args(typ)
    if args and type(None) in args:
        return f"{_type_name(_unwrap(typ))} or null"
    if typing.get_origin(typ) is list:
        inner = {int: "integers", float: "numbers", str: "strings"}.get(args[0], "JSON objects")
        return f"a list of {inner}"
    if hasattr(typ, "__dataclass_fields__"):
        return "a JSON object"
    return names.get(typ, str(typ))
