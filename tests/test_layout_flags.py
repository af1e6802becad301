"""Per-layout behaviour is recipe data (issue 28): no library code decides by comparing a layout's name, and each
flag of ``converters/*.yaml`` reaches the typed recipe (:attr:`dsparkhub.layouts.recipes.Recipe.typed`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dsparkhub.layouts.recipes import get_recipe, load_recipes

ROOT = Path(__file__).resolve().parents[1] / "dsparkhub"
#: where behaviour used to be decided by layout name (issue 28); convert's messages may still *name* a layout
CHECKED = ["validate", "hub/push.py", "verify/reference/loading.py"]


def _name_comparisons(path: Path, names: set[str]) -> list[str]:
    """``file:line`` of every comparison (``==``, ``!=``, ``in``, ``not in``) against a recipe name literal (a
    comparison of a backbone ``family``, whose names a recipe may share, is not one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        if isinstance(node.left, ast.Attribute) and node.left.attr == "family":  # a backbone family (deepseek-v4)
            continue
        for side in [node.left, *node.comparators]:
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(e, ast.Constant) and e.value in names for e in items):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_code_site_decides_by_layout_name():
    names = {r.name for r in load_recipes()}
    files = [f for c in CHECKED for f in ((ROOT / c).rglob("*.py") if (ROOT / c).is_dir() else [ROOT / c])]
    assert len(files) > 5
    assert [hit for f in files for hit in _name_comparisons(f, names)] == []


@pytest.mark.parametrize("layout, flags", [
    ("deepspec", {"training_output", "records_target_layer_count", "family_bound"}),
    ("vllm", {"records_target_layer_count"}),
    ("zlab-dflash", {"records_target_layer_count"}),
    ("k3-dspark", {"records_target_layer_count", "k3_config_rules", "own_block_layout_reader"}),
    ("torchspec-k3", {"k3_config_rules"}),
    ("minimax-m3-dspark", {"minimax_config_rules"}),
    ("speculators", {"records_target_layer_count", "served_through_speculators"}),
    ("deepseek-v4", {"own_block_layout_reader"}),
    ("torchspec", set()),
    ("speculators-eagle3", set()),
    ("eagle3-hf", set()),
])
def test_layout_flags_read_through_the_typed_recipe(layout, flags):
    typed = get_recipe(layout).typed
    every = {"training_output", "records_target_layer_count", "family_bound", "k3_config_rules",
             "minimax_config_rules", "served_through_speculators", "own_block_layout_reader"}
    assert {f for f in every if getattr(typed, f)} == flags
