"""The embedded example: cache behaviour (fast) and the really trained artefacts (slow, ``example`` fixture)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dsparkhub.example as example_mod
from dsparkhub.example import SHIPPED_FILES, build_example, example_key, shipped_example_dir, shipped_key
from dsparkhub.verify.reference.loading import load_drafter

torch.set_num_threads(1)
MAX_NEW = example_mod.EXAMPLE_RECIPE["eval"]["max_new_tokens"]


# ---- cache mechanics (no training) -----------------------------------------------------------------------------


def _fake_build(out: Path, progress=None) -> None:
    (out / "deepspec_run" / "step_3").mkdir(parents=True)
    (out / "info.json").write_text(json.dumps({"dspark_step": "step_3", "marker": os.getpid()}))


def test_shipped_example_is_laid_out_in_its_real_layouts(tmp_path):
    """No training: the shipped files, byte for byte, as a DeepSpec run (relative step_latest + training state)."""
    ex = build_example(tmp_path)
    assert ex.root == tmp_path / f"example-{shipped_key()}"
    latest = ex.deepspec_run / "step_latest"
    assert latest.is_symlink() and os.readlink(latest) == ex.dspark_step.name
    src = shipped_example_dir()
    for rel in SHIPPED_FILES:
        dest = ex.dspark_step / rel.split("/", 1)[1] if rel.startswith("dspark_step/") else ex.root / rel
        assert dest.read_bytes() == (src / rel).read_bytes(), rel
    assert (ex.dspark_step / "training_state.rank0.pt").is_file()
    assert ex.info == json.loads((src / "info.json").read_text())
    mtime = (ex.root / "info.json").stat().st_mtime_ns
    assert build_example(tmp_path).root == ex.root  # reused, not rewritten
    assert (ex.root / "info.json").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [ex.root.name]


def test_shipped_key_names_a_missing_file(tmp_path):
    from dsparkhub.errors import CheckpointNotFoundError

    with pytest.raises(CheckpointNotFoundError, match="info.json"):
        shipped_key(tmp_path)


def test_from_scratch_cache_is_keyed_reused_and_atomic(tmp_path, monkeypatch):
    calls = []

    def fake(out, progress=None):
        calls.append(out)
        _fake_build(out)

    monkeypatch.setattr(example_mod, "train_example_into", fake)
    ex = build_example(tmp_path, from_scratch=True)
    assert ex.root == tmp_path / f"example-trained-{example_key()}"
    assert ex.dspark_step == ex.root / "deepspec_run" / "step_3"
    assert build_example(tmp_path, from_scratch=True).root == ex.root and len(calls) == 1  # reused
    build_example(tmp_path, from_scratch=True, force=True)
    assert len(calls) == 2
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert left == [ex.root.name]  # no temp folders left behind


def test_interrupted_build_leaves_no_cache(tmp_path, monkeypatch):
    def broken(out, progress=None):
        (out / "target").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(example_mod, "train_example_into", broken)
    with pytest.raises(KeyboardInterrupt):
        build_example(tmp_path, from_scratch=True)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARKHUB_CACHE", str(tmp_path / "c"))
    assert build_example().root.parent == tmp_path / "c"


def test_cli_example_build(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dsparkhub.cli import main

    monkeypatch.setattr(example_mod, "train_example_into", _fake_build)
    res = CliRunner().invoke(main, ["example", "build", "--cache-dir", str(tmp_path), "--from-scratch", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["dspark_step"].endswith("step_3")
    res = CliRunner().invoke(main, ["example", "build", "--cache-dir", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["root"] == str(tmp_path / f"example-{shipped_key()}")


def test_readme_quotes_the_shipped_numbers():
    """The τ the README quotes for the example are the shipped info.json's, not typed in by hand."""
    info = json.loads((shipped_example_dir() / "info.json").read_text())
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    for name in ("dspark", "dflash"):
        triple = " / ".join(f"{info['tau'][name][n]:.2f}" for n in ("3", "5", "7"))
        assert f"τ {triple}" in readme or f": {triple}" in readme, (name, triple)


