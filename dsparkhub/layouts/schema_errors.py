"""Checking a parsed data file against its schema (:mod:`dsparkhub.layouts.schemas`), and msgspec's validation
message in the project's words.

:func:`check` converts with ``msgspec.convert`` (strict: no ``"1"`` for ``1``, no ``true`` for an integer; unknown keys
refused by the Structs). A failure raises the reader's error class naming the file, the key path as the file spells
it (``tensors.rename[3].canonical``, ``facts.hidden_size.verified``, ``shared_on_last_stage['main_proj.']``), what was
expected and what was found: msgspec's ``Expected `str`, got `int` - at `$.tensors.rename[3].canonical``` is
translated by :func:`describe`, which walks the data and the schema together to name the dict keys msgspec writes as
``[...]`` and to show the value found.

Upstream: msgspec 0.18+ ``msgspec.convert``, ``msgspec.structs.fields``, ``msgspec.Meta``
(https://jcristharif.com/msgspec/usage.html). Does not: define the schemas or parse YAML.
"""

from __future__ import annotations

import re
import reprlib
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec

from dsparkhub.errors import DsparkhubError

S = typing.TypeVar("S")


def check(data: Any, schema: type[S], *, what: str, path, error: type[DsparkhubError], hint: str | None = None) -> S:
    """``data`` converted to ``schema`` (strict types, unknown keys refused).

    Args:
        data: a parsed YAML mapping.
        schema: one of this module's Structs.
        what: what the file is, for messages (``"recipe"``, ``"target manifest"``).
        path: the file, for the error.
        error: the error class raised.
        hint: the error's hint (how to fix the file), if any.

    Raises:
        error: the data breaks the schema; the message names the key path, what was expected and what was found.
    """
    try:
        return msgspec.convert(data, schema)
    except msgspec.ValidationError as exc:
        raise error(describe(str(exc), data, schema, what), path=path, hint=hint) from None


