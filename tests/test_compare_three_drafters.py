"""Issue 30: LightSeek's table shape (τ and tokens/s per concurrency for EAGLE-3, DFlash and DSpark on one target,
with the crossover line) from three real ``dsparkhub verify`` results files on the example-sized stand-ins: the
example's target, its DFlash and DSpark drafters, and an EAGLE-3 trained for it (``example_eagle3``)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.compare import compare, load_sources

CONCURRENCIES = [1, 2, 4]


@pytest.fixture(scope="module")
def example_eagle3(example, tmp_path_factory):
    """A tiny EAGLE-3 drafter (speculators layout) trained for the example's target (under a minute on 2 cores,
    ``dsparkhub.example.eagle3``)."""
    from dsparkhub.example.eagle3 import train_example_eagle3

    return train_example_eagle3(example.target, tmp_path_factory.mktemp("example-eagle3") / "eagle3_drafter")


@pytest.mark.slow
def test_three_drafters_lightseek_table(example, example_eagle3, tmp_path, capsys):
    files = []
    for name, draft in (("eagle3", example_eagle3), ("dflash", example.dflash), ("dspark", example.dspark_step)):
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(example.target), "-n", "3",
                                        "--datasets", f"heldout={example.prompts}", "--max-prompts", "4",
                                        "--max-new-tokens", "32", "--concurrency", ",".join(map(str, CONCURRENCIES)),
                                        "--repeats", "1", "--out", str(out), "--quiet"])
        assert res.exit_code == 0, res.output  # exit 1 on a lossless failure: every run here is lossless
        files.append(str(out))
    (cmp,) = compare(load_sources(files))
    assert cmp.concurrencies == CONCURRENCIES and len(cmp.load) == 3
    methods = {row.label: row.method for row in cmp.rows}
    assert sorted(methods.values()) == ["dflash", "dspark", "eagle3"]
    eagle3 = next(label for label, method in methods.items() if method == "eagle3")
    for c in CONCURRENCIES:
        assert cmp.load[eagle3][c].tau > 1.5  # the trained EAGLE-3 really accepts drafts
        assert all(cmp.load[label][c].tokens_per_s > 0 for label in cmp.load)
    res = CliRunner().invoke(main, ["compare", *files])
    assert res.exit_code == 0, res.output
    with capsys.disabled():  # the table of the closing note
        print("\n" + res.output)
    assert "\ncrossover: " in res.output, res.output
    for label in cmp.load:
        assert label in res.output
