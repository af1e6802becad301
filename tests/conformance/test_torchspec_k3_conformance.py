"""TorchSpec's own Kimi K3 DSpark export (``K3DSparkModel`` of lightseekorg/TorchSpec 7f1e090 written by
``tools/convert_to_hf.py``'s writers at deepinfra/TorchSpec 30189db; ``generators/make_torchspec_k3_fixtures.py``
re-makes both fixtures): detected as ``torchspec-k3``, inspected, validated (the Kimi K3 manifest at real size),
converted to the ``K3DSparkModel`` layout vLLM 0.32 loads, and that config accepted by vLLM's own
``K3DSparkConfig`` (marker ``vllm``). SGLang 0.5.23 has no class for it: ``sglang-check`` refuses, naming its
registry (marker ``sglang``).

What the export holds, checked against the fixtures: ``model_type`` ``k3_dspark`` (not in convert_to_hf.py's
``_MODEL_TYPE_REMAP``), TorchSpec's tensor names (``fc`` / ``hidden_norm`` / ``norm``, where vLLM reads
``context_proj`` / ``context_norm`` / ``final_norm``), no block size, no ``markov_head_type`` (the 7f1e090 default
``vanilla``), a BF16 confidence-head bias, and with ``--prune-vocab`` a ``d2t`` / ``t2d`` pair beside a ``markov_w2``
still over the full vocab, which K3 cannot use (vLLM's ``K3DSparkConfig`` requires draft vocab = vocab).
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.layouts.reading import open_draft
from dsparkhub.skeleton import sparse_drafter, write_skeleton
from dsparkhub.validate import validate

from .conftest import FIXTURES, need_sglang

PLAIN = FIXTURES / "torchspec-k3-dspark"
PRUNED = FIXTURES / "torchspec-k3-dspark-pruned"
RENAMED = {"fc.weight": "context_proj.weight", "hidden_norm.weight": "context_norm.weight",
           "norm.weight": "final_norm.weight"}
#: Kimi K3's sizes (the kimi-k3 manifest; Inferact Kimi-K3-DSpark config.json)
K3_SIZES = {"hidden_size": 7168, "intermediate_size": 14336, "num_hidden_layers": 5, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840, "num_target_layers": 5,
            "target_layer_ids": [1, 23, 46, 69, 91], "target_hidden_size": 7168, "target_num_hidden_layers": 93,
            "mask_token_id": 163838, "markov_rank": 256, "draft_vocab_size": 163840}


def _tensors(folder) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def converted_all(tmp_path_factory):
    outs = {}
    for folder in (PLAIN, PRUNED):
        outs[folder] = tmp_path_factory.mktemp("torchspec-k3") / "k3-dspark"
        convert(folder, outs[folder], None)
    return outs


def test_fixtures_are_torchspec_made_and_small():
    for folder in (PLAIN, PRUNED):
        up = json.loads((folder / "UPSTREAM.json").read_text())
        assert (up["repository"], up["commit"]) == ("deepinfra/TorchSpec", "30189db21e1b58f08bac4c6e7397f0344c2d6dd6")
        assert up["model_code"]["commit"] == "7f1e0906abcb8aebaee8191f41a49b07f457b4c2"
        assert sum(p.stat().st_size for p in folder.iterdir()) < 100_000
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["_torchspec_version"] == "0.1.0" and cfg["model_type"] == "k3_dspark"
        assert not {"block_size", "markov_head_type"} & set(cfg)
        assert cfg["num_target_layers"] == len(cfg["target_layer_ids"]) == 3
    t = _tensors(PLAIN)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight"} <= set(t)
    assert "lm_head.weight" not in t
    attn = {k.split(".self_attn.")[1] for k in t if ".self_attn." in k}  # MLA with q_lora, no output gate
    assert attn == {f"{p}.weight" for p in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                                            "kv_a_layernorm", "kv_b_proj", "o_proj")}
    assert t["confidence_head.proj.bias"].dtype == torch.bfloat16


def test_the_pruned_export_keeps_markov_w2_over_the_full_vocab():
    t, plain = _tensors(PRUNED), _tensors(PLAIN)
    cfg = json.loads((PRUNED / "config.json").read_text())
    V, Vd, r = cfg["vocab_size"], cfg["draft_vocab_size"], cfg["markov_rank"]
    assert Vd == 64 < V and "lm_head.weight" not in t
    assert list(t["markov_head.markov_w2.weight"].shape) == [V, r]
    assert t["d2t"].dtype == torch.int64 and list(t["d2t"].shape) == [Vd] and t["t2d"].dtype == torch.bool
    assert all(plain[k].equal(v) for k, v in t.items() if k in plain) and set(t) - set(plain) == {"d2t", "t2d"}


@pytest.mark.parametrize("folder", [PLAIN, PRUNED], ids=["plain", "pruned"])
def test_detected_as_torchspec_k3(folder):
    d = open_draft(folder)
    s = d.spec
    assert (d.recipe.name, s.variant, s.family, s.block_layout, s.block_size) == (
        "torchspec-k3", "dspark", "k3-mla", "anchor_first", 7)
    assert any("block size 7 assumed" in n for n in s.notes)
    assert (s.target_layer_ids, s.num_target_layers) == ([1, 3, 5], 8)
    assert (s.markov_rank, s.markov_head_type, s.confidence_head, s.confidence_head_with_markov) == (
        8, "vanilla", True, True)
    assert s.draft_vocab_size == s.vocab_size == 128
    assert any("'d2t' is TorchSpec --prune-vocab's" in n for n in s.notes) == (folder == PRUNED)
    assert validate(folder).errors == []


@pytest.mark.parametrize("spelling", ["classical", "vanilla"])
def test_both_markov_head_spellings_read_as_the_vanilla_head(fixture_copy, spelling):
    """Earlier TorchSpec configs spell the low-rank head ``classical``, 7f1e090's default is ``vanilla``: the same
    head (markov_w1 [V, r], markov_w2 [V, r]); vLLM 0.32 runs only ``vanilla`` (DSH105 otherwise)."""
    for name in ("torchspec-k3-dspark", "torchspec-dspark"):
        folder = fixture_copy(name)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "markov_head_type": spelling}))
        d = open_draft(folder)
        assert d.spec.markov_head_type == "vanilla", name
        assert "DSH105" not in validate(folder).codes


def test_an_output_gate_is_refused(fixture_copy):
    folder = fixture_copy("torchspec-k3-dspark")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "mla_use_output_gate": True}))
    found = [f for f in validate(folder).findings if f.code == "DSH109"]
    assert found and "mla_use_output_gate" in found[0].message


def test_inspect_json():
    res = CliRunner().invoke(main, ["inspect", str(PRUNED), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert (info["layout"], info["family"], info["block_size"]) == ("torchspec-k3", "k3-mla", 7)


def test_the_export_at_k3_size_validates_against_the_kimi_k3_manifest_and_skeleton(tmp_path):
    """The export's keys and tensor names at Kimi K3's sizes (headers only) against the kimi-k3 manifest and a
    real-size K3 skeleton (``dsparkhub skeleton kimi-k3``); the toy export itself is 32 wide, so DSH305 there."""
    cfg = {**json.loads((PRUNED / "config.json").read_text()), **K3_SIZES}
    src = sparse_drafter(tmp_path / "k3", cfg)
    assert open_draft(src).recipe.name == "torchspec-k3"
    skeleton = write_skeleton("kimi-k3", tmp_path / "kimi-k3").out
    for target in ("kimi-k3", str(skeleton)):
        report = validate(src, target)
        assert report.errors == [], [f.message for f in report.errors]
    res = CliRunner().invoke(main, ["validate", str(src), "--target", "kimi-k3"])
    assert res.exit_code == 0, res.output
    assert "DSH305" in validate(PLAIN, "kimi-k3").codes


def test_convert_writes_the_k3_layout_vllm_loads_bit_identical(converted_all):
    out = converted_all[PLAIN]
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["model_type"]) == (["K3DSparkModel"], "k3_dspark")
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["target_layer_ids"]) == (7, 3, [1, 3, 5])
    assert cfg["markov_head_type"] == "vanilla" and cfg["mla_use_output_gate"] is False
    assert cfg["target_hidden_size"] == cfg["hidden_size"] == 32  # K3DSparkModel reads it with no default
    assert not {"_torchspec_version", "torch_dtype", "draft_vocab_size"} & set(cfg)
    assert open_draft(out).recipe.name == "k3-dspark"
    src, got = _tensors(PLAIN), _tensors(out)
    assert set(got) == {RENAMED.get(k, k) for k in src}
    for k, v in src.items():
        w = got[RENAMED.get(k, k)]
        assert w.dtype == v.dtype and w.contiguous().view(torch.uint8).equal(v.contiguous().view(torch.uint8)), k
    pruned = converted_all[PRUNED]
    assert (out / "model.safetensors").read_bytes() == (pruned / "model.safetensors").read_bytes()
    assert json.loads((pruned / "config.json").read_text()) == cfg


@pytest.mark.vllm
def test_vllm_k3_dspark_config_accepts_the_converted_config(converted_all):
    """vLLM 0.32's own K3DSparkConfig (its refusals: output gate, draft vocab, num_target_layers) on the output.
    vllm-check's weight stage is SKIPPED for K3 (verify/vllm/check_stages.py: vLLM 0.32's K3DSparkModel,
    models/kimi_k3/nvidia/dspark_mla.py, has no CPU build path), so the config class is what CPU CI can check."""
    k3 = pytest.importorskip("vllm.transformers_utils.configs.k3_dspark")
    cfg = json.loads((converted_all[PLAIN] / "config.json").read_text())
    c = k3.K3DSparkConfig(**cfg)
    assert (c.draft_vocab_size, c.num_target_layers, c.mla_use_output_gate) == (128, 3, False)
    src = json.loads((PRUNED / "config.json").read_text())
    with pytest.raises(ValueError, match="draft_vocab_size"):  # why the pruned subset cannot be kept
        k3.K3DSparkConfig(**{**cfg, "draft_vocab_size": src["draft_vocab_size"]})


@pytest.mark.slow
@pytest.mark.vllm034
def test_vllm034_check_builds_and_loads_k3_dspark_on_cpu(converted_all, toy_target):
    """vLLM 0.34's own K3DSparkConfig accepts the converted export and its K3DSparkForCausalLM
    (models/kimi_k3/nvidia/dspark_mla.py) is built on CPU behind the contract's stand-in and loads every parameter:
    the stand-in binds vllm.triton_utils's ``triton`` names with its flag (else the kimi_k3 package's Triton kernels
    meet HAS_TRITON true beside the placeholder ``triton`` and the registry cannot inspect the class), and the
    converted config carries ``target_hidden_size`` (dspark_mla.py:153 reads it with no default). vLLM drops the
    shipped ``embed_tokens`` (it aliases the target's, dspark_mla.py:445), so all tensors but that one compare."""
    from conftest import vllm034_check

    code, report = vllm034_check(converted_all[PLAIN], toy_target)
    stages = {s["name"]: s for s in report["stages"]}
    assert code == 0 and report["ok"], json.dumps(report, indent=1)
    config = stages["config"]["details"]
    assert config["architectures"] == ["K3DSparkModel"] and config["draft_model_type"] == "k3_dspark"
    assert config["config_class"] == "vllm.transformers_utils.configs.k3_dspark.K3DSparkConfig"
    load = stages["load_weights"]
    assert load["status"] == "passed" and load["details"]["class"] == "K3DSparkForCausalLM", load
    assert load["details"]["missing"] == [] and load["details"]["mismatched"] == []
    assert load["details"]["compared_bit_exact"] == load["details"]["checkpoint_tensors"] - 1 == 31
    assert stages["engine"]["details"]["reason"] == "x86_cpu_triton"
    assert "triton, tl, tldevice, gluon, gl, aggregate bound" in report["stand_in"]


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_check_refuses_k3_dspark_naming_sglangs_registry(converted_all, toy_target):
    """SGLang 0.5.23 drives DSPARK on a Kimi K3 target (models/kimi_k3.py set_dspark_layers_to_capture) but its
    ModelRegistry has no MLA DSpark drafter: the DSPARK classes are Qwen3DSparkModel / LingDSparkModel /
    DSparkDraftModel (models/dspark.py:995), DSparkMiniMaxDraftModel, DeepseekV4ForCausalLMDSpark, Lfm2DSparkDraftModel.
    Both converted exports (the same bytes) are refused at the config stage in one paragraph, exit 1."""
    from dsparkhub.verify.sglang.checks import check_with_sglang

    need_sglang()
    report = check_with_sglang(converted_all[PLAIN], toy_target)
    config = report.stage("config")
    assert (report.algorithm, config.status, report.ok) == ("DSPARK", "refused", False), report.to_dict()
    assert (report.stage("load_weights").status, report.stage("engine").status) == ("skipped", "skipped")
    assert "['K3DSparkModel']" in config.message and "'k3_dspark'" in config.message
    assert "sglang/srt/models/registry.py:" in config.message
    assert "Qwen3DSparkModel" in config.message and "sglang/srt/models/dspark.py:995" in config.message
    assert "K3DSparkModel" not in str(config.details["registered_draft_classes"])
    res = CliRunner().invoke(main, ["sglang-check", str(converted_all[PRUNED]), "--target", str(toy_target)])
    assert res.exit_code == 1 and "SGLang does not serve this drafter" in res.output, res.output