# ---- the trained example (slow) ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_deepspec_layout_on_disk(example):
    run = example.deepspec_run
    latest = run / "step_latest"
    assert latest.is_symlink() and os.readlink(latest) == example.dspark_step.name  # relative
    assert latest.resolve() == example.dspark_step.resolve()
    assert sorted(p.name for p in example.dspark_step.iterdir()) == [
        "config.json", "model.safetensors", "train_config.py", "training_state.rank0.pt"]
    cfg = json.loads((example.dspark_step / "config.json").read_text())
    tcfg = json.loads((example.target / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    expect = {"num_hidden_layers": 2, "num_target_layers": tcfg["num_hidden_layers"], "block_size": 7,
              "target_layer_ids": [0, 1, 2], "markov_rank": 32, "markov_head_type": "vanilla",
              "enable_confidence_head": True, "confidence_head_with_markov": True, "tie_word_embeddings": False,
              "layer_types": ["full_attention"] * 2, "_attn_implementation": "flex_attention"}
    assert {k: cfg[k] for k in expect} == expect
    assert isinstance(cfg["num_anchors"], int)
    assert cfg["mask_token_id"] == example.info["special_tokens"]["mask_token_id"] < tcfg["vocab_size"]
    for key in ("hidden_size", "vocab_size", "rms_norm_eps", "head_dim", "num_attention_heads"):
        assert cfg[key] == tcfg[key], key  # a copy of the target config
    tensors = load_file(str(example.dspark_step / "model.safetensors"))
    layer = {f"layers.{i}.{n}" for i in range(2) for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")}
    assert set(tensors) == layer | {
        "fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight",
        "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
        "confidence_head.proj.bias"}
    h, v = tcfg["hidden_size"], tcfg["vocab_size"]
    assert list(tensors["fc.weight"].shape) == [h, 3 * h]
    assert list(tensors["markov_head.markov_w1.weight"].shape) == [v, 32]
    assert list(tensors["confidence_head.proj.weight"].shape) == [1, h + 32]
    target = load_file(str(example.target / "model.safetensors"))
    assert torch.equal(tensors["embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(tensors["lm_head.weight"], target["lm_head.weight"])
    assert (example.dspark_step / "train_config.py").read_text().startswith("# DeepSpec-style")


@pytest.mark.slow
def test_dflash_layout_on_disk(example):
    cfg = json.loads((example.dflash / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 8
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 1, 2],
                                    "mask_token_id": example.info["special_tokens"]["mask_token_id"]}
    names = set(load_file(str(example.dflash / "model.safetensors")))
    assert "fc.weight" in names and "hidden_norm.weight" in names and "norm.weight" in names
    assert not any(n.startswith(("embed_tokens", "lm_head", "markov_head", "confidence_head")) for n in names)


@pytest.mark.slow
def test_target_folder_and_prompts(example):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(example.target)
    assert tok.mask_token == "<|mask|>" and tok.convert_tokens_to_ids("<|mask|>") == 2
    assert tok.eos_token_id == 0 and len(tok) == 1024
    msgs = [{"role": "user", "content": "def f(x):\n"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "def f(x):\n"
    lines = example.prompts.read_text().splitlines()
    prompts = [json.loads(x)["prompt"] for x in lines]
    assert 10 <= len(prompts) <= 20 and all(len(p) >= 60 for p in prompts)
    held = example.info["corpus"]["heldout_modules"]
    assert held and len(held) < 40


def _engine_prompts(example, n=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(example.target)
    prompts = [json.loads(x)["prompt"] for x in example.prompts.read_text().splitlines()]
    ids = [tok(p)["input_ids"] for p in prompts]
    return ids[:n] if n else ids


@pytest.fixture(scope="module")
def trained(example):
    from dsparkhub.verify.reference.engine import ReferenceEngine, load_target

    target = load_target(example.target)
    prompts = _engine_prompts(example)
    # the build's own measurement settings (EXAMPLE_RECIPE["eval"]), so the numbers are comparable with info.json
    base = ReferenceEngine(target).run(prompts, num_speculative_tokens=None, max_new_tokens=MAX_NEW)
    return target, prompts, base


@pytest.mark.slow
def test_trained_dspark_drafts_and_is_lossless(example, trained):
    from dsparkhub.verify.reference.engine import ReferenceEngine

    target, prompts, base = trained
    stats = ReferenceEngine(target, example.deepspec_run).run(prompts, num_speculative_tokens=7,
                                                              max_new_tokens=MAX_NEW)
    assert stats.outputs == base.outputs
    # the shipped weights are the same on every machine; only kernel rounding may flip a rare greedy near-tie
    assert abs(stats.tau - example.info["tau"]["dspark"]["7"]) < 0.1, stats.tau
    acc = stats.per_position_acceptance
    assert acc[0] > 0.5 and acc[0] >= acc[-1]
    assert example.info["tau"]["dspark"]["7"] >= 2.5  # the shipped record itself


@pytest.mark.slow
def test_trained_dflash_drafts_and_is_lossless(example, trained):
    from dsparkhub.verify.reference.engine import ReferenceEngine

    target, prompts, base = trained
    stats = ReferenceEngine(target, example.dflash).run(prompts, num_speculative_tokens=7, max_new_tokens=MAX_NEW)
    assert stats.outputs == base.outputs
    assert stats.tau >= 1.5, stats.tau  # weaker than DSpark (no Markov head, 1+N), but it drafts


@pytest.mark.slow
def test_drafter_without_context_features_collapses_tau(example, trained):
    """Zero ``fc`` (the drafter no longer sees the target's hidden states): τ near 1, still lossless."""
    from dsparkhub.verify.reference.engine import ReferenceEngine

    target, prompts, base = trained
    drafter = load_drafter(example.deepspec_run, target)
    with torch.no_grad():
        drafter.fc.weight.zero_()
    stats = ReferenceEngine(target, drafter).run(prompts[:8], num_speculative_tokens=7, max_new_tokens=MAX_NEW)
    assert stats.outputs == base.outputs[:8]  # still lossless, just slow
    assert stats.tau < 1.35, stats.tau


@pytest.mark.slow
def test_layer_ids_shifted_by_one(example, trained, tmp_path):
    """The numbering mix-up (layer index vs hidden-state index), both ways, on the trained DSpark drafter.

    +1 ([0, 1, 2] -> [1, 2, 3]): `verify` refuses before loading a model (DSH304, the last layer's HF state is
    normed) and exits 1. -1 ([-1, 0, 1], the embedding output first): validate warns (DSH308), and τ barely
    moves, because adjacent residual-stream states carry the same token information (this target: cosine 0.95
    between layers 1..3; a drafter trained on the embedding output alone reaches τ 2.68). So τ cannot reveal this
    mix-up; the id checks at conversion (DSH304 / DSH308 / DSH309) are what catch it. Upstream saw the same size of
    effect: sglang PR #25454 (an extra +1 on EAGLE-3 aux ids cost ~0.10 accept length on Kimi-K2.5).
    """
    from click.testing import CliRunner

    from dsparkhub.cli import main
    from dsparkhub.verify.reference.engine import ReferenceEngine

    target, prompts, base = trained
    ids = json.loads((example.dspark_step / "config.json").read_text())["target_layer_ids"]
    assert ids == [0, 1, 2]
    for shift in (1, -1):
        step = tmp_path / f"shift{shift:+d}"
        shutil.copytree(example.dspark_step, step)
        cfg = json.loads((step / "config.json").read_text())
        cfg["target_layer_ids"] = [i + shift for i in ids]
        (step / "config.json").write_text(json.dumps(cfg))
        if shift == 1:
            res = CliRunner().invoke(main, ["verify", str(step), "--target", str(example.target), "--backend",
                                            "reference", "-n", "7", "--max-new-tokens", "8",
                                            "--out", str(tmp_path / "r.json")])
            assert res.exit_code == 1, res.output
            assert "DSH304" in res.output and "target_layer_ids" in res.output
            assert not (tmp_path / "r.json").exists()
        else:
            from dsparkhub.validate import validate

            assert "DSH308" in [f.code for f in validate(step, str(example.target)).warnings]
            stats = ReferenceEngine(target, load_drafter(step, target)).run(
                prompts[:8], num_speculative_tokens=7, max_new_tokens=MAX_NEW)
            assert stats.outputs == base.outputs[:8]
            assert stats.tau > example.info["tau"]["dspark"]["7"] - 0.4, stats.tau


@pytest.mark.slow
def test_reading_anchor_first_as_one_plus_n_loses_acceptance(example, trained, tmp_path):
    """The DSpark drafter served with the 1+N layout (``sample_from_anchor: false``): every slot shifted by one."""
    from dsparkhub.verify.reference.engine import ReferenceEngine

    target, prompts, base = trained
    step = tmp_path / "as_1n"
    shutil.copytree(example.dspark_step, step)
    cfg = json.loads((step / "config.json").read_text())
    cfg["sample_from_anchor"] = False
    (step / "config.json").write_text(json.dumps(cfg))
    drafter = load_drafter(step, target)
    assert drafter.config.sample_from_anchor is False
    stats = ReferenceEngine(target, drafter).run(prompts, num_speculative_tokens=7, max_new_tokens=MAX_NEW)
    assert stats.outputs == base.outputs
    assert stats.tau < example.info["tau"]["dspark"]["7"] - 0.3, stats.tau


@pytest.mark.slow
def test_info_records_the_build(example):
    info = example.info
    assert set(info["tau"]) == {"dspark", "dflash"}
    assert set(info["tau"]["dspark"]) == {"3", "5", "7"}
    assert info["lossless_greedy"] == {"dspark": True, "dflash": True}
    for phase in ("tokenizer_s", "target_train_s", "regenerate_s", "dspark_train_s", "dflash_train_s",
                  "measure_s", "total_s"):
        assert info["seconds"][phase] > 0
    assert info["sizes"]["vocab_size"] == 1024 and info["sizes"]["target_parameters"] > 1_000_000
