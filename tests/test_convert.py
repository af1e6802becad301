"""convert: bit-exact tensors, dropped copies, layer-id round trips, refusals, atomic output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dsparkhub.io import output
from dsparkhub.cli import main
from dsparkhub.convert import PROVENANCE_FILE, convert
from dsparkhub.convert.plan import plan_conversion
from dsparkhub.errors import (CheckpointNotFoundError, ConversionRefusedError, OutputExistsError,
                              ValidationFailedError)
from dsparkhub.io.hashing import sha256_file
from dsparkhub.layouts.reading import open_draft
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target, make_zlab_dflash_drafter


@pytest.fixture
def target(tmp_path):
    return make_qwen3_target(tmp_path / "target")


@pytest.fixture
def run(tmp_path, target):
    return make_deepspec_drafter(tmp_path / "run", target)


def _hashes(folder):
    return {p.name: sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_deepspec_to_vllm_is_bit_exact_and_drops_identical_copies(tmp_path, run, target):
    before = _hashes(run)
    result = convert(run, tmp_path / "out", target)
    src = load_file(str(run / "step_latest" / "model.safetensors"))
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(src) - set(out) == {"embed_tokens.weight", "lm_head.weight"}
    for name, tensor in out.items():
        assert tensor.dtype == src[name].dtype
        assert torch.equal(tensor.view(torch.uint8), src[name].view(torch.uint8)), name
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["sample_from_anchor"] is True
    assert cfg["target_layer_ids"] == [0, 1, 2] and cfg["markov_rank"] == 8 and cfg["block_size"] == 7
    assert cfg["mask_token_id"] == 127 and cfg["enable_confidence_head"] is True
    assert "num_anchors" not in cfg and "_attn_implementation" not in cfg
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", PROVENANCE_FILE,
                                                                    "model.safetensors", "validation.json"]
    assert _hashes(run) == before, "the source checkpoint must not change"
    prov = json.loads((tmp_path / "out" / PROVENANCE_FILE).read_text())
    assert prov["source"]["files"]["model.safetensors"] == before["model.safetensors"]
    assert prov["written_bytes"]["model.safetensors"] == (tmp_path / "out" / "model.safetensors").stat().st_size
    assert {d["name"] for d in prov["tensors"]["dropped"]} == {"embed_tokens.weight", "lm_head.weight"}
    assert result.files == ["model.safetensors"]


def test_differing_copy_is_kept_and_reported(tmp_path, target):
    g = torch.Generator().manual_seed(5)
    run = make_deepspec_drafter(tmp_path / "run", target, tensor_overrides={
        "lm_head.weight": torch.randn(128, 32, generator=g).to(torch.bfloat16)})
    # DeepSpec trains the copy frozen: one that differs is DSH312, refused unless asked (issue 12 item 7)
    with pytest.raises(ValidationFailedError, match="DSH312"):
        plan_conversion(run, target)
    plan = plan_conversion(run, target, allow_different_embeddings=True)
    kept = {d.name: d for d in plan.copies}
    assert "lm_head.weight" in kept and "differs" in kept["lm_head.weight"].reason
    assert "embed_tokens.weight" not in kept


@pytest.mark.parametrize("ids", [(-1, 0, 2), (0, 1, 2), (1, 2)])
def test_layer_ids_round_trip_through_vllm_and_back(tmp_path, target, ids):
    run = make_deepspec_drafter(tmp_path / "run", target, target_layer_ids=ids)
    convert(run, tmp_path / "vllm", target)
    convert(tmp_path / "vllm", tmp_path / "back", target, to="deepspec", keep_embeddings=True)
    assert open_draft(tmp_path / "vllm").spec.target_layer_ids == list(ids)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["target_layer_ids"] == list(ids)
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    first = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert set(first) <= set(back)
    assert all(torch.equal(first[k], back[k]) for k in first)


def test_zlab_dflash_round_trip_keeps_one_plus_n(tmp_path, target):
    z = make_zlab_dflash_drafter(tmp_path / "z", target)
    convert(z, tmp_path / "z2", target, to="zlab-dflash")
    spec = open_draft(tmp_path / "z2").spec
    assert spec.block_layout == "one_plus_n" and spec.target_layer_ids == [0, 2]
    assert json.loads((tmp_path / "z2" / "config.json").read_text())["dflash_config"] == {
        "target_layer_ids": [0, 2], "mask_token_id": 127}


def test_anchor_first_cannot_become_one_plus_n(tmp_path, run, target):
    with pytest.raises(ConversionRefusedError, match="shift every draft slot"):
        plan_conversion(run, target, to="zlab-dflash")


def test_dflash_asked_for_as_vllm_is_written_as_vllm_loads_it(tmp_path, target):
    """vLLM 0.32 loads DFlash as DFlashDraftModel (registry.py), not as Qwen3DSparkModel (issue 12 item 12)."""
    z = make_zlab_dflash_drafter(tmp_path / "z", target)
    plan = plan_conversion(z, target, to="vllm")
    assert plan.recipe.name == "zlab-dflash" and plan.config["architectures"] == ["DFlashDraftModel"]


def test_refuses_to_overwrite_and_overwrites_when_asked(tmp_path, run, target):
    out = tmp_path / "out"
    convert(run, out, target)
    with pytest.raises(OutputExistsError):
        convert(run, out, target)
    (out / "marker").write_text("old")  # a file dsparkhub did not write: the folder is no longer its to replace
    with pytest.raises(OutputExistsError, match=r"1 file\(s\) dsparkhub did not write \(marker\)"):
        convert(run, out, target, overwrite=True)
    (out / "marker").unlink()
    (out / "model.safetensors").write_bytes(b"old")  # its own files are replaced
    convert(run, out, target, overwrite=True)
    assert (out / "model.safetensors").stat().st_size > 3 and not (out / "marker").exists()


def test_interrupted_conversion_leaves_no_output(tmp_path, run, target, monkeypatch):
    def boom(*args, **kwargs):
        (args[0] / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("dsparkhub.convert.write_shards", boom)
    with pytest.raises(KeyboardInterrupt):
        convert(run, tmp_path / "out", target)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_sharding_writes_an_index(tmp_path, run, target):
    result = convert(run, tmp_path / "out", target, max_shard_bytes=8 << 10)
    assert len(result.files) > 1
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(result.files)
    assert open_draft(tmp_path / "out").spec.tensors.keys() == {
        d.name for d in result.plan.copies}


def test_drafter_for_another_target_is_refused_before_writing(tmp_path, run):
    other = make_qwen3_target(tmp_path / "other", hidden=48)
    with pytest.raises(ValidationFailedError, match="DSH301"):
        convert(run, tmp_path / "out", other)
    assert not (tmp_path / "out").exists()


def test_missing_step_latest_target(tmp_path, run, target):
    latest = run / "step_latest"
    latest.unlink()
    latest.symlink_to("step_999")
    with pytest.raises(CheckpointNotFoundError, match="step_999"):
        convert(run, tmp_path / "out", target)
    latest.unlink()
    with pytest.raises(CheckpointNotFoundError, match="no `step_latest`"):
        convert(run, tmp_path / "out", target)


def test_cli_convert_bad_inputs_are_one_paragraph(tmp_path, run, target):
    runner = CliRunner()
    shard = run / "step_latest" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:200])
    res = runner.invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "model.safetensors" in res.output and "truncated" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()
    res = runner.invoke(main, ["--debug", "convert", str(run), "--target", str(target), "--out", str(tmp_path / "o")])
    assert "Traceback" in res.output


def test_cli_dry_run_writes_nothing(tmp_path, run, target):
    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "o"),
                                    "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "drop  embed_tokens.weight" in res.output and not (tmp_path / "o").exists()


def test_atomic_output_concurrent_winner(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(OutputExistsError):
        with output.atomic_output(out) as tmp:
            (tmp / "a").write_text("1")
            os.makedirs(out / "x")  # another run finished first
    assert (out / "x").exists() and not (out / "a").exists()


def test_overwrite_replaces_folders_only_and_training_state_is_no_shard(tmp_path, run, target):
    afile = tmp_path / "afile.txt"
    afile.write_text("keep me")
    with pytest.raises(OutputExistsError, match="not a folder"):
        convert(run, afile, target, overwrite=True)
    assert afile.read_text() == "keep me"
    step = run / "step_latest"
    (step / "optimizer.safetensors").write_bytes((step / "model.safetensors").read_bytes())
    from dsparkhub.io.checkpoint import open_checkpoint

    assert open_checkpoint(step).files == ["model.safetensors"]


def test_provenance_names_folders_and_the_targets_hub_id_never_a_local_path(tmp_path, run, target):
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "_name_or_path": "org/qwen3-tiny"}))
    convert(run, tmp_path / "out", target)
    text = (tmp_path / "out" / PROVENANCE_FILE).read_text()
    prov = json.loads(text)
    assert str(tmp_path) not in text
    assert prov["source"]["name"] == Path(open_draft(run).checkpoint.path).name  # the step folder, with file hashes
    assert prov["target"]["repo_id"] == "org/qwen3-tiny" and prov["target"]["source"] == "org/qwen3-tiny"
    # with a Hub id known the folder's own name is not recorded either (this file is published)
    assert prov["target"]["repo_id_from"] == "config.json _name_or_path" and prov["target"]["name"] is None
    assert prov["target"]["config_sha256"] == sha256_file(target / "config.json")
    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "o2"),
                                    "--base-model", "org/other"])
    assert res.exit_code == 0, res.output
    prov = json.loads((tmp_path / "o2" / PROVENANCE_FILE).read_text())
    assert prov["target"]["repo_id"] == "org/other" and prov["target"]["repo_id_from"] == "--base-model"


def test_convert_reports_progress_of_its_phases(tmp_path, run, target):
    seen = []
    result = convert(run, tmp_path / "out", target, progress=lambda *a: seen.append(a))
    writes = [a for a in seen if a[0] == "write"]
    assert writes and writes[-1] == ("write", result.plan.out_bytes, result.plan.out_bytes)
    assert [d for _, d, _ in writes] == sorted(d for _, d, _ in writes)  # never backwards
    assert seen[-2:] == [("hash", 0, 1), ("hash", 1, 1)]


def test_provenance_records_the_step_and_literal_train_config_values_never_running_it(tmp_path, run, target):
    step = Path(open_draft(run).checkpoint.path)
    (step / "train_config.py").write_text(
        'import os\nfrom deepspec.trainer import Qwen3DSparkTrainer\nexp_name = "dspark_tiny"\n'
        'os.system("touch ran")\n'
        'train = dict(trainer_cls=Qwen3DSparkTrainer, lr=6.0e-4, max_train_steps=2, precision="bf16")\n'
        'data = dict(target_cache_path=None, chat_template="qwen", max_length=64)\n')
    convert(run, tmp_path / "out", target, base_model="org/qwen3-tiny")
    prov = json.loads((tmp_path / "out" / PROVENANCE_FILE).read_text())
    assert prov["training"] == {"step": int(step.name[5:]) if step.name[5:].isdigit() else None,
                                "config": {"exp_name": "dspark_tiny", "train.lr": 6.0e-4, "train.max_train_steps": 2,
                                           "train.precision": "bf16", "data.chat_template": "qwen",
                                           "data.max_length": 64}}
    assert not Path("ran").exists() and not (step / "ran").exists()  # parsed, not executed
