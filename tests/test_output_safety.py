"""Nothing of the user's is deleted or written over (issue 29, items 1 and 6).

``--overwrite`` replaces only what dsparkhub wrote (a folder with one of its markers and nothing else; a file of the
kind about to be written); a file output never takes a drafter's own name; every OS problem with an output path is
one paragraph naming OUT (never the temporary folder), given before any plan is printed or any model loads.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.errors import OutputExistsError, OutputNotWritableError
from dsparkhub.testing import factories as F


def _tree(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``: what a refusal must leave as it was."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _cli(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


@pytest.fixture()
def home(tmp_path):
    """A user's folder that a typo in --out names."""
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "projects" / "thesis.tex").write_text("\\chapter{four years}")
    (home / "notes.txt").write_text("call mum")
    return home


def _convert(models, out, *extra):
    target, step = models
    return _cli("convert", step, "--target", target, "--out", out, *extra)


# ---- item 1: --overwrite replaces only what dsparkhub wrote ---------------------------------------------------


def test_convert_overwrite_refuses_a_folder_dsparkhub_did_not_write_before_planning(models, home):
    before = _tree(home)
    code, out = _convert(models, home, "--overwrite")
    assert code == 1 and "OutputExistsError" in out, out
    assert f"OUT {home} exists and is not dsparkhub's to replace" in out
    assert "a folder of 2 entries (notes.txt, projects/)" in out and "Hint: choose another --out" in out
    assert "validate:" not in out  # refused before the plan was made and printed
    assert _tree(home) == before


def test_convert_overwrite_replaces_its_own_release_folder_but_not_a_foreign_file_in_it(models, tmp_path):
    out = tmp_path / "drafter"
    assert _convert(models, out)[0] == 0
    # what the release flow adds to the folder: card, plots, results, STS sidecar
    from dsparkhub.card import CARD_MARKER

    (out / "README.md").write_text(f"# card\n\n{CARD_MARKER}\n")
    (out / "assets").mkdir()
    (out / "assets" / "acceptance.png").write_bytes(b"\x89PNG")
    (out / "results.json").write_text(json.dumps({"schema": "dsparkhub.verify.results/2"}))
    (out / "dspark_sts.json").write_text(json.dumps({"temperatures": [1.0, 1.1]}))
    (out / "assets" / "my-diagram.svg").write_text("<svg/>")  # not dsparkhub's
    before = _tree(out)
    code, text = _convert(models, out, "--overwrite")
    assert code == 1 and "1 file(s) dsparkhub did not write (assets/my-diagram.svg)" in text, text
    assert _tree(out) == before
    (out / "assets" / "my-diagram.svg").unlink()
    code, text = _convert(models, out, "--overwrite")
    assert code == 0, text
    assert not (out / "README.md").exists() and (out / "dsparkhub_provenance.json").is_file()


def test_skeleton_overwrite_replaces_a_skeleton_only(tmp_path, home):
    before = _tree(home)
    code, out = _cli("skeleton", "qwen3-8b", "--out", home, "--overwrite")
    assert code == 1 and "not dsparkhub's to replace" in out and "notes.txt" in out, out
    assert _tree(home) == before
    sk = tmp_path / "sk"
    assert _cli("skeleton", "qwen3-8b", "--out", sk)[0] == 0
    code, out = _cli("skeleton", "qwen3-8b", "--out", sk, "--overwrite")
    assert code == 0, out


def test_detach_overwrite_replaces_a_detached_drafter_only(tmp_path, home):
    shipped = F.make_v4_target(tmp_path / "v4", dspark_stages=2)
    before = _tree(home)
    code, out = _cli("detach", shipped, "--out", home, "--overwrite")
    assert code == 1 and "not dsparkhub's to replace" in out and "projects/" in out, out
    assert _tree(home) == before
    det = tmp_path / "det"
    assert _cli("detach", shipped, "--out", det)[0] == 0
    assert json.loads((det / "dsparkhub_detach.json").read_text())["command"] == "detach"
    code, out = _cli("detach", shipped, "--out", det, "--overwrite")
    assert code == 0, out


def test_attach_overwrite_refuses_a_folder_dsparkhub_did_not_write(models, tmp_path, home):
    _, step = models
    v4 = F.make_v4_target(tmp_path / "v4")
    before = _tree(home)
    code, out = _cli("convert", step, "--attach", v4, "--out", home, "--overwrite", "--force")
    assert code == 1 and "not dsparkhub's to replace" in out, out
    assert _tree(home) == before


def test_attach_as_subfolder_overwrite_replaces_its_own_output_only(models, tmp_path):
    from dsparkhub.attach_subfolder import RECORD, attach_subfolder

    target, step = models
    out = tmp_path / "t"
    attach_subfolder(step, target, out)
    assert set(json.loads((out / RECORD).read_text())["files"]) == {p.name for p in target.iterdir()}
    attach_subfolder(step, target, out, overwrite=True)
    (out / "dspark" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"dspark/notes\.txt"):
        attach_subfolder(step, target, out, overwrite=True)
    assert (out / "dspark" / "notes.txt").read_text() == "mine"


