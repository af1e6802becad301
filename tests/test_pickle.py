"""Pickle weights: refused with the reason and the fix; ``--allow-pickle`` reads them with ``weights_only=True`` only,
through a temporary safetensors copy, and never runs code a hostile pickle asks for."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.io.pickle_weights import pickle_as_safetensors
from dsparkhub.cli import main
from dsparkhub.errors import CheckpointFormatError, UnsafeCheckpointError
from dsparkhub.layouts.reading import open_draft

torch.set_num_threads(1)



def _as_pickle(step: Path, dest: Path, name: str = "pytorch_model.bin", wrap: str | None = None) -> Path:
    shutil.copytree(step, dest)
    state = load_file(str(dest / "model.safetensors"))
    (dest / "model.safetensors").unlink()
    torch.save({wrap: state} if wrap else state, dest / name)
    return dest


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


class _RunsCode:
    """Unpickling this creates a folder: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth"])
def test_pickle_weights_are_refused_with_why_and_how(models, tmp_path, suffix):
    folder = _as_pickle(models[1], tmp_path / "drafter", name=f"pytorch_model{suffix}")
    with pytest.raises(UnsafeCheckpointError) as info:
        open_draft(folder)
    text = str(info.value)
    assert f"pytorch_model{suffix}" in text and "arbitrary code" in text
    assert "safetensors" in text and "--allow-pickle" in text and "weights_only=True" in text
    r = CliRunner().invoke(main, ["inspect", str(folder)])
    assert r.exit_code == 1 and "UnsafeCheckpointError" in r.output and "--allow-pickle" in r.output


def test_a_pickle_file_passed_directly_is_refused(models, tmp_path):
    folder = _as_pickle(models[1], tmp_path / "drafter")
    with pytest.raises(UnsafeCheckpointError, match="pickle file"):
        open_checkpoint(folder / "pytorch_model.bin")


def test_training_state_pickle_next_to_safetensors_is_never_loaded(models, tmp_path):
    folder = Path(shutil.copytree(models[1], tmp_path / "drafter"))
    torch.save({"x": _RunsCode(tmp_path / "ran")}, folder / "training_state.rank0.pt")
    r = CliRunner().invoke(main, ["inspect", str(folder), "--allow-pickle"])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("wrap", [None, "state_dict", "model"])
def test_allow_pickle_inspect_and_convert_match_the_safetensors_source(models, tmp_path, wrap):
    target, step = models
    folder = _as_pickle(step, tmp_path / "drafter", wrap=wrap)
    before = _hashes(folder)
    runner = CliRunner()
    r = runner.invoke(main, ["inspect", str(folder), "--allow-pickle"])
    assert r.exit_code == 0, r.output
    assert "weights_only=True" in r.output and "Qwen3DSparkModel" in r.output
    out_p, out_s = tmp_path / "from_pickle", tmp_path / "from_safetensors"
    r = runner.invoke(main, ["convert", str(folder), "--allow-pickle", "--target", str(target), "--out", str(out_p)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["convert", str(step), "--target", str(target), "--out", str(out_s)])
    assert r.exit_code == 0, r.output
    a, b = load_file(str(out_p / "model.safetensors")), load_file(str(out_s / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert (out_p / "config.json").read_text() == (out_s / "config.json").read_text()
    assert _hashes(folder) == before, "the pickle source folder was modified"
    source = json.loads((out_p / "dsparkhub_provenance.json").read_text())["source"]
    assert source["name"] == folder.name and "path" not in source  # the folder the user named, not the temp copy
    assert source["files"] == {name: before[name] for name in ("config.json", "pytorch_model.bin")}
    assert source["read_with"] == "torch.load(weights_only=True)"


def test_allow_pickle_refuses_a_pickle_that_runs_code(models, tmp_path):
    folder = _as_pickle(models[1], tmp_path / "drafter")
    marker = tmp_path / "code_ran"
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["evil"] = _RunsCode(marker)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="weights_only=True"):
        open_checkpoint(folder, allow_pickle=True)
    r = CliRunner().invoke(main, ["convert", str(folder), "--allow-pickle", "--target", str(models[0]),
                                  "--out", str(tmp_path / "out")])
    assert r.exit_code == 1 and "UnsafeCheckpointError" in r.output, r.output
    assert not marker.exists(), "the hostile pickle ran code"
    assert not (tmp_path / "out").exists()


def test_allow_pickle_refuses_a_legacy_pickle_that_runs_code(models, tmp_path):
    folder = _as_pickle(models[1], tmp_path / "drafter")
    marker = tmp_path / "code_ran"
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": _RunsCode(marker)}, f)
    with pytest.raises(UnsafeCheckpointError):
        pickle_as_safetensors(folder)
    assert not marker.exists()


def test_allow_pickle_refuses_a_pickle_that_is_not_a_state_dict(models, tmp_path):
    folder = _as_pickle(models[1], tmp_path / "drafter")
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")
    with pytest.raises(CheckpointFormatError, match="not a state dict"):
        open_checkpoint(folder, allow_pickle=True)
