"""One ``dsparkhub verify`` opens the drafter once and the target once (issue 28): the CLI opens both
(``verify.runner.open_inputs``) and the opened values travel down to validation, the method, the reference engine and
the results' names.

Calls are counted by code object with ``sys.setprofile``, so a reader that imported the function under its own name
(``from dsparkhub.layouts.reading import open_draft``) is counted as well as one that calls it through its module.
"""

from __future__ import annotations

import collections
import sys

from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.io.header import read_header
from dsparkhub.layouts.deepspec_run import resolve_step_dir
from dsparkhub.layouts.reading import open_draft
from dsparkhub.target import open_target

COUNTED = {f.__code__: f.__name__ for f in (open_draft, open_target, resolve_step_dir, read_header)}


def _count_calls(fn) -> tuple[object, collections.Counter]:
    """``fn()`` with every call of a :data:`COUNTED` function counted; returns ``(fn's value, counts by name)``."""
    counts: collections.Counter = collections.Counter()
    read: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in COUNTED:
            counts[COUNTED[frame.f_code]] += 1
            if frame.f_code is read_header.__code__:
                read[str(frame.f_locals.get("path"))] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        value = fn()
    finally:
        sys.setprofile(previous)
    counts["header files read twice"] = sum(1 for n in read.values() if n > 1)
    return value, counts


def test_one_verify_opens_drafter_and_target_once(example, tmp_path):
    # the DeepSpec run folder itself: its step_latest is resolved once, by the one open
    args = ["verify", str(example.deepspec_run), "--target", str(example.target), "-n", "3",
            "--datasets", str(example.prompts), "--max-prompts", "1", "--max-new-tokens", "4", "--repeats", "1",
            "--out", str(tmp_path / "results.json"), "--quiet"]
    res, counts = _count_calls(lambda: CliRunner().invoke(main, args))
    assert res.exit_code == 0, res.output
    # before issue 28: open_draft 3 (method, validation, engine), open_target 2 (validation, results' name),
    # resolve_step_dir 8, each model.safetensors header parsed 3 / 2 times
    assert counts == {"open_draft": 1, "open_target": 1, "resolve_step_dir": 1, "read_header": 2,
                      "header files read twice": 0}, counts
    assert f"wrote {tmp_path / 'results.json'}" in res.output