def test_calibrate_never_writes_over_the_drafters_config(models, tmp_path, monkeypatch):
    import dsparkhub.verify.reference.engine as reference
    from dsparkhub.calibrate import write_sidecar

    target, step = models
    monkeypatch.setattr(reference, "ReferenceEngine", lambda *a, **k: pytest.fail("a model was loaded"))
    before = _tree(step)
    code, out = _cli("calibrate", step, "--target", target, "--out", step / "config.json", "--overwrite", "--quiet")
    assert code == 1 and "OutputNotWritableError" in out and "named like a checkpoint's own file (config.json)" in out
    assert f"--out {step / 'dspark_sts.json'}" in out  # the fix names a path that works
    assert _tree(step) == before
    notes = tmp_path / "notes.json"  # a JSON file of the user's, not a sidecar
    notes.write_text('{"todo": 1}')
    with pytest.raises(OutputExistsError, match="not a[n]? STS|that is not one"):
        write_sidecar({"temperatures": [1.0]}, notes, overwrite=True)
    assert notes.read_text() == '{"todo": 1}'
    write_sidecar({"temperatures": [1.0]}, tmp_path / "dspark_sts.json")
    write_sidecar({"temperatures": [2.0]}, tmp_path / "dspark_sts.json", overwrite=True)  # its own kind: replaced
    assert json.loads((tmp_path / "dspark_sts.json").read_text())["temperatures"] == [2.0]
    mask = os.umask(0o022)
    os.umask(mask)
    assert (tmp_path / "dspark_sts.json").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


def test_verify_out_replaces_a_results_file_only(models, tmp_path):
    from dsparkhub.verify.runner import check_results_path

    target, step = models
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text(json.dumps({"prompt_token_ids": [5, 9, 17]}) + "\n")
    before = _tree(step)
    code, out = _cli("verify", step, "--target", target, "-n", "2", "--datasets", prompts, "--max-new-tokens", "2",
                     "--out", step / "model.safetensors", "--overwrite", "--quiet")
    assert code == 1 and "named like a checkpoint's own file (*.safetensors)" in out, out
    assert _tree(step) == before
    mine = tmp_path / "mine.json"
    mine.write_text('{"a": 1}')
    with pytest.raises(OutputExistsError, match="expected a results file of `dsparkhub verify`"):
        check_results_path(mine, overwrite=True)
    (tmp_path / "r.json").write_text(json.dumps({"schema": "dsparkhub.verify.results/1"}))
    check_results_path(tmp_path / "r.json", overwrite=True)


def test_marker_names_match_what_the_commands_write():
    """ownership.py is a leaf of io/ and spells these names itself; they must be the commands' own."""
    from dsparkhub.io import ownership
    from dsparkhub.attach import DETACH_RECORD
    from dsparkhub.attach_subfolder import RECORD, SUBFOLDER
    from dsparkhub.card import CARD_MARKER
    from dsparkhub.card.plots import ASSETS_DIR
    from dsparkhub.convert import PROVENANCE_FILE
    from dsparkhub.io.attach_record import ATTACH_RECORD
    from dsparkhub.skeleton import MARKER
    from dsparkhub.validate.record import VALIDATION_FILE
    from dsparkhub.validate.sidecar import STS_FILE
    from dsparkhub.verify.results.schema import SCHEMA

    assert set(ownership.MARKERS) == {PROVENANCE_FILE, ATTACH_RECORD, RECORD, MARKER, DETACH_RECORD}
    assert ownership.CARD_MARKER == CARD_MARKER and SCHEMA.startswith(ownership.RESULTS_SCHEMA_PREFIX)
    own = {name for _, name in ownership.OWN_FILES}
    assert {VALIDATION_FILE, STS_FILE} <= own and (ASSETS_DIR, "*.png") in ownership.OWN_FILES
    assert SUBFOLDER == "dspark"  # ownership._own reads dspark/ as a drafter folder


# ---- item 6: OS errors on an output path: one paragraph naming OUT, before any work ----------------------------


def test_a_read_only_parent_is_named_as_out_not_as_the_temporary_folder(models):
    out = Path("/sys/dsparkhub-test-out")  # /sys takes no new folder, not even from root
    code, text = _convert(models, out)
    assert code == 1 and "OutputNotWritableError" in text, text
    assert f"cannot write {out}: /sys does not take new files or folders" in text and ".tmp-" not in text
    assert "validate:" not in text


def test_out_under_a_file(models, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    code, text = _convert(models, afile / "out")
    assert code == 1 and f"OUT {afile / 'out'} lies under {afile}, which is a file, not a folder" in text, text
    assert afile.read_text() == "keep" and "Errno" not in text


@pytest.mark.parametrize("out", [".", ".."])
def test_out_is_or_holds_the_current_folder(models, tmp_path, monkeypatch, out):
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    (cwd / "thesis.tex").write_text("mine")
    monkeypatch.chdir(cwd)
    before = _tree(tmp_path / "work")
    for extra in ((), ("--overwrite",)):
        code, text = _convert(models, out, *extra)
        assert code == 1 and "OutputNotWritableError" in text and "Errno" not in text, text
        assert f"OUT {out!r} is " in text and ("the current folder" if out == "." else "a folder above") in text
    assert _tree(tmp_path / "work") == before


def test_an_existing_out_is_refused_before_the_plan_is_printed_and_named(models, tmp_path):
    out = tmp_path / "drafter"
    assert _convert(models, out)[0] == 0
    code, text = _convert(models, out)
    assert code == 1 and text.startswith(f"Error (OutputExistsError): OUT {out} already exists: a folder of "), text
    assert "--overwrite" in text and "validate:" not in text


def test_claim_output_refuses_a_file_where_a_folder_goes_and_the_reverse(tmp_path):
    from dsparkhub.io import ownership

    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputExistsError, match="is not a folder"):
        ownership.claim_output(tmp_path / "f", overwrite=True)
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputExistsError, match="is not a file"):
        ownership.claim_output(tmp_path / "d", overwrite=True, kind="results")
    with pytest.raises(OutputNotWritableError, match="named like a checkpoint's own file"):
        ownership.claim_output(tmp_path / "new" / "config.json", kind="sidecar")
