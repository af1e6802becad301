"""validation.json (issue 14): the settings-independent validation is stored once and handed on.

- the record gives exactly the report ``validate`` gives, for every n and engine, at any path of the folder;
- the quickstart validates the source once (convert's gate, before writing) and the output once (the record):
  verify, card and push reuse it;
- a record that no longer describes the folder (config or a tensor header changed, another target, another
  dsparkhub version) is ignored and the drafter validated again; a malformed one is ignored with a reason by the
  consumers that validate (verify, push) and refused by the card, which publishes its outcome.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import dsparkhub.validate as validate_pkg
from dsparkhub.card.facts import validation_fact
from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.errors import CardError, CheckpointFormatError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.pipeline import QUICKSTART_BASE_MODEL
from dsparkhub.target import open_target
from dsparkhub.testing.factories import (make_deepspec_drafter, make_eagle3_drafter, make_qwen3_target,
                                         make_speculators_drafter, make_zlab_dflash_drafter)
from dsparkhub.validate import validate, validate_base
from dsparkhub.validate.record import (SCHEMA, VALIDATION_FILE, make_record, matching_record, read_record,
                                       validate_reusing, write_record)
from dsparkhub.verify.stats import RunStats


def _save(folder, target, deep=False):
    d, t = open_draft(folder), open_target(target)
    return write_record(d.checkpoint.path, make_record(validate_base(d, t, deep=deep), d, t))


def _fixtures(root: Path) -> list[tuple[Path, Path]]:
    """Drafters of several layouts, with findings that carry paths, the target's source and every settings rule:
    the final target layer among the ids (DSH304 / DSH313), a `dflash` folder name (DSH107), a wrong sidecar
    (DSH501), a missing tensor (DSH201), a config key the layout leaves implicit (DSH113)."""
    target = make_qwen3_target(root / "target")
    last = make_deepspec_drafter(root / "run-last", target, target_layer_ids=(0, 1, 3)) / "step_latest"
    sts = make_deepspec_drafter(root / "run-dflash-sts", target) / "step_latest"
    (sts / "dspark_sts.json").write_text(json.dumps({"temperatures": [1.0, 1.1]}))
    broken = make_deepspec_drafter(root / "run-broken", target, drop=("fc.weight",)) / "step_latest"
    return [(last, target), (sts, target), (broken, target),
            (make_zlab_dflash_drafter(root / "zlab", target, target_layer_ids=(0, 3)), target),
            (make_speculators_drafter(root / "spec", target, sample_from_anchor=None), target),
            (make_eagle3_drafter(root / "eagle", target), target)]


def _equal_everywhere(folder: Path, target: Path, report_path: Path | None = None) -> set[str]:
    record = read_record(folder)
    path = report_path or folder
    codes: set[str] = set()
    for n in (None, 1, 3, 7, 12):
        for engine in ("vllm", "reference"):
            want = validate(path, target, num_speculative_tokens=n, engine=engine)
            got = record.report_for(path, str(target), num_speculative_tokens=n, engine=engine)
            assert got == want, (folder, n, engine)
            assert got.to_dict() == want.to_dict()
            codes |= want.codes
    return codes


def test_record_gives_the_same_report_as_validate_for_every_n_and_engine(tmp_path):
    codes: set[str] = set()
    for i, (folder, target) in enumerate(_fixtures(tmp_path)):
        _save(folder, target)
        codes |= _equal_everywhere(folder, target)
        # the same record read at another path of the same files: the locations follow the folder
        moved = shutil.copytree(folder.resolve(), tmp_path / "moved" / str(i) / folder.resolve().name)
        codes |= _equal_everywhere(moved, target)
    # the fixtures exercise the settings rules and findings whose text holds the drafter's path and the target's
    assert {"DSH304", "DSH313", "DSH401", "DSH402", "DSH107", "DSH501", "DSH201"} <= codes


def test_record_is_exact_for_the_example(example, tmp_path):
    out = tmp_path / "drafter"
    convert(example.deepspec_run, out, example.target)
    _equal_everywhere(out, example.target)


def test_record_follows_the_folder_when_moved_and_never_stores_local_paths(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target, target_layer_ids=(0, 1, 3))
    convert(run, tmp_path / "out", target)  # written in a temporary folder, then renamed
    text = (tmp_path / "out" / VALIDATION_FILE).read_text()
    assert str(tmp_path) not in text and ".tmp-" not in text
    moved = tmp_path / "eagle3-named" / "out"  # a name vLLM sniffs: DSH107 follows the path the report names
    moved.parent.mkdir()
    shutil.move(tmp_path / "out", moved)
    assert "DSH107" not in validate(run / "step_latest", target).codes
    codes = _equal_everywhere(moved, target)
    assert "DSH107" in codes
    record, why = matching_record(open_draft(moved), open_target(target))
    assert record is not None and why is None


def test_deep_findings_only_from_a_deep_record(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    step = make_deepspec_drafter(tmp_path / "run", target) / "step_latest"
    d, t = open_draft(step), open_target(target)
    _save(step, target)
    assert matching_record(d, t, deep=True)[0] is None  # a header-only record cannot answer a deep question
    _save(step, target, deep=True)
    record, _ = matching_record(d, t, deep=True)
    assert record.report_for(step, str(target), deep=True) == validate(step, target, deep=True)
    assert record.report_for(step, str(target)) == validate(step, target)


# ---- once per pipeline ------------------------------------------------------------------------------------------


class _Backend:
    """A lossless fake engine: the same tokens with and without the drafter, half the drafts accepted per position."""

    name, version, device = "reference", "fake", "cpu (fake)"

    def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0):
        outputs = [[(sum(p) + k) % 97 for k in range(max_new_tokens)] for p in prompts]
        n, k = num_speculative_tokens, len(prompts)
        if n is None:
            return RunStats(outputs=outputs, wall_s=2.0)
        return RunStats(outputs=outputs, wall_s=1.0, num_drafts=2 * k, num_draft_tokens=2 * k * n,
                        num_accepted_tokens=n * k, accepted_per_pos=[k] * n)

    def close(self):
        pass


@pytest.fixture
def counted(monkeypatch):
    """Every settings-independent validation pass, by the folder it read."""
    calls: list[Path] = []
    real = validate_pkg.validate_base

    def counting(d, t, **kw):
        calls.append(Path(d.checkpoint.path))
        return real(d, t, **kw)

    monkeypatch.setattr(validate_pkg, "validate_base", counting)
    return calls


def test_quickstart_validates_the_output_once_and_hands_the_record_on(tmp_path, monkeypatch, counted):
    import dsparkhub.pipeline as pipeline
    import dsparkhub.verify.runner as runner

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": [i, i + 1, i + 2]}) + "\n" for i in range(3)))
    ex = SimpleNamespace(target=target, deepspec_run=run, prompts=prompts)
    monkeypatch.setattr(pipeline, "build_example", lambda: ex)
    monkeypatch.setattr(runner, "make_backend", lambda *a, **kw: _Backend())
    q = pipeline.quickstart(tmp_path / "out", max_new_tokens=4, progress=False)
    assert q.ok and q.push.committed
    # convert's gate read the source once; its output was validated once (in the temporary folder, before the
    # rename), and the validate / verify / card / push steps reused that record
    assert len(counted) == 2 and counted[0] == Path(open_draft(run).checkpoint.path)
    assert counted[1].parent == q.drafter.parent and counted[1].name.startswith(f".{q.drafter.name}.tmp-")
    assert q.report == validate(q.drafter, target, num_speculative_tokens=7)
    assert VALIDATION_FILE in {f.path for f in q.push.plan.files if f.action == "add"}
    # the example target has no Hub id: the card names it by the quickstart's --base-model, never by its folder
    assert f"Validation:** passed against `{QUICKSTART_BASE_MODEL}`" in q.card.readme.read_text()


def _changed_config(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (folder / "config.json").write_text(json.dumps(cfg))


def _changed_header(folder: Path) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata={"format": "pt", "edited": "yes"})


@pytest.mark.parametrize("change", [_changed_config, _changed_header])
def test_a_stale_record_is_ignored_and_the_drafter_validated_again(tmp_path, counted, change):
    target = make_qwen3_target(tmp_path / "target")
    out = tmp_path / "out"
    result = convert(make_deepspec_drafter(tmp_path / "run", target), out, target)
    counted.clear()
    report, used = validate_reusing(out, target, record=result.validation)
    assert used is not None and counted == []
    change(out)
    why: list[str] = []
    report, used = validate_reusing(out, target, record=result.validation, note=why.append)
    assert used is None and counted == [out] and "changed since it was written" in why[0]
    assert report == validate(out, target)
    counted.clear()
    assert validate_reusing(out, target, note=why.append)[1] is None and counted == [out]  # the file too
    assert validation_fact(out, "org/t") is None  # the card shows no stale outcome


def test_a_record_of_another_target_is_ignored(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    out = tmp_path / "out"
    convert(make_deepspec_drafter(tmp_path / "run", target), out, target)
    other = make_qwen3_target(tmp_path / "other", layers=5)
    record, why = matching_record(open_draft(out), open_target(other))
    assert record is None and "another target" in why
    record, why = matching_record(open_draft(out), None)
    assert record is None and "another target" in why


@pytest.mark.parametrize("tamper, expected", [
    (lambda d: {**d, "surprise": 1}, "surprise"),
    (lambda d: {**d, "schema": "dsparkhub.validation/0"}, "key `schema` must be"),
    (lambda d: {**d, "key": {**d["key"], "deep": "no"}}, "key.deep"),
    (None, "not valid JSON"),
])
def test_a_malformed_record_is_named_by_the_reader_ignored_by_verify_and_push_refused_by_the_card(
        tmp_path, counted, tamper, expected):
    target = make_qwen3_target(tmp_path / "target")
    out = tmp_path / "out"
    convert(make_deepspec_drafter(tmp_path / "run", target), out, target)
    path = out / VALIDATION_FILE
    data = json.loads(path.read_text())
    path.write_text("{not json" if tamper is None else json.dumps(tamper(data)))
    with pytest.raises(CheckpointFormatError, match=expected) as ei:
        read_record(out)
    assert ei.value.path == str(path)
    counted.clear()
    why: list[str] = []
    report, used = validate_reusing(out, target, note=why.append)
    assert used is None and counted == [out] and why[0].startswith(f"{VALIDATION_FILE} ignored:") and expected in why[0]
    with pytest.raises(CardError, match=expected):
        validation_fact(out, "org/t")


def test_push_leaves_a_stale_record_out(tmp_path, monkeypatch):
    from dsparkhub.hub.push import push
    from dsparkhub.testing.hub_server.hub import LocalHub

    target = make_qwen3_target(tmp_path / "target")
    out = tmp_path / "out"
    convert(make_deepspec_drafter(tmp_path / "run", target), out, target)
    _changed_config(out)
    monkeypatch.setenv("HF_TOKEN", "hf_aliceToken000000000000000000000000")
    with LocalHub(tmp_path / "hub", tokens={"hf_aliceToken000000000000000000000000": "alice"}) as hub, \
            hub.client_settings():
        report = push(out, "alice/x", dry_run=True, target=str(target), endpoint=hub.url)
    assert VALIDATION_FILE not in {f.path for f in report.plan.files}
    assert any(f"{VALIDATION_FILE} (stale record: the drafter's config or weights changed" in n for n in report.notes)


def test_cli_validate_writes_the_record_only_with_save(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    step = make_deepspec_drafter(tmp_path / "run", target) / "step_latest"
    before = sorted(p.name for p in step.iterdir())
    res = CliRunner().invoke(main, ["validate", str(step), "--target", str(target), "-n", "7"])
    assert res.exit_code == 0 and sorted(p.name for p in step.iterdir()) == before
    res = CliRunner().invoke(main, ["validate", str(step), "--target", str(target), "-n", "7", "--save"])
    assert res.exit_code == 0, res.output
    record = read_record(step)
    assert record.schema == SCHEMA and record.target_name == "target"
    assert record.report_for(step, str(target), num_speculative_tokens=7) == validate(step, target,
                                                                                      num_speculative_tokens=7)
    # the record names the target by its folder (no Hub id known); the card line names the card's Hub id instead
    assert validation_fact(step, "org/t") == ("Validation", "passed against `org/t` (no warnings)")
