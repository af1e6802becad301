"""Nothing local is ever published (issue 29 items 2, 4, 9): every file the release flow writes (convert into each
layout the example drafters can be written in, ``validate --save``, ``verify --out`` with the reference engine,
``card``, and what ``push`` would upload) is scanned for the temporary folders, the home folder and the target's
local path; a config key or card line that names the target uses its Hub id, or is refused before writing with the
flag to give.

The example (``example`` session fixture) lies under the home folder's cache and its target has no Hub id of its own
(no ``_name_or_path``, no manifest), so every name of it must come from ``--base-model``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.errors import CardError, ConversionRefusedError

BASE = "dsparkhub-example/qwen3-tiny"


def _needles(tmp_path: Path, tmp_path_factory, target: Path) -> dict[str, str]:
    """What no published file may contain: each local place by what it is."""
    out = {"tmp_path": str(tmp_path), "pytest temp root": str(tmp_path_factory.getbasetemp()),
           "system temp folder": str(Path(tempfile.gettempdir()) / ""), "home folder": str(Path.home()),
           "target path": str(target), "target path (resolved)": str(target.resolve()),
           "temporary output name": ".tmp-"}
    return {k: v for k, v in out.items() if v not in ("", "/")}


def _scan(files: list[Path], needles: dict[str, str]) -> list[str]:
    """``file:line: what`` for every needle found in every file (binary files are read as latin-1)."""
    hits = []
    for f in files:
        text = f.read_bytes().decode("latin-1")
        for no, line in enumerate(text.splitlines(), 1):
            hits += [f"{f}:{no}: {what} ({needle!r})" for what, needle in needles.items() if needle in line]
    return hits


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def release(example, tmp_path_factory):
    """The example released: the DSpark run converted to vllm / speculators / deepspec and the DFlash drafter to
    speculators (all with --base-model), the vllm output validated with --save, verified with the reference engine
    (one dataset, 2 prompts, 8 new tokens) and given a card. Returns ``(root, {name: out folder}, results path)``."""
    root = tmp_path_factory.mktemp("release")
    outs = {}
    for layout in ("vllm", "speculators", "deepspec"):
        outs[f"dspark-{layout}"] = convert(example.deepspec_run, root / f"dspark-{layout}", example.target,
                                           to=layout, base_model=BASE).out
    outs["dflash-speculators"] = convert(example.dflash, root / "dflash-speculators", example.target,
                                         to="speculators", base_model=BASE).out
    draft = outs["dspark-vllm"]
    runner = CliRunner()
    res = runner.invoke(main, ["validate", str(draft), "--target", str(example.target), "--save"])
    assert res.exit_code == 0, res.output
    results = root / "results.json"
    res = runner.invoke(main, ["verify", str(draft), "--target", str(example.target), "--backend", "reference",
                               "--datasets", f"heldout={example.prompts}", "--max-prompts", "2",
                               "--max-new-tokens", "8", "-n", "3", "--repeats", "1", "--out", str(results),
                               "--quiet"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["card", str(draft), "--results", str(results), "--repo-id", "org/tiny-dspark"])
    assert res.exit_code == 0, res.output
    return root, outs, results


def test_no_written_file_names_a_local_path(release, example, tmp_path, tmp_path_factory):
    from dsparkhub.hub.files import local_files

    root, outs, results = release
    files = [results] + [f for out in outs.values() for f in _files(out)]
    files += list(local_files(outs["dspark-vllm"]).values())  # what push uploads (README, assets, ...)
    assert (outs["dspark-vllm"] / "README.md").is_file() and (outs["dspark-vllm"] / "validation.json").is_file()
    hits = _scan(files, _needles(root, tmp_path_factory, example.target))
    assert not hits, "local paths in written files:\n" + "\n".join(hits[:20])


def test_speculators_verifier_and_card_name_the_hub_id(release, example):
    _, outs, _ = release
    for key in ("dspark-speculators", "dflash-speculators"):
        cfg = json.loads((outs[key] / "config.json").read_text())
        assert cfg["speculators_config"]["verifier"] == {"name_or_path": BASE, "architectures": ["Qwen3ForCausalLM"]}
    card = (outs["dspark-vllm"] / "README.md").read_text()
    for line in (f"- **Target:** `{BASE}`", f"- **Validation:** passed against `{BASE}`", f"- Target `{BASE}`",
                 f"- **Converted against target:** `{BASE}`", f"vllm serve {BASE}", f"base_model: {BASE}"):
        assert line in card, line
    assert "`target`" not in card and '"name": "target"' not in card


def test_validation_record_is_readable_by_all_and_keyed_on_the_target_not_its_spelling(release, example,
                                                                                       monkeypatch):
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.target import open_target
    from dsparkhub.validate.record import matching_record

    _, outs, _ = release
    for out in outs.values():
        mode = stat.S_IMODE((out / "validation.json").stat().st_mode)
        assert mode == 0o666 & ~_umask(), oct(mode)
    d = open_draft(outs["dspark-vllm"])
    monkeypatch.chdir(example.target.parent)
    for spelling in (str(example.target), f"./{example.target.name}", f"{example.target.name}/",
                     f"../{example.target.parent.name}/{example.target.name}"):
        record, why = matching_record(d, open_target(spelling))
        assert record is not None, (spelling, why)
    # `validate --save` knows no Hub id of this target: the folder's own name, never a path (the card names BASE)
    assert record.target_name == example.target.name
    assert json.loads((outs["dspark-speculators"] / "validation.json").read_text())["target_name"] == BASE


def test_speculators_without_a_hub_id_is_refused_before_writing(example, tmp_path):
    out = tmp_path / "spec"
    with pytest.raises(ConversionRefusedError, match="no.* Hub|none is known") as err:
        convert(example.deepspec_run, out, example.target, to="speculators")
    assert "--base-model" in err.value.hint and not out.exists()
    res = CliRunner().invoke(main, ["convert", str(example.deepspec_run), "--target", str(example.target),
                                    "--out", str(out), "--to", "speculators", "--base-model", "./target"])
    assert res.exit_code != 0 and "not a Hub repo id" in res.output and not out.exists()


def test_card_without_a_hub_id_is_refused_naming_the_flag(release, tmp_path):
    import shutil

    _, outs, results = release
    draft = tmp_path / "d"
    shutil.copytree(outs["dspark-vllm"], draft)
    (draft / "README.md").unlink()
    prov = json.loads((draft / "dsparkhub_provenance.json").read_text())
    prov["target"].update(source="target", repo_id=None, repo_id_from=None, name="target")
    (draft / "dsparkhub_provenance.json").write_text(json.dumps(prov))
    # the results name the example's target by its folder name (it has no Hub id): nothing says which Hub id it is
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(results), "--repo-id", "org/x"])
    assert res.exit_code != 0 and "--base-model" in res.output and not (draft / "README.md").exists()
    with pytest.raises(CardError):
        from dsparkhub.card.render import write_card

        write_card(draft, [results], base_model=str(tmp_path))
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(results), "--base-model", BASE])
    assert res.exit_code == 0, res.output
    card = (draft / "README.md").read_text()
    assert f"vllm serve {BASE}" in card and f"Validation:** passed against `{BASE}`" in card
    assert '"repo_id_from": "dsparkhub card (--base-model)"' in card and '"name": "target"' not in card
    assert "--repo-id" in res.output  # the drafter's own id is a placeholder: said loudly, push refuses it


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
