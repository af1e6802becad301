"""``verify --baseline RESULTS.json[@n]``: reading, the refusal per mismatch kind, and the rebased speedups."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsparkhub.verify.baseline_results import (NOT_INTERLEAVED, check_baseline_file, comparison_tokens_per_s,
                                               read_baseline_file, rebase)
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.settings import VerifyArgumentError

GOLDEN = Path(__file__).parent / "data" / "results_golden.json"


def _setup(res, **change):
    setup = dict(target_fingerprint=res.target.fingerprint, target_id=res.target.id, backend=res.engine.backend,
                 version=res.engine.version, datasets=[(d.name, d.source) for d in res.datasets],
                 temperature=res.settings.temperature, max_new_tokens=res.settings.max_new_tokens,
                 concurrency=list(res.settings.concurrency))
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
    (dict(target_fingerprint="ab" * 32), "target.fingerprint"),
    (dict(backend="reference"), "engine.backend"),
    (dict(version="vllm 0.34.0"), "engine.version"),
    (dict(datasets=[("alpha", "alpha.jsonl (sha256 ffffffffffff)"), ("beta", "builtin:code")]), "datasets"),
    (dict(temperature=0.7), "settings.temperature"),
    (dict(max_new_tokens=64), "settings.max_new_tokens"),
    (dict(concurrency=[1]), "settings.concurrency"),
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
