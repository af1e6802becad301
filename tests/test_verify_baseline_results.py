"""``verify --baseline RESULTS.json[@n]``: reading, the refusal per mismatch kind, and the rebased speedups."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsparkhub.verify.baseline_results import (
    NOT_INTERLEAVED,
    check_baseline_file,
    comparison_tokens_per_s,
    read_baseline_file,
    rebase,
)
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.settings import VerifyArgumentError

GOLDEN = Path(__file__).parent / "data" / "results_golden.json"


def _setup(res, **change):
    setup = {"target_fingerprint": res.target.fingerprint, "target_id": res.target.id, "backend": res.engine.backend,
                 "version": res.engine.version, "datasets": [(d.name, d.source) for d in res.datasets],
                 "temperature": res.settings.temperature, "max_new_tokens": res.settings.max_new_tokens,
                 "concurrency": list(res.settings.concurrency)}
    setup.update(change)
    return setup


@pytest.fixture
def base_file(tmp_path):
    path = tmp_path / "other.json"
    shutil.copy(GOLDEN, path)
    return path


def test_read_baseline_file_names_the_file_sha256_and_n(base_file, tmp_path):
    import hashlib

    assert read_baseline_file(str(tmp_path)) is None  # a folder: the drafter baseline's business
    base = read_baseline_file(f"{base_file}@4")
    assert base.n == 4 and base.sha256 == hashlib.sha256(base_file.read_bytes()).hexdigest()
    assert base.ref.kind == "results" and base.ref.fingerprint == base.sha256 and base.ref.label == "other.json n=4"
    with pytest.raises(VerifyArgumentError, match="after @"):
        read_baseline_file(f"{base_file}@x")
    check_baseline_file(base, **_setup(base.results))  # the same setup passes


@pytest.mark.parametrize("change, key", [
    ({"target_fingerprint": "ab" * 32}, "target.fingerprint"),
    ({"backend": "reference"}, "engine.backend"),
    ({"version": "vllm 0.34.0"}, "engine.version"),
    ({"datasets": [("alpha", "alpha.jsonl (sha256 ffffffffffff)"), ("beta", "builtin:code")]}, "datasets"),
    ({"temperature": 0.7}, "settings.temperature"),
    ({"max_new_tokens": 64}, "settings.max_new_tokens"),
    ({"concurrency": [1]}, "settings.concurrency"),
])
def test_each_difference_is_refused_by_name(base_file, change, key):
    base = read_baseline_file(str(base_file))
    with pytest.raises(VerifyArgumentError) as err:
        check_baseline_file(base, **_setup(base.results, **change))
    msg = str(err.value).splitlines()[0]  # one paragraph (the hint follows on its own line)
    assert key in msg and str(base_file) in msg and "Nothing was loaded" in msg


def test_two_differences_are_named_in_one_paragraph(base_file):
    base = read_baseline_file(f"{base_file}@99")
    with pytest.raises(VerifyArgumentError) as err:
        check_baseline_file(base, **_setup(base.results, max_new_tokens=64))
    assert "settings.max_new_tokens" in str(err.value) and "num_speculative_tokens: expected 99" in str(err.value)


def test_speedups_are_rebased_on_the_files_chosen_configuration(base_file, tmp_path):
    res = read_results(GOLDEN)
    ds = res.datasets[0]
    best = read_baseline_file(str(base_file))  # default: the file's best n per concurrency
    n_best = res.best_n(1)[0]
    assert comparison_tokens_per_s(best)[ds.name, 1] == ds.run(n_best, 1).tokens_per_s
    plain = read_baseline_file(f"{base_file}@0")  # @0: the file's own no-speculation baseline
    assert comparison_tokens_per_s(plain)[ds.name, 1] == ds.baseline_at(1).tokens_per_s

    rebased = rebase(res, best)
    run = rebased.datasets[0].run(n_best, 1)
    assert run.speedup == pytest.approx(1.0) and NOT_INTERLEAVED in run.unreliable
    assert rebased.baseline.kind == "results" and rebased.baseline.fingerprint == best.sha256
    assert rebased.speedup_label == "speedup vs other.json"
    back = read_results(rebased.save(tmp_path / "rebased.json"))  # the schema keeps the file's ref
    assert back.baseline == rebased.baseline and back.datasets[0].run(n_best, 1).speedup == pytest.approx(1.0)


def test_verify_against_a_results_file_end_to_end(example, tmp_path):
    """One verify run is the baseline file of a second one: a different --max-new-tokens is refused before the
    engine starts (no file), the same setup rebases every speedup on the file's n=3 tokens/s."""
    import torch
    from click.testing import CliRunner

    from dsparkhub.cli import main

    torch.set_num_threads(1)

    def verify(out, *extra):
        return CliRunner().invoke(main, ["verify", str(example.dspark_step), "--target", str(example.target),
                                         "-n", "3", "--datasets", f"heldout={example.prompts}", "--max-prompts", "2",
                                         "--max-new-tokens", "12", "--concurrency", "1", "--out", str(out),
                                         "--quiet", *extra])

    first = tmp_path / "first.json"
    assert verify(first).exit_code == 0
    refused = verify(tmp_path / "no.json", "--baseline", str(first), "--max-new-tokens", "8")
    assert refused.exit_code != 0 and "settings.max_new_tokens: expected 8, found 12" in refused.output
    assert not (tmp_path / "no.json").exists()
    second = tmp_path / "second.json"
    res = verify(second, "--baseline", f"{first}@3")
    assert res.exit_code == 0, res.output
    r, f = read_results(second), read_results(first)
    run = r.datasets[0].run(3, 1)
    assert r.baseline.kind == "results" and r.baseline.n == 3 and r.baseline.id == "first.json"
    assert run.baseline_tokens_per_s == f.datasets[0].run(3, 1).tokens_per_s and NOT_INTERLEAVED in run.unreliable
    assert run.speedup == pytest.approx(run.tokens_per_s / run.baseline_tokens_per_s)
