"""Paths from a stranger's checkpoint never reach outside it, and what dsparkhub writes never leaves OUT.

An index whose shard names contain ``..``, absolute paths, NUL or backslashes, and shards or folders that are
symlinks resolving outside the checkpoint, are refused with UnsafeCheckpointError — for the drafter and for the
target, from the library and from the CLI — before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dsparkhub.io.checkpoint import INDEX_NAME, open_checkpoint
from dsparkhub.cli import main
from dsparkhub.errors import CheckpointFormatError, UnsafeCheckpointError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.testing.factories import make_deepspec_drafter, make_v4_target
from dsparkhub.testing.fuzz import time_limit
from dsparkhub.validate import validate

torch.set_num_threads(1)



def _with_index(src: Path, dest: Path, shard_name: str) -> Path:
    """A copy of ``src`` whose index maps every tensor to ``shard_name``."""
    folder = Path(shutil.copytree(src, dest, symlinks=True))
    names = json.loads(Path(folder / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (folder / "model.safetensors").read_bytes()[:8], "little")])
    names.pop("__metadata__", None)
    (folder / INDEX_NAME).write_text(json.dumps({"weight_map": {n: shard_name for n in names}}))
    return folder


def _outside_copy(step: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(step / "model.safetensors", where / "model.safetensors"))


def _refused_everywhere(folder: Path, target: Path, tmp_path: Path, *, as_target: bool = False) -> str:
    """Every entry point refuses ``folder`` with UnsafeCheckpointError; returns the library's message."""
    with pytest.raises(UnsafeCheckpointError) as info:
        if as_target:
            validate(open_draft(folder.parent / "drafter_ok"), str(folder))
        else:
            open_draft(folder)
    runner = CliRunner()
    out = tmp_path / "out"
    commands = ([["validate", str(folder.parent / "drafter_ok"), "--target", str(folder)],
                 ["convert", str(folder.parent / "drafter_ok"), "--target", str(folder), "--out", str(out)]]
                if as_target else
                [["inspect", str(folder)], ["validate", str(folder), "--target", str(target)],
                 ["convert", str(folder), "--target", str(target), "--out", str(out)]])
    for args in commands:
        r = runner.invoke(main, args)
        assert r.exit_code == 1, (args, r.output)
        assert "UnsafeCheckpointError" in r.output, (args, r.output)
    assert not out.exists()
    return str(info.value)


@pytest.mark.parametrize("shard", ["../outside/model.safetensors", "sub/../../outside/model.safetensors",
                                   "ABSOLUTE", "..\\outside\\model.safetensors", "model.safetensors\x00",
                                   "", "x" * 300 + ".safetensors"])
def test_index_naming_a_path_outside_is_refused(models, tmp_path, shard):
    target, step = models
    outside = _outside_copy(step, tmp_path / "outside")
    shard = str(outside) if shard == "ABSOLUTE" else shard
    folder = _with_index(step, tmp_path / "drafter", shard)
    text = _refused_everywhere(folder, target, tmp_path)
    assert "not a plain file name" in text and INDEX_NAME in text


def test_shard_symlink_leading_outside_is_refused(models, tmp_path):
    target, step = models
    outside = _outside_copy(step, tmp_path / "outside")
    folder = Path(shutil.copytree(step, tmp_path / "drafter"))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside)
    text = _refused_everywhere(folder, target, tmp_path)
    assert "resolves outside the checkpoint" in text and str(outside) in text