_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<keyin>`key` in )?`\$(?P<at>[^`]*)`)?$", re.S)
_SEGMENT = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")
_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "null": "null",
          "array": "a list", "object": "a mapping"}
_KINDS = {list: "array", dict: "object", str: "str", int: "int", float: "float", bool: "bool"}
_MISSING = object()


def describe(message: str, data: Any, schema: type, what: str) -> str:
    """A msgspec ValidationError message as "<what> key `a.b[3].c`: expected ..., found ..."."""
    m = _AT.match(message)
    msg, at = m.group("msg"), m.group("at") or ""
    key, node, typ = _walk(data, schema, at)
    field = re.fullmatch(r"Object (contains unknown|missing required) field `(.+)`", msg)
    if field and field.group(1) == "contains unknown":
        known = sorted(f.encode_name for f in msgspec.structs.fields(_struct_of(typ) or schema))
        return f"unknown {what} key `{_join(key, field.group(2))}`; known keys there: {', '.join(known)}"
    if field:
        return f"{what} lacks required key `{_join(key, field.group(2))}`"
    if m.group("keyin"):
        bad = next((k for k in node if not isinstance(k, str)), None) if isinstance(node, dict) else None
        return f"{what} keys{f' under `{key}`' if key else ''} must be strings, found key {_shown(bad)}"
    expected = re.fullmatch(r"Expected (.+?)(?:, got `\w+`)?", msg)
    if msg.startswith("Invalid enum value") or (expected and _description(typ)):
        options = ", ".join(map(repr, _literal_options(typ)))
        words = f"{_description(typ)} ({options})" if _description(typ) else f"one of {options}"
        others = [_kind_word(t) for t in _members(typ) if typing.get_origin(t) is not Literal and t is not type(None)]
        return f"{what} key `{key}`: expected {' or '.join([*others, words])}, found {_shown(node)}"
    if expected:
        words = " or ".join(_word(t) for t in re.split(r"`\s*\|\s*`|\s\|\s", expected.group(1)))
        if "an integer" in words and not re.search(r"[<>]=", words):  # msgspec names the bound only when broken
            words = words.replace("an integer", "an integer" + _bounds(typ), 1)
        return f"{what} key `{key or '<top level>'}`: expected {words}, found {_shown(node)}"
    return f"{what} key `{key or '<top level>'}`: {msg}"


def _word(token: str) -> str:
    token = token.strip()
    m = re.fullmatch(r"`?(\w+)`?(.*)", token)
    return _WORDS.get(m.group(1), m.group(1)) + m.group(2) if m else token


def _kind_word(typ: Any) -> str:
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        return "a mapping"
    return _word(_KINDS.get(typing.get_origin(typ) or typ, "value"))


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    if value is None:
        return "null"
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _walk(data: Any, schema: type, at: str) -> tuple[str, Any, Any]:
    """Follow msgspec's ``at`` path (``.a.b[3][...]``) through ``data`` and ``schema`` together.

    Returns:
        ``(key path as the file spells it, the value there, the annotation there)``; a ``[...]`` (a dict value
        msgspec does not name) becomes the first key of that dict whose value breaks the value type.
    """
    key, node, typ = "", data, schema
    for m in _SEGMENT.finditer(at):
        typ = _member_for(typ, node)
        name, index = m.group(1), m.group(2)
        if name is not None:
            struct = _struct_of(typ)
            fields = {f.encode_name: f.type for f in msgspec.structs.fields(struct)} if struct else {}
            typ = fields.get(name)
            node = node.get(name, _MISSING) if isinstance(node, dict) else _MISSING
            key = _join(key, name)
        elif index is not None:
            typ = (typing.get_args(_bare(typ)) or (Any,))[0]
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else _MISSING
            key += f"[{index}]"
        else:  # [...]: a value of a dict
            value_type = (typing.get_args(_bare(typ)) or (Any, Any))[-1]
            bad = next((k for k, v in node.items() if not _fits(v, value_type)), None) \
                if isinstance(node, dict) else None
            typ, node = value_type, (node.get(bad, _MISSING) if isinstance(node, dict) else _MISSING)
            key = _join(key, str(bad)) if re.fullmatch(r"[A-Za-z_][\w-]*", str(bad)) else f"{key}[{bad!r}]"
    return key, node, _member_for(typ, node)


def _fits(value: Any, typ: Any) -> bool:
    try:
        msgspec.convert(value, typ)
        return True
    except msgspec.ValidationError:
        return False


def _bare(typ: Any) -> Any:
    """``typ`` without ``Annotated`` metadata."""
    while typing.get_origin(typ) is Annotated:
        typ = typing.get_args(typ)[0]
    return typ


def _members(typ: Any) -> tuple:
    typ = _bare(typ)
    return tuple(_bare(t) for t in typing.get_args(typ)) if _is_union(typ) else (typ,)


def _is_union(typ: Any) -> bool:
    return typing.get_origin(typ) in (Union, types.UnionType)


def _member_for(typ: Any, node: Any) -> Any:
    """The union member of ``typ`` that has ``node``'s kind (mapping, list, other), annotations kept."""
    bare = _bare(typ)
    if not _is_union(bare):
        return typ
    for member in typing.get_args(bare):
        origin = typing.get_origin(_bare(member)) or _bare(member)
        if isinstance(node, dict) and (origin is dict or isinstance(origin, type) and issubclass(origin,
                                                                                               msgspec.Struct)):
            return member
        if isinstance(node, list) and origin is list:
            return member
    return typ


def _struct_of(typ: Any):
    return next((t for t in _members(typ) if isinstance(t, type) and issubclass(t, msgspec.Struct)), None)


def _description(typ: Any) -> str | None:
    """The ``Meta(description=...)`` of an annotation (``a safetensors dtype code``), if any."""
    for member in (typ, *typing.get_args(_bare(typ))):
        if typing.get_origin(member) is Annotated:
            for meta in typing.get_args(member)[1:]:
                if isinstance(meta, msgspec.Meta) and meta.description:
                    return meta.description
    return None


def _bounds(typ: Any) -> str:
    """`` >= 1`` for an integer annotated ``Meta(gt=0)``, ``""`` when unbounded."""
    for member in (typ, *typing.get_args(_bare(typ))):
        if typing.get_origin(member) is Annotated:
            for meta in typing.get_args(member)[1:]:
                if isinstance(meta, msgspec.Meta) and (meta.ge is not None or meta.gt is not None):
                    return f" >= {meta.ge if meta.ge is not None else meta.gt + 1}"
    return ""


def _literal_options(typ: Any) -> list:
    return [v for t in _members(typ) if typing.get_origin(t) is Literal for v in typing.get_args(t)]
