"""Real-size sparse skeletons of Kimi-K2.6, Kimi K3 and DeepSeek-V4-Flash: validate runs against them from headers
and catches a drafter built for another target; tiny versions hold data with the real structure."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.cli import main
from dsparkhub.errors import ManifestError
from dsparkhub.skeleton import sparse_drafter, write_skeleton
from dsparkhub.skeleton_tensors import skeleton_tensors
from dsparkhub.target import open_target
from dsparkhub.validate import validate

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def skeletons(tmp_path_factory):
    base = tmp_path_factory.mktemp("skeletons")
    return {name: write_skeleton(name, base / name, with_drafter=name == "deepseek-v4-flash")
            for name in ("kimi-k2.6", "kimi-k3", "deepseek-v4-flash")}


def _kimi_k26_drafter(folder):
    """Novita-style speculators DSpark drafter for Kimi-K2.6: Vd 32000 of 163840, hidden-state ids, real size."""
    return sparse_drafter(folder, {
        "architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark", "speculators_version": "0.9.0",
        "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 7168, "num_hidden_layers": 1,
                                     "num_attention_heads": 56, "num_key_value_heads": 8, "head_dim": 128,
                                     "intermediate_size": 18432, "vocab_size": 163840},
        "draft_vocab_size": 32000, "block_size": 8, "target_hidden_size": 7168,
        "aux_hidden_state_layer_ids": [2, 16, 30, 44, 59], "mask_token_id": 163838, "sample_from_anchor": True,
        "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": False,
        "speculators_config": {"algorithm": "dspark", "proposal_methods": [{"proposal_type": "greedy",
                                                                            "speculative_tokens": 8}],
                               "default_proposal_method": "greedy",
                               "verifier": {"name_or_path": "moonshotai/Kimi-K2.6",
                                            "architectures": ["KimiK25ForConditionalGeneration"]}}})


def _kimi_k3_drafter(folder):
    """Inferact-style K3 MLA DSpark drafter at real size (FORMATS §5)."""
    return sparse_drafter(folder, {
        "architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "hidden_size": 7168,
        "intermediate_size": 14336, "num_hidden_layers": 5, "num_attention_heads": 64, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 163840, "num_target_layers": 5, "target_layer_ids": [1, 23, 46, 69, 91],
        "target_hidden_size": 7168, "target_num_hidden_layers": 93, "mask_token_id": 163838, "markov_rank": 256,
        "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True,
        "block_size": 8, "mla_use_nope": False, "mla_use_output_gate": False})


def test_skeletons_are_real_size_and_sparse(skeletons):
    k26, k3, v4 = skeletons["kimi-k2.6"], skeletons["kimi-k3"], skeletons["deepseek-v4-flash"]
    assert k26.logical_bytes > 500e9 and len(k26.files) == 64 and k26.num_tensors > 200_000
    assert len(k3.files) == 96 and len(v4.files) == 48  # 45 target shards + 3 mtp stages, as DeepSeek ships it
    for r in (k26, k3, v4):
        assert r.disk_bytes < 64 << 20 < r.logical_bytes
    ck = open_checkpoint(v4.out, lazy=True)
    assert ck.tensors["embed.weight"].shape == (129280, 4096)
    assert ck.tensors["layers.42.ffn.experts.255.w2.weight"].dtype == "I8"
    index = json.loads((v4.out / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["mtp.2.main_proj.weight"] == "model-00048-of-00048.safetensors"
    cfg = json.loads((v4.out / "config.json").read_text())
    assert cfg["dspark_target_layer_ids"] == [40, 41, 42] and cfg["num_nextn_predict_layers"] == 1


def test_validate_accepts_each_drafter_against_its_own_target(tmp_path, skeletons):
    k26 = validate(_kimi_k26_drafter(tmp_path / "k26"), str(skeletons["kimi-k2.6"].out))
    assert k26.ok, [f.message for f in k26.errors]
    k3 = validate(_kimi_k3_drafter(tmp_path / "k3"), str(skeletons["kimi-k3"].out))
    assert k3.ok, [f.message for f in k3.errors]
    v4 = validate(str(skeletons["deepseek-v4-flash"].out), str(skeletons["deepseek-v4-flash"].out))
    assert v4.ok and v4.spec["num_layers"] == 3 and v4.spec["target_layer_ids"] == [39, 40, 41]


def test_validate_catches_drafters_built_for_another_target(tmp_path, skeletons):
    k26, k3, v4 = (str(skeletons[n].out) for n in ("kimi-k2.6", "kimi-k3", "deepseek-v4-flash"))
    k3_drafter = _kimi_k3_drafter(tmp_path / "k3")
    k26_drafter = _kimi_k26_drafter(tmp_path / "k26")
    # K3 drafter on Kimi-K2.6: 93-layer ids and target layer count against 61 layers
    codes = validate(k3_drafter, k26).codes
    assert {"DSH303", "DSH306"} <= codes
    # Kimi-K2.6 drafter on DeepSeek-V4-Flash: hidden size and vocab differ
    assert {"DSH301", "DSH302"} <= validate(k26_drafter, v4).codes
    # the V4-Flash attached drafter on Kimi K3: hidden size and vocab differ
    assert {"DSH301", "DSH302"} <= validate(v4, k3).codes
    # Kimi-K2.6 drafter on Kimi K3 (same H and V): the speculators verifier names K2.6
    assert "DSH310" in validate(k26_drafter, k3).codes


def test_validate_reads_headers_only(tmp_path, skeletons, monkeypatch):
    """A skeleton has no data: any read of tensor bytes would return holes; make such reads fail loudly."""
    from dsparkhub.io import checkpoint

    def no_data(self, name):
        raise AssertionError(f"tensor data read: {name}")

    monkeypatch.setattr(checkpoint.Checkpoint, "tensor_sha256", no_data)
    monkeypatch.setattr(checkpoint.Checkpoint, "read_tensor", no_data)
    report = validate(_kimi_k3_drafter(tmp_path / "k3"), str(skeletons["kimi-k3"].out))
    assert report.ok


def test_tiny_versions_keep_names_and_hold_values(tmp_path):
    r = write_skeleton("deepseek-v4-flash", tmp_path / "tiny", tiny=True)
    real = {t.name.replace(".255.", ".x.") for t in skeleton_tensors("deepseek-v4-flash") if "layers.0." in t.name}
    ck = open_checkpoint(r.out)
    tiny_l0 = {n for n in ck.tensors if n.startswith("layers.0.") and ".experts." not in n}
    assert tiny_l0 == {n for n in real if ".experts." not in n}
    assert ck.tensors["embed.weight"].shape == (512, 256) and not r.sparse
    info = ck.tensors["layers.1.attn.wq_a.weight"]
    with safe_open(str(r.out / info.file), framework="pt") as f:
        w = f.get_tensor(info.name)
    assert w.dtype == torch.float8_e4m3fn and 0 < w.float().abs().max() < 1
    t = open_target(str(r.out))
    assert (t.hidden_size, t.vocab_size, t.embed.name) == (256, 512, "embed.weight")


def test_tiny_attached_drafter_validates_and_detaches(tmp_path):
    from dsparkhub.attach import detach

    r = write_skeleton("deepseek-v4-flash", tmp_path / "tiny", tiny=True, with_drafter=True)
    report = validate(str(r.out))
    assert report.ok, [f"{f.code} {f.message}" for f in report.errors]
    stages = {}
    for name in open_checkpoint(r.out).tensors:
        if name.startswith("mtp."):
            s, rest = name.split(".", 2)[1:]
            stages.setdefault(int(s), set()).add(rest)
    per_layer = [stages[k] for k in range(3)]
    assert per_layer[0] <= per_layer[2] and per_layer[0] == per_layer[1]  # the last stage adds the shared heads
    cfg = json.loads((r.out / "config.json").read_text())
    assert cfg["dspark_noise_token_id"] < cfg["vocab_size"] == 512
    target = write_skeleton("deepseek-v4-flash", tmp_path / "target", tiny=True)
    detached = detach(r.out, tmp_path / "drafter")
    assert validate(str(detached.out), str(target.out)).ok


def test_manifest_without_layout_and_cli(tmp_path):
    with pytest.raises(ManifestError, match="no checkpoint tensor layout"):
        write_skeleton("gemma4-12b", tmp_path / "g")
    res = CliRunner().invoke(main, ["skeleton", "qwen3-4b", "--out", str(tmp_path / "q")])
    assert res.exit_code == 0, res.output
    assert "(sparse)" in res.output
    names = set(open_checkpoint(tmp_path / "q").tensors)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # Qwen3-4B ties embeddings
