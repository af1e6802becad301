"""Attach a drafter into a DeepSeek-V4-style target (links, new mtp.* shards, rewritten index / config) and detach
it again bit for bit; the target is never rewritten and its tensor bytes are not read."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dsparkhub.attach import ATTACH_RECORD, attach, detach
from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.errors import ConversionRefusedError, OutputExistsError, UnsafeCheckpointError, ValidationFailedError
from dsparkhub.io.hashing import sha256_file
from dsparkhub.layouts.reading import open_draft
from dsparkhub.testing import factories as F
from dsparkhub.validate import validate

torch.set_num_threads(1)


def _v4_sharing_embeddings(folder, qwen_target, **kw):
    """A tiny V4-style target whose embed.weight / head.weight are the Qwen3 target's (so copies can be dropped)."""
    v4 = F.make_v4_target(folder, layers=4, **kw)
    qt = load_file(str(qwen_target / "model.safetensors"))
    index = json.loads((v4 / "model.safetensors.index.json").read_text())["weight_map"]
    for name, src in (("embed.weight", "model.embed_tokens.weight"), ("head.weight", "lm_head.weight")):
        shard = v4 / index[name]
        tensors = load_file(str(shard))
        tensors[name] = qt[src].clone()
        save_file(tensors, str(shard), metadata={"format": "pt"})
    return v4


@pytest.fixture()
def setup(tmp_path):
    qt = F.make_qwen3_target(tmp_path / "qwen-target", layers=4)
    run = F.make_deepspec_drafter(tmp_path / "run", qt)
    v4 = _v4_sharing_embeddings(tmp_path / "v4", qt)
    return qt, run, v4


def _hashes(folder):
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}


def test_attach_links_target_shards_and_detach_restores_the_drafter_bit_for_bit(tmp_path, setup):
    qt, run, v4 = setup
    before = _hashes(v4)
    mtimes = {p.name: p.stat().st_mtime_ns for p in v4.iterdir()}
    r = attach(run, v4, tmp_path / "out", force=True)
    out = tmp_path / "out"
    shards = sorted(p.name for p in v4.glob("model-*.safetensors"))
    assert shards and all(r.linked[s] == "hardlink" for s in shards)
    for s in shards + ["tokenizer.json"]:
        assert os.stat(out / s).st_ino == os.stat(v4 / s).st_ino
    assert _hashes(v4) == before and {p.name: p.stat().st_mtime_ns for p in v4.iterdir()} == mtimes
    assert r.added_files == ["model-dspark-00001-of-00001.safetensors"]
    assert {x["name"] for x in r.dropped} == {"embed_tokens.weight", "lm_head.weight"}
    # the target's embedding and head were read once each, to prove the copies identical; nothing else
    emb = open_checkpoint(v4).tensors["embed.weight"]
    assert r.target_data_bytes_read == 2 * emb.nbytes
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dspark_block_size"] == 7 and cfg["dspark_target_layer_ids"] == [1, 2, 3]  # hidden-state index
    assert cfg["dspark_markov_rank"] == 8 and cfg["n_mtp_layers"] == 2 and cfg["dspark_noise_token_id"] == 127
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["mtp.1.main_proj.weight"] == "model-dspark-00001-of-00001.safetensors"
    assert index["weight_map"]["mtp.0.self_attn.q_proj.weight"] == "model-dspark-00001-of-00001.safetensors"
    assert index["weight_map"]["embed.weight"].startswith("model-0000")
    record = json.loads((out / ATTACH_RECORD).read_text())
    assert record["added"]["tensors"]["mtp.1.main_proj.weight"] == "fc.weight"
    assert record["drafter"]["layout"] == "deepspec"

    d = open_draft(out)
    assert d.recipe.name == "deepseek-v4" and d.spec.num_layers == 2 and d.spec.target_layer_ids == [0, 1, 2]
    # why attach refuses a Qwen3 drafter without --force (DSH311): vLLM 0.32's V4 DSpark class would find no
    # hc_head_* and cannot load the DeepSpec head's bias (deepseek_v4/nvidia/dspark.py:139-156)
    report = validate(d, str(out))
    assert {(f.code, f.location) for f in report.errors} == {
        ("DSH201", "tensor hc_head_fn"), ("DSH201", "tensor hc_head_base"), ("DSH201", "tensor hc_head_scale"),
        ("DSH202", "tensor confidence_head.proj.bias")}

    det = detach(out, tmp_path / "det")
    assert det.restored and det.layout == "deepspec"
    step = (run / "step_latest").resolve()
    for name in ("config.json", "model.safetensors"):
        assert sha256_file(tmp_path / "det" / name) == sha256_file(step / name)


