"""inspect and the header-only checkpoint index."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.io.header import read_header
from dsparkhub.cli import main
from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, LayoutError, UnsafeCheckpointError
from dsparkhub.layouts.reading import open_draft
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target, make_zlab_dflash_drafter


@pytest.fixture
def target(tmp_path):
    return make_qwen3_target(tmp_path / "target")


def test_inspect_summary_names_everything(tmp_path, target):
    run = make_deepspec_drafter(tmp_path / "run", target, markov_rank=16)
    res = CliRunner().invoke(main, ["inspect", str(run)])
    assert res.exit_code == 0, res.output
    for text in ("deepspec", "Qwen3DSparkModel", "dspark", "7 (anchor_first: 7 proposals per block)",
                 "[0, 1, 2] (layer-index numbering", "rank 16, vanilla", "input [h; W1[prev]]", "128 / 128",
                 "BF16", "model.safetensors"):
        assert text in res.output, text


def test_inspect_json_has_tensors_and_numbers(tmp_path, target):
    z = make_zlab_dflash_drafter(tmp_path / "z", target, block_size=8)
    res = CliRunner().invoke(main, ["inspect", str(z), "--json"])
    data = json.loads(res.output)
    assert data["layout"] == "zlab-dflash" and data["block_layout"] == "one_plus_n"
    assert data["proposals_per_block"] == 7 and data["variant"] == "dflash"
    assert data["tensors"]["fc.weight"]["shape"] == [32, 64]
    assert data["num_parameters"] == sum(
        torch.Size(t["shape"]).numel() for t in data["tensors"].values())


def test_header_reader_matches_safetensors(tmp_path):
    tensors = {"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.arange(7, dtype=torch.int64)}
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    infos, meta = read_header(tmp_path / "x.safetensors")
    assert meta == {"k": "v"}
    assert infos["a"].dtype == "BF16" and infos["a"].shape == (3, 5) and infos["a"].nbytes == 30
    raw = (tmp_path / "x.safetensors").read_bytes()
    b = infos["b"]
    assert raw[b.start:b.start + b.nbytes] == tensors["b"].numpy().tobytes()


def test_index_naming_missing_shard_and_duplicates(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"a": torch.zeros(2)}, str(folder / "s1.safetensors"))
    save_file({"a": torch.zeros(2)}, str(folder / "s2.safetensors"))
    with pytest.raises(CheckpointFormatError, match="appears in both"):
        open_checkpoint(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s3.safetensors"}}))
    with pytest.raises(CheckpointNotFoundError, match="s3.safetensors"):
        open_checkpoint(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../s1.safetensors"}}))
    with pytest.raises(UnsafeCheckpointError):
        open_checkpoint(folder)


def test_header_length_beyond_file_is_refused_without_allocating(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointFormatError, match="refusing headers"):
        read_header(path)
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointFormatError, match="truncated"):
        read_header(path)


def test_pickle_only_weights_are_refused(tmp_path):
    folder = tmp_path / "pk"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(UnsafeCheckpointError, match="pickle"):
        open_checkpoint(folder)


def test_a_target_is_not_a_drafter(target):
    with pytest.raises(LayoutError, match="matches no known drafter layout"):
        open_draft(target)
