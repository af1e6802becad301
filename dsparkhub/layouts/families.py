"""Expected drafter tensors per backbone family, as data: ``converters/families/<family>[-<variant>].yaml``.

A family table lists the tensors a drafter of that family must (or may) ship, with shapes written in FORMATS.md's
symbols (``[nh * hd, H]``, ``[H, A * Ht]``, ``[V, r]``) and optional ``when`` conditions. ``_heads.yaml`` holds the
heads every family shares (embedding / LM-head copies, ``d2t`` / ``t2d``, Markov head, confidence head) and is
included in every table. ``validate`` compares a :class:`~dsparkhub.layouts.spec.DraftSpec`'s tensors against
:func:`expected_tensors`.

A variable (``vars``) takes the first of its config ``keys`` that is set, else its ``default`` expression; with
``equals`` it is 1 when that key's value is (one of) the given string(s), else 0.

Expressions (shapes, ``when``, variable defaults) are evaluated by :func:`evaluate`, which accepts integers, names,
``+ - * //``, parentheses, ``and`` / ``or`` / ``not`` and comparisons, nothing else: a table can never run code.

Every table is checked when loaded against :class:`~dsparkhub.layouts.schemas.FamilyTableSchema` (strict types,
unknown keys refused) and its expressions are parsed, so a bad table fails with its file and key path.

Does not: read tensor data or decide severities (``dsparkhub.validate`` does).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dsparkhub.errors import LayoutError
from dsparkhub.layouts.datafiles import converters_dir, load_yaml_mappings
from dsparkhub.layouts.schemas import FamilyTableSchema
from dsparkhub.layouts.spec import DraftSpec

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}


def evaluate(expr, names: dict):
    """Evaluate a table expression (an int, or a string such as ``"nh * hd"``) with ``names``.

    Raises:
        LayoutError: unknown name or a construct outside the small grammar.
    """
    if isinstance(expr, bool) or isinstance(expr, int):
        return int(expr)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
            return int(node.value)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise LayoutError(f"family table expression {expr!r} uses unknown name {node.id!r}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return int(all(vals)) if isinstance(node.op, ast.And) else int(any(vals))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return int(not ev(node.operand))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            return int(_CMPOPS[type(node.ops[0])](ev(node.left), ev(node.comparators[0])))
        raise LayoutError(f"family table expression {expr!r}: {type(node).__name__} is not allowed")

    return ev(_parse(str(expr)))


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError:
        raise LayoutError(f"family table expression {text!r} is not valid") from None


def families_dir() -> Path:
    """``converters/families`` next to the recipes (see :func:`dsparkhub.layouts.datafiles.converters_dir`)."""
    return converters_dir() / "families"


def _check_expressions(data: dict, path: Path) -> None:
    """Every expression of a table (shapes, ``when``, variable defaults) parses (the grammar is checked when it is
    evaluated).

    Raises:
        LayoutError: naming the file, the key path and the expression.
    """
    exprs = [(f"vars.{name}.default", rule["default"]) for name, rule in (data.get("vars") or {}).items()
             if "default" in rule]
    for section in ("per_layer", "backbone", "tensors"):
        for i, entry in enumerate(data.get(section) or []):
            if "when" in entry:
                exprs.append((f"{section}[{i}].when", entry["when"]))
            if isinstance(entry["shape"], list):
                exprs += [(f"{section}[{i}].shape[{j}]", x) for j, x in enumerate(entry["shape"])]
    for key, expr in exprs:
        if isinstance(expr, str):
            try:
                _parse(expr)
            except LayoutError:
                raise LayoutError(f"family table key `{key}`: expected an expression (integers, names, + - * //, "
                                  f"comparisons, and / or / not), found {expr!r}", path=path) from None


@lru_cache(maxsize=4)
def _tables(folder: str) -> dict[str, dict]:
    out = {}
    for path, data in load_yaml_mappings(folder, what="family table", error=LayoutError, schema=FamilyTableSchema):
        _check_expressions(data, path)
        data["_path"] = str(path)
        out[path.stem] = data
    return out


@dataclass(frozen=True)
class ExpectedTensor:
    """One tensor a family table names: canonical name, shape (None = any), whether it may be absent."""

    name: str
    shape: tuple[int, ...] | None
    optional: bool


def table_for(spec: DraftSpec, folder: str | Path | None = None) -> dict | None:
    """The family table for ``spec`` (``<family>-<variant>`` first, then ``<family>``), or None when none exists."""
    tables = _tables(str(folder or families_dir()))
    for key in (f"{spec.family}-{spec.variant}", spec.family):
        t = tables.get(key)
        if t is not None and spec.variant in (t.get("variants") or [spec.variant]):
            return t
    return None


def markov_head_types(spec: DraftSpec, folder: str | Path | None = None) -> list[str]:
    """The Markov head types vLLM serves for ``spec``'s family (table key ``markov_head_types``; default
    ``["vanilla"]``, the only head vLLM 0.32 has; Mistral Large 4 adds ``rnn`` in vLLM 0.34)."""
    table = table_for(spec, folder)
    return list((table or {}).get("markov_head_types") or ["vanilla"])


def family_of_target(model_type: str | None, folder: str | Path | None = None) -> str | None:
    """The drafter family whose table lists ``model_type`` (a target's text model type) in ``target_model_types``,
    or None when no table does (a target dsparkhub knows no DSpark family for)."""
    for table in _tables(str(folder or families_dir())).values():
        if model_type in (table.get("target_model_types") or []):
            return table.get("family")
    return None


def _names(spec: DraftSpec, table: dict) -> dict:
    c = spec.decoder_config
    names = {"H": spec.hidden_size, "V": spec.vocab_size, "Vd": spec.draft_vocab_size, "r": spec.markov_rank,
             "A": len(spec.target_layer_ids), "Ht": spec.target_hidden_size, "L": spec.num_layers,
             "dspark": int(spec.variant == "dspark"),
             "dflash2": int(spec.variant == "dflash2"), "confidence": int(spec.confidence_head),
             "with_markov": int(spec.confidence_head_with_markov), "B": spec.block_size,
             "rnn_head": int(spec.markov_head_type == "rnn"),
             "reduced_vocab": int(spec.draft_vocab_size != spec.vocab_size),
             "has_embed": 1, "has_lm_head": 1, "confidence_bias": 1}
    # a var's keys are looked up in the backbone config, then in the layout keys the recipe carries (extras:
    # EAGLE-3 norm_before_fc, DFlash2 conv_kernel_size, ...)
    lookup = {**spec.extras, **c}
    for var, rule in (table.get("vars") or {}).items():
        value = next((lookup[k] for k in rule.get("keys") or [] if lookup.get(k) is not None), None)
        if "equals" in rule:  # a flag from a string key: {keys: [model_type], equals: deepseek_v41} -> 1 / 0
            value = int(value in (rule["equals"] if isinstance(rule["equals"], list) else [rule["equals"]]))
        if value is None:
            value = evaluate(rule.get("default", "0"), names)
        names[var] = int(value) if isinstance(value, (bool, int)) else value
    return names


def expected_tensors(spec: DraftSpec, folder: str | Path | None = None) -> tuple[list[ExpectedTensor], bool]:
    """The tensors a drafter of ``spec``'s family / variant must or may ship.

    Returns:
        ``(expected tensors, open_layers)``; ``open_layers`` is True for families whose per-layer parameter list is
        not pinned (DeepSeek-V4 stages): any ``layers.{i}.*`` name is then accepted.

    Raises:
        LayoutError: no table for the family, or a malformed expression in it.
    """
    folder = folder or families_dir()
    table = table_for(spec, folder)
    if table is None:
        raise LayoutError(f"no expected-tensor table for a {spec.family} {spec.variant} drafter in {folder}")
    heads = _tables(str(folder)).get("_heads") or {}
    names = _names(spec, table)

    def shape_of(entry, extra=None):
        s = entry.get("shape")
        if s == "any":
            return None
        return tuple(evaluate(x, {**names, **(extra or {})}) for x in s)

    def active(entry):
        return bool(evaluate(entry.get("when", "1"), names))

    out: dict[str, ExpectedTensor] = {}
    for i in range(spec.num_layers):
        for e in table.get("per_layer") or []:
            if active(e):
                n = f"layers.{i}.{e['name']}"
                out[n] = ExpectedTensor(n, shape_of(e, {"i": i}), bool(e.get("optional")))
    for e in list(table.get("backbone") or []) + list(heads.get("tensors") or []):
        if active(e):
            prev = out.get(e["name"])
            out[e["name"]] = ExpectedTensor(e["name"], shape_of(e), bool(e.get("optional"))
                                            and (prev is None or prev.optional))
    return list(out.values()), bool(table.get("open_layers"))