def test_attach_of_a_converted_drafter_reads_no_target_bytes(tmp_path, setup):
    qt, run, v4 = setup
    convert(run, tmp_path / "vllm", qt)  # drops embed / lm_head copies identical to the target's
    r = attach(tmp_path / "vllm", v4, tmp_path / "out", force=True)
    assert r.target_data_bytes_read == 0 and r.dropped == []
    assert detach(tmp_path / "out", tmp_path / "det").restored
    for name in ("config.json", "model.safetensors"):
        assert sha256_file(tmp_path / "det" / name) == sha256_file(tmp_path / "vllm" / name)


@pytest.mark.parametrize("mode", ["symlink", "copy"])
def test_symlink_and_copy_modes(tmp_path, setup, mode):
    qt, run, v4 = setup
    r = attach(run, v4, tmp_path / "out", link=mode, force=True)
    shard = next(iter(sorted(v4.glob("model-0*.safetensors")))).name
    assert r.linked[shard] == mode
    assert (tmp_path / "out" / shard).is_symlink() == (mode == "symlink")
    assert sha256_file(tmp_path / "out" / shard) == sha256_file(v4 / shard)
    # the output reads like any checkpoint: links out of the folder are accepted where the attach record lists them
    ck = open_checkpoint(tmp_path / "out")
    name = next(n for n, f in ck.index["weight_map"].items() if f == shard)
    assert ck.tensors[name].file == shard
    assert detach(tmp_path / "out", tmp_path / "det").restored


def test_symlinks_out_of_an_attached_folder_must_match_its_record(tmp_path, setup):
    qt, run, v4 = setup
    attach(run, v4, tmp_path / "out", link="symlink", force=True)
    out = tmp_path / "out"
    rec = json.loads((out / ATTACH_RECORD).read_text())
    shard = next(k for k, v in rec["target"]["files"].items() if v == "symlink" and k.endswith(".safetensors"))
    other = tmp_path / "elsewhere"
    shutil.copytree(v4, other)
    assert rec["target"]["links"][shard][1] == (v4 / shard).stat().st_ino
    (out / shard).unlink()
    (out / shard).symlink_to(other / shard)  # same name, another folder than the recorded target
    with pytest.raises(UnsafeCheckpointError, match="resolves outside the checkpoint folder"):
        open_checkpoint(out)
    # a record written elsewhere cannot approve a link to a local file: it would have to name its device and inode
    rec["target"]["path"] = str(other)
    rec["target"]["links"] = {k: [1, 2, (other / k).stat().st_size] for k in rec["target"]["links"]}
    (out / ATTACH_RECORD).write_text(json.dumps(rec))
    with pytest.raises(UnsafeCheckpointError, match="resolves outside the checkpoint folder"):
        open_checkpoint(out)


def test_refusals(tmp_path, setup):
    qt, run, v4 = setup
    with pytest.raises(ConversionRefusedError, match="model_type is 'qwen3'"):
        attach(run, qt, tmp_path / "o1", force=True)
    shipped = F.make_v4_target(tmp_path / "v4-with-drafter", dspark_stages=3)
    with pytest.raises(ConversionRefusedError, match="already holds"):
        attach(run, shipped, tmp_path / "o2", force=True)
    other = F.make_v4_target(tmp_path / "v4-other-embed", layers=4)  # random embed: the drafter's copy differs
    with pytest.raises(ConversionRefusedError, match="differs from the target's embed.weight"):
        attach(run, other, tmp_path / "o3", force=True)
    (tmp_path / "o4").mkdir()
    with pytest.raises(OutputExistsError):
        attach(run, v4, tmp_path / "o4", force=True)
    assert not any(p.name.startswith(".o") for p in tmp_path.iterdir())  # no temporary folder left behind


