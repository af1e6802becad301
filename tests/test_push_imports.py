"""What a push imports: the card renderer (``dsparkhub.card.render``, ~0.25 s of imports: calibrate,
verify.results.schema) only when the folder has a ``README.md`` to check, so an unchanged re-run of a card-less
release stays dominated by hashing (``scripts/bench_push.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsparkhub
from dsparkhub.testing import LocalHub

TOKEN = "hf_importsToken"
CHILD = """
import json, sys
from dsparkhub.hub.push import push
report = push(sys.argv[1], "alice/imports", endpoint=sys.argv[2], token=sys.argv[3], dry_run=True, validate=False)
print(json.dumps({"render": "dsparkhub.card.render" in sys.modules, "files": [f.path for f in report.plan.files]}))
"""


@pytest.fixture
def hub_url(tmp_path):
    with LocalHub(tmp_path / "hub", tokens={TOKEN: "alice"}) as server:
        yield server.url


def _dry_run_in_a_child(folder: Path, url: str) -> dict:
    """A dry-run push in a fresh interpreter (this process has imported everything already)."""
    root = str(Path(dsparkhub.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), url, TOKEN], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("card, imported", [(False, False), (True, True)])
def test_card_renderer_imported_only_for_a_folder_with_a_card(tmp_path, hub_url, card, imported):
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3DSparkModel"]}))
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    if card:
        (folder / "README.md").write_text("# tiny drafter\n")
    seen = _dry_run_in_a_child(folder, hub_url)
    assert seen["render"] is imported
    assert sorted(seen["files"]) == sorted(["config.json", "model.safetensors"] + (["README.md"] if card else []))
