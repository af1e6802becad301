"""The card README.md generated from fixed results files and a fixed drafter folder (tests/data/card/) is byte for
byte the committed tests/data/card/README.md: refactors of dsparkhub.card must not change a card.

Regenerate deliberately (after a reviewed change to the card) with ``DSPARKHUB_REGOLDEN=1 pytest
tests/test_card_golden.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dsparkhub.card.render import write_card

DATA = Path(__file__).parent / "data" / "card"


def test_card_readme_is_byte_identical_to_the_golden_file(tmp_path):
    draft = tmp_path / "drafter"
    shutil.copytree(DATA / "drafter", draft)
    out = write_card(draft, [DATA / "results_reference.json", DATA / "results_vllm.json"],
                     repo_id="org/qwen3-8b-dspark", license="apache-2.0")
    got = out.readme.read_bytes()
    golden = DATA / "README.md"
    if os.environ.get("DSPARKHUB_REGOLDEN"):
        golden.write_bytes(got)
    assert got == golden.read_bytes()
    assert sorted(p.name for p in (draft / "assets").iterdir()) == sorted(p.name for p in out.plots)
