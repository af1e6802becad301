"""DeepSeek-V4 / V4.1 attached DSpark drafters against vLLM 0.32's own classes, default by default
(vllm/models/deepseek_v4/nvidia/dspark.py, deepseek_v41/nvidia/dspark.py; issue 12 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dsparkhub.layouts.reading import open_draft
from dsparkhub.testing import factories as F
from dsparkhub.validate import validate

H, R = 32, 8


def _edit(folder: Path, name: str, tensor: torch.Tensor | None, *, like: str = "mtp.2.norm.weight") -> None:
    """Replace (None: delete) tensor ``name`` of a sharded V4 checkpoint; a new name goes into ``like``'s shard."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = folder / (index["weight_map"][name] if name in index["weight_map"] else index["weight_map"][like])
    tensors = load_file(str(shard))
    if tensor is None:
        del tensors[name]
        del index["weight_map"][name]
    else:
        tensors[name] = tensor
        index["weight_map"][name] = shard.name
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


def _config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def _codes(report, code):
    return [f for f in report.findings if f.code == code]


def test_real_v4_confidence_head_reads_h_and_markov_feature(tmp_path):
    """vLLM builds DSparkConfidenceHead(hidden_size + dspark_markov_rank), bias-less, with_markov; V4 configs carry
    no confidence_head_with_markov key. Such a drafter is clean."""
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3, markov_rank=R)
    cfg = json.loads((v4 / "config.json").read_text())
    assert "confidence_head_with_markov" not in cfg
    _edit(v4, "mtp.2.confidence_head.proj.weight", torch.zeros(1, H + R))
    d = open_draft(v4)
    assert d.spec.confidence_head and d.spec.confidence_head_with_markov
    report = validate(d)
    assert report.ok, report.errors
    assert not _codes(report, "DSH203")


def test_v4_confidence_head_over_h_only_is_refused(tmp_path):
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3, markov_rank=R)
    _edit(v4, "mtp.2.confidence_head.proj.weight", torch.zeros(1, H))
    f = _codes(validate(v4), "DSH203")
    assert f and f[0].location == "tensor confidence_head.proj.weight"
    assert f[0].expected == str([1, H + R]) and f[0].found == str([1, H])


def test_v4_confidence_bias_is_refused(tmp_path):
    """vLLM 0.32 builds the V4 head with bias=False: a shipped bias is `params_dict[name]` KeyError at load."""
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3, markov_rank=R)
    _edit(v4, "mtp.2.confidence_head.proj.bias", torch.zeros(1))
    report = validate(v4)
    assert not report.ok
    assert [f.location for f in _codes(report, "DSH202")] == ["tensor confidence_head.proj.bias"]


def test_v4_hc_head_shapes_are_pinned_and_required(tmp_path):
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=3, markov_rank=R)
    assert validate(v4).ok
    _edit(v4, "mtp.2.hc_head_fn", torch.zeros(4, H))
    f = _codes(validate(v4), "DSH203")
    assert f and f[0].location == "tensor hc_head_fn" and f[0].expected == str([4, 4 * H])
    _edit(v4, "mtp.2.hc_head_fn", None)  # vLLM's nn.Parameter(torch.empty(...)) would stay uninitialised
    assert [f.location for f in _codes(validate(v4), "DSH201")] == ["tensor hc_head_fn"]


def test_v41_has_no_learned_hc_head(tmp_path):
    """V4.1's remap sends mtp.{i}.hc_head_* to model.layers.{i}.hc_head_* (no such parameter: KeyError at load)."""
    v41 = F.make_v4_target(tmp_path / "v41", dspark_stages=2, model_type="deepseek_v41",
                           dspark_target_layer_ids=(1, 2), markov_rank=R)
    assert validate(v41).ok
    for n, t in (("hc_head_fn", torch.zeros(4, 4 * H)), ("hc_head_base", torch.zeros(4)),
                 ("hc_head_scale", torch.ones(1))):
        _edit(v41, f"mtp.1.{n}", t, like="mtp.1.norm.weight")
    report = validate(v41)
    assert sorted(f.location for f in _codes(report, "DSH202")) == \
        ["tensor hc_head_base", "tensor hc_head_fn", "tensor hc_head_scale"]


def test_v4_stage_count_vllm_builds(tmp_path):
    """V4: n_mtp_layers, else 3 (num_nextn_predict_layers is not read); V4.1: n_mtp_layers, else
    num_nextn_predict_layers, else 3."""
    v4 = F.make_v4_target(tmp_path / "v4", dspark_stages=2, num_nextn_predict_layers=2)
    assert validate(v4).ok
    _config(v4, n_mtp_layers=None)
    f = _codes(validate(v4), "DSH111")
    assert f and f[0].severity == "error" and f[0].expected == "2" and f[0].found == "3"
    v41 = F.make_v4_target(tmp_path / "v41", dspark_stages=2, model_type="deepseek_v41", num_nextn_predict_layers=1,
                           dspark_target_layer_ids=(1, 2))
    _config(v41, n_mtp_layers=None)
    f = _codes(validate(v41), "DSH111")
    assert f and f[0].found == "1" and "num_nextn_predict_layers" in f[0].message
    _config(v41, num_nextn_predict_layers=2)
    assert not _codes(validate(v41), "DSH111")


def test_v41_markov_head_embed_head_names_are_read(tmp_path):
    """V4.1 checkpoints call the Markov factors markov_head.embed / markov_head.head; vLLM 0.32 remaps them to
    markov_w1 / markov_w2 (deepseek_v41/nvidia/dspark.py:519-527). V4's loader has no such remap."""
    for model_type, ok in (("deepseek_v41", True), ("deepseek_v4", False)):
        folder = F.make_v4_target(tmp_path / model_type, dspark_stages=2, model_type=model_type,
                                  dspark_target_layer_ids=(1, 2), markov_rank=R)
        last = "mtp.1."
        for old, new in (("markov_w1", "embed"), ("markov_w2", "head")):
            index = json.loads((folder / "model.safetensors.index.json").read_text())
            t = load_file(str(folder / index["weight_map"][f"{last}markov_head.{old}.weight"]))
            _edit(folder, f"{last}markov_head.{new}.weight", t[f"{last}markov_head.{old}.weight"],
                  like=f"{last}norm.weight")
            _edit(folder, f"{last}markov_head.{old}.weight", None)
        report = validate(folder)
        assert report.ok is ok, [(f.code, f.location) for f in report.errors]
        if ok:
            d = open_draft(folder)
            assert d.spec.source_names["markov_head.markov_w1.weight"] == "mtp.1.markov_head.embed.weight"
        else:
            assert "DSH202" in report.codes and "DSH201" in report.codes
