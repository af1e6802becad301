"""No import cycle among dsparkhub's modules and no import against the flow, counting imports inside functions
(issues 14 and 28).

The graph has an edge A -> B when module A imports module B anywhere in its source (top level, inside a function or
under ``TYPE_CHECKING``), ``from X import name`` counting as an import of ``X.name`` when that is a module. A cycle
means the layering broke; so does an edge from a module to one in a higher layer of :data:`LAYERS`
(``io -> layouts / prompts -> target / validate / convert / attach -> verify -> card -> hub -> cli``). Modules of
one layer may import each other (the cycle test guards them).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "dsparkhub"

#: cycles inside packages other sessions are reworking (issue 14); each entry is one edge to drop once they land.
#: Remove an entry as soon as the edge is gone: the test then guards it too.
KNOWN_EDGES: set[tuple[str, str]] = {
}

#: the flow, lowest layer first: each entry lists module prefixes (a module belongs to its longest matching prefix;
#: ``dsparkhub`` alone is the package's ``__init__``). A module may import from its own layer and the ones below.
LAYERS: list[tuple[str, ...]] = [
    # leaves: errors, names, the engine / method tables, files on disk and the Hub reading client
    ("dsparkhub", "dsparkhub.errors", "dsparkhub.repo_ids", "dsparkhub.secrets", "dsparkhub.serving",
     "dsparkhub.torch_threads", "dsparkhub.io"),
    ("dsparkhub.layouts", "dsparkhub.prompts"),  # recipes, manifests, spec; prompt files and datasets
    ("dsparkhub.target", "dsparkhub.validate", "dsparkhub.convert", "dsparkhub.draft_vocab", "dsparkhub.attach",
     "dsparkhub.attach_subfolder", "dsparkhub.skeleton", "dsparkhub.skeleton_tensors"),
    ("dsparkhub.verify", "dsparkhub.calibrate", "dsparkhub.example", "dsparkhub.testing"),
    ("dsparkhub.card", "dsparkhub.compare"),
    ("dsparkhub.hub", "dsparkhub.pipeline"),  # the release: push above the card
    ("dsparkhub.cli",),
]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s longest matching prefix.

    Raises:
        LookupError: no prefix matches (a new top-level module must be placed in the table).
    """
    best = max(((len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
                if module == p or (p != "dsparkhub" and module.startswith(p + "."))), default=None)
    if best is None:
        raise LookupError(f"{module} is in no layer of LAYERS; add it where it belongs in the flow")
    return best[1]


def up_imports(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every edge ``(a, b)`` where ``b`` lies in a higher layer than ``a``, sorted."""
    return sorted((a, b) for a, bs in edges.items() for b in bs if layer_of(b) > layer_of(a))


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` over every ``.py`` under ``root`` (package data folders excluded)."""
    mods: dict[str, Path] = {}
    for p in root.rglob("*.py"):
        if "data" in p.relative_to(root).parts:
            continue
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                cands = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            edges[name].update(c for c in cands if c in mods and c != name)
    return {m: edges.get(m, set()) for m in mods}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle():
    edges = module_graph()
    for a, b in KNOWN_EDGES:
        edges[a].discard(b)
    found = cycles(edges)
    detail = "; ".join(" <-> ".join(c) + " (edges: " + ", ".join(f"{a}->{b}" for a in c for b in sorted(edges[a])
                                                                   if b in c) + ")" for c in found)
    assert not found, f"import cycle(s) among dsparkhub modules: {detail}"


def test_known_edges_still_exist():
    """An allowance whose edge is gone must be removed, so the test guards that pair again."""
    edges = module_graph()
    assert {(a, b) for a, b in KNOWN_EDGES if b not in edges.get(a, set())} == set()


def test_no_import_against_the_flow():
    found = up_imports(module_graph())
    detail = "; ".join(f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in found)
    assert not found, f"{len(found)} import(s) against the flow io -> ... -> cli: {detail}"


def test_every_module_has_a_layer():
    for module in module_graph():
        layer_of(module)  # raises for a module no prefix places


def test_detects_an_import_against_the_flow(tmp_path):
    pkg = tmp_path / "dsparkhub"
    (pkg / "io").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "io" / "__init__.py").write_text("")
    (pkg / "io" / "reader.py").write_text("def f():\n    from dsparkhub.verify import runner\n")
    (pkg / "verify").mkdir()
    (pkg / "verify" / "__init__.py").write_text("")
    (pkg / "verify" / "runner.py").write_text("from dsparkhub.io import reader\n")
    edges = module_graph(pkg)
    assert up_imports(edges) == [("dsparkhub.io.reader", "dsparkhub.verify"), ("dsparkhub.io.reader",
                                                                                "dsparkhub.verify.runner")]
    assert layer_of("dsparkhub.io.hub_checkpoint") == 0 and layer_of("dsparkhub.hub.push") == 5
    assert layer_of("dsparkhub.verify.prompts") == 3 and layer_of("dsparkhub.prompts.datasets") == 1


def test_detects_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "dsparkhub"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from dsparkhub.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from dsparkhub import a\n")
    assert cycles(module_graph(pkg)) == [["dsparkhub.a", "dsparkhub.b"]]