def test_detach_without_record_extracts_mtp_stages(tmp_path):
    shipped = F.make_v4_target(tmp_path / "v4", dspark_stages=3)
    r = detach(shipped, tmp_path / "drafter")
    assert not r.restored and r.layout == "deepseek-v4"
    src, out = open_checkpoint(shipped), open_checkpoint(tmp_path / "drafter")
    mtp = sorted(n for n in src.tensors if n.startswith("mtp."))
    assert sorted(out.tensors) == mtp
    assert all(out.tensor_sha256(n) == src.tensor_sha256(n) for n in mtp)
    assert r.drafter_bytes_read == sum(src.tensors[n].nbytes for n in mtp)
    assert open_draft(tmp_path / "drafter").spec.num_layers == 3


def test_cli_attach_and_detach(tmp_path, setup):
    qt, run, v4 = setup
    res = CliRunner().invoke(main, ["convert", str(run), "--attach", str(v4), "--out", str(tmp_path / "out"), "--force"])
    assert res.exit_code == 0, res.output
    assert "hardlink" in res.output and "target tensor bytes read" in res.output
    res = CliRunner().invoke(main, ["detach", str(tmp_path / "out"), "--out", str(tmp_path / "det")])
    assert res.exit_code == 0, res.output and "restored exactly" in res.output
    res = CliRunner().invoke(main, ["convert", str(run), "--attach", str(qt), "--out", str(tmp_path / "x")])
    assert res.exit_code == 1 and "ConversionRefusedError" in res.output
    res = CliRunner().invoke(main, ["convert", str(run), "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "--target is required" in res.output


@pytest.mark.slow
def test_attach_into_real_size_v4_flash_skeleton_costs_the_drafters_bytes(tmp_path):
    """A 155 GB (sparse) DeepSeek-V4-Flash skeleton: attach writes only the drafter and reads no target data."""
    from dsparkhub.skeleton import sparse_drafter, write_skeleton

    sk = write_skeleton("deepseek-v4-flash", tmp_path / "v4")
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 64,
           "vocab_size": 129280, "block_size": 5, "mask_token_id": 128799, "target_layer_ids": [39, 40, 41],
           "num_target_layers": 43, "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": False,
           "sample_from_anchor": True}
    drafter = sparse_drafter(tmp_path / "drafter", cfg)
    r = attach(drafter, sk.out, tmp_path / "out", force=True)  # a Qwen3 drafter: DSH311 without force
    assert r.target_data_bytes_read == 0
    assert r.drafter_bytes_written < 200 << 20 < sk.logical_bytes
    assert all(how == "hardlink" for how in r.linked.values())
    assert open_draft(tmp_path / "out").spec.num_layers == 1


@pytest.mark.slow
def test_attach_the_embedded_example_drafter_and_detach_it(example, tmp_path):
    """The really trained example DSpark drafter, attached into a tiny V4-style target that shares the example
    target's embedding / head: target shards are the same inodes, detach gives the drafter back bit for bit."""
    tck = open_checkpoint(example.target)
    tcfg = json.loads((example.target / "config.json").read_text())
    embed = tck.read_tensor("model.embed_tokens.weight")
    head = tck.read_tensor("lm_head.weight") if "lm_head.weight" in tck.tensors else embed
    v4 = F.make_v4_target(tmp_path / "v4", hidden=tcfg["hidden_size"], vocab=tcfg["vocab_size"],
                          layers=tcfg["num_hidden_layers"])
    index = json.loads((v4 / "model.safetensors.index.json").read_text())["weight_map"]
    for name, value in (("embed.weight", embed), ("head.weight", head)):
        shard = v4 / index[name]
        tensors = load_file(str(shard))
        tensors[name] = value.clone()
        save_file(tensors, str(shard), metadata={"format": "pt"})
    r = attach(example.deepspec_run, v4, tmp_path / "out", force=True)
    for shard in sorted(p.name for p in v4.glob("model-*.safetensors")):
        assert os.stat(tmp_path / "out" / shard).st_ino == os.stat(v4 / shard).st_ino
    assert r.tensors
    detach(tmp_path / "out", tmp_path / "det")
    step = (example.deepspec_run / "step_latest").resolve()
    for f in ["config.json"] + sorted(p.name for p in step.glob("*.safetensors")):
        assert sha256_file(tmp_path / "det" / f) == sha256_file(step / f)


def _tree_hashes(folder):
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_never_lands_on_a_folder_the_command_reads(tmp_path, setup):
    """OUT that is, holds or lies in the drafter, its step, the target or the attached checkpoint: exit 1, nothing
    touched (with --overwrite the old OUT would otherwise be deleted)."""
    qt, run, v4 = setup
    runner = CliRunner()
    res = runner.invoke(main, ["convert", str(run), "--attach", str(v4), "--out", str(tmp_path / "att"), "--force"])
    assert res.exit_code == 0, res.output
    before = {f: _tree_hashes(f) for f in (qt, run, v4, tmp_path / "att")}
    step = str(run / "step_latest")
    cases = [
        ["convert", step, "--target", str(qt), "--out", step],  # OUT is the step
        ["convert", str(run), "--target", str(qt), "--out", str(run)],  # OUT is the run
        ["convert", step, "--target", str(qt), "--out", str(run)],  # OUT holds the step
        ["convert", str(run), "--target", str(qt), "--out", str(run / "converted")],  # OUT inside the source
        ["convert", str(run), "--target", str(qt), "--out", str(qt)],  # OUT is the target
        ["convert", str(run), "--target", str(qt), "--out", str(tmp_path)],  # OUT holds everything
        ["convert", str(run), "--attach", str(v4), "--out", str(v4)],  # attach in place
        ["detach", str(tmp_path / "att"), "--out", str(tmp_path / "att")],
    ]
    for args in cases:
        res = runner.invoke(main, [*args, "--overwrite"])
        assert res.exit_code == 1, (args, res.output)
        assert "OutputExistsError" in res.output and "choose an OUT outside" in res.output, (args, res.output)
    assert {f: _tree_hashes(f) for f in before} == before
    assert not (run / "converted").exists()


def test_attach_refuses_a_drafter_of_another_family_without_force(tmp_path, setup):
    """Issue 12 item 7: vLLM 0.32 serves a V4 target's DSpark drafter with DSparkDeepseekV4ForCausalLM, whose stages
    are V4 decoder layers; a Qwen3 drafter's layers cannot be loaded there."""
    qt, run, v4 = setup
    with pytest.raises(ValidationFailedError, match="DSH311") as exc:
        attach(run, v4, tmp_path / "out")
    assert [f.code for f in exc.value.report.errors] == ["DSH311"]
    assert not (tmp_path / "out").exists()


def test_a_detached_v4_drafter_attaches_back_clean(tmp_path):
    shipped = F.make_v4_target(tmp_path / "shipped", layers=4, dspark_stages=2)
    detach(shipped, tmp_path / "drafter")
    bare = F.make_v4_target(tmp_path / "bare", layers=4)
    attach(tmp_path / "drafter", bare, tmp_path / "out")
    report = validate(tmp_path / "out", str(tmp_path / "out"))
    assert report.ok, [(f.code, f.message) for f in report.errors]
    src, out = open_checkpoint(shipped), open_checkpoint(tmp_path / "out")
    mtp = sorted(n for n in src.tensors if n.startswith("mtp."))
    assert sorted(n for n in out.tensors if n.startswith("mtp.")) == mtp
    assert all(out.tensor_sha256(n) == src.tensor_sha256(n) for n in mtp)
