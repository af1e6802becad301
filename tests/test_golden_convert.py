"""Golden output of one conversion: config.json, the shard index, provenance and shard hashes, byte for byte.

The files under ``tests/data/golden/convert_deepspec/`` were written by this test before the refactor of issue 14
(``DSPARKHUB_REGOLDEN=1`` rewrites them); ``validation.json`` was added with the validation record (issue 14:
convert validates its output once and writes the record). Only the provenance's ``created`` timestamp and the
record's target identity (a hash of the temporary target path) are normalised.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dsparkhub.convert import PROVENANCE_FILE, convert
from dsparkhub.io.hashing import sha256_file
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target
from dsparkhub.validate.record import VALIDATION_FILE

GOLDEN = Path(__file__).parent / "data" / "golden" / "convert_deepspec"


def _normalised(out: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for p in sorted(out.iterdir()):
        if p.suffix == ".safetensors":
            continue
        text = p.read_text()
        if p.name == PROVENANCE_FILE:
            text, n = re.subn(r'"created": "[^"]*"', '"created": "<created>"', text)
            assert n == 1
        if p.name == VALIDATION_FILE:  # the target's identity hashes its source string, here a temporary path
            text, n = re.subn(r'"target": "[0-9a-f]{64}"', '"target": "<target identity>"', text)
            assert n == 1
        files[p.name] = text
    files["shards.sha256"] = "".join(f"{sha256_file(p)}  {p.name}\n" for p in sorted(out.glob("*.safetensors")))
    return files


def test_conversion_output_matches_golden(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    convert(run, tmp_path / "out", target, max_shard_bytes=20_000)
    got = _normalised(tmp_path / "out")
    if os.environ.get("DSPARKHUB_REGOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (GOLDEN / name).write_text(text)
    want = {p.name: p.read_text() for p in sorted(GOLDEN.iterdir())}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