def test_symlinked_subfolder_leading_outside_is_refused(models, tmp_path):
    target, step = models
    outside = _outside_copy(step, tmp_path / "outside")
    folder = _with_index(step, tmp_path / "drafter", "sub/model.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "sub").symlink_to(outside.parent, target_is_directory=True)
    _refused_everywhere(folder, target, tmp_path)


def test_symlink_loop_is_refused_not_crashed(models, tmp_path):
    target, step = models
    folder = _with_index(step, tmp_path / "drafter", "loop.safetensors")
    (folder / "loop.safetensors").symlink_to("loop.safetensors")
    with pytest.raises(UnsafeCheckpointError, match="cannot be resolved"):
        open_checkpoint(folder)


def test_target_index_leading_outside_is_refused(models, tmp_path):
    target, step = models
    shutil.copytree(step, tmp_path / "drafter_ok")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(target / "model.safetensors", outside / "model.safetensors")
    hostile = _with_index(target, tmp_path / "hostile_target", "../outside/model.safetensors")
    (hostile / "model.safetensors").unlink()
    _refused_everywhere(hostile, target, tmp_path, as_target=True)


def test_symlinks_inside_the_checkpoint_are_fine(models, tmp_path):
    target, step = models
    folder = Path(shutil.copytree(step, tmp_path / "drafter"))
    (folder / "real").mkdir()
    (folder / "model.safetensors").rename(folder / "real" / "weights.safetensors")
    (folder / "model.safetensors").symlink_to(Path("real") / "weights.safetensors")
    assert open_draft(folder).spec.tensors, "a symlink inside the folder must be accepted"


def _listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_convert_writes_nothing_outside_out(models, tmp_path):
    target, step = models
    parent = tmp_path / "outputs"
    parent.mkdir()
    (parent / "neighbour").write_text("keep")
    out = parent / "nested" / ".." / "out"
    r = CliRunner().invoke(main, ["convert", str(step), "--target", str(target), "--out", str(out),
                                  "--max-shard-size", "8000"])
    assert r.exit_code == 0, r.output
    assert _listing(parent) == {"neighbour", "nested", "out"}
    assert _listing(parent / "nested") == set()
    real = parent / "out"
    for p in real.rglob("*"):
        assert p.is_file() and not p.is_symlink(), p
        assert real.resolve() in p.resolve().parents
    assert (parent / "neighbour").read_text() == "keep"


def test_overwriting_an_out_that_is_a_symlink_never_touches_its_target(models, tmp_path):
    """A link to a folder dsparkhub did not write is refused (issue 29 item 1); a link to its own output is replaced
    by the new folder, and the folder it led to is kept."""
    target, step = models
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.bin").write_bytes(b"weeks of training")
    parent = tmp_path / "outputs"
    parent.mkdir()
    (parent / "out").symlink_to(elsewhere, target_is_directory=True)
    args = ["convert", str(step), "--target", str(target), "--out", str(parent / "out"), "--overwrite"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "not dsparkhub's to replace" in r.output and "precious.bin" in r.output, r.output
    assert (parent / "out").is_symlink() and _listing(elsewhere) == {"precious.bin"}
    (parent / "out").unlink()
    mine = tmp_path / "mine"
    assert CliRunner().invoke(main, [*args[:4], "--out", str(mine)]).exit_code == 0
    before = _listing(mine)
    (parent / "out").symlink_to(mine, target_is_directory=True)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert (elsewhere / "precious.bin").read_bytes() == b"weeks of training"
    assert _listing(mine) == before
    assert not (parent / "out").is_symlink() and (parent / "out" / "config.json").exists()
    assert _listing(parent) == {"out"}, "a moved-aside symlink was left behind"


def test_attach_writes_nothing_outside_out_and_leaves_the_target_alone(models, tmp_path):
    target, _ = models
    run = make_deepspec_drafter(tmp_path / "run", target, drop=("embed_tokens.weight", "lm_head.weight"))
    v4 = make_v4_target(tmp_path / "v4")
    before = {p.name: p.read_bytes() for p in v4.iterdir()}
    parent = tmp_path / "outputs"
    parent.mkdir()
    r = CliRunner().invoke(main, ["convert", str(run), "--attach", str(v4), "--out", str(parent / "out"),
                                  "--force"])  # a Qwen3 drafter into a V4 target: DSH311 without --force
    assert r.exit_code == 0, r.output
    assert _listing(parent) == {"out"}
    assert {p.name: p.read_bytes() for p in v4.iterdir()} == before
    for p in (parent / "out").rglob("*"):
        assert (parent / "out").resolve() in p.absolute().parents
        assert not p.is_symlink()
    assert os.stat(parent / "out" / "config.json").st_ino != os.stat(v4 / "config.json").st_ino, \
        "the rewritten config.json must be a new file, not a hard link to the target's"


def test_special_files_are_refused_without_blocking(models, tmp_path):
    """A FIFO named by the index would block ``open`` forever; ``config.json`` -> /dev/zero would never end."""
    target, step = models
    folder = _with_index(step, tmp_path / "fifo", "weights.safetensors")
    os.mkfifo(folder / "weights.safetensors")
    with pytest.raises(CheckpointFormatError, match="not a regular file"), time_limit(10):
        open_checkpoint(folder)
    zero = Path(shutil.copytree(step, tmp_path / "zero"))
    (zero / "config.json").unlink()
    (zero / "config.json").symlink_to("/dev/zero")
    r = CliRunner().invoke(main, ["inspect", str(zero)])
    assert r.exit_code == 1 and "not a regular file" in r.output, r.output


def test_a_hugging_face_cache_snapshot_is_readable(models, tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/<file> are links to ../../blobs/<hash> (outside the folder)."""
    import hashlib

    from dsparkhub.io.checkpoint import open_checkpoint

    _, step = models
    repo = tmp_path / "hub" / "models--me--drafter"
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in step.iterdir():
        if f.is_file():
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            blob.write_bytes(f.read_bytes())
            (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    ck = open_checkpoint(snap)
    assert ck.tensors and ck.config
