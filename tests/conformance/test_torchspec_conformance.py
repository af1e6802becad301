"""TorchSpec's DSpark export, as TorchSpec's own code writes it (deepinfra/TorchSpec 30189db: the trainer's
``checkpoint.save`` then ``tools/convert_to_hf.py``; ``generators/make_torchspec_fixtures.py`` re-makes both
fixtures): detected as ``torchspec``, inspected, validated against the toy target, converted to the layout vLLM 0.32
and SGLang 0.5.23 load, and checked by both engines' own loaders (markers ``vllm`` / ``sglang``).

What the real export holds (and the recipe relies on), checked here against the fixtures rather than assumed:
``model_type`` ``qwen3`` (convert_to_hf.py:145-166), no block size, TorchSpec's ``num_target_layers`` = the number of
layers read while ``target_num_hidden_layers`` is the target's, no ``lm_head`` (the trainer uses the target's), and
with ``--prune-vocab`` a ``d2t`` / ``t2d`` pair beside a ``markov_w2`` still over the full vocab (so the pair is
dropped on read: the drafter is the full-vocab one it was trained as, and converts to the same bytes).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate import validate

from .conftest import FIXTURES

PLAIN = FIXTURES / "torchspec-dspark"
PRUNED = FIXTURES / "torchspec-dspark-pruned"


def _tensors(folder) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def converted_all(tmp_path_factory, toy_target):
    outs = {}
    for folder in (PLAIN, PRUNED):
        outs[folder] = tmp_path_factory.mktemp("torchspec") / "qwen3-dspark"
        convert(folder, outs[folder], toy_target)
    return outs


@pytest.fixture(scope="module")
def converted(converted_all):
    return converted_all[PLAIN]


def test_fixtures_are_torchspec_made_and_small():
    for folder in (PLAIN, PRUNED):
        up = json.loads((folder / "UPSTREAM.json").read_text())
        assert (up["repository"], up["commit"]) == ("deepinfra/TorchSpec", "30189db21e1b58f08bac4c6e7397f0344c2d6dd6")
        assert sum(p.stat().st_size for p in folder.iterdir()) < 300_000
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["_torchspec_version"] == "0.1.0" and cfg["model_type"] == "qwen3"  # qwen3_dspark remapped
        assert "block_size" not in cfg


def test_the_pruned_export_keeps_markov_w2_over_the_full_vocab():
    """Upstream wins: convert_to_hf.py:299-313 trims only an lm_head, which a TorchSpec DSpark draft has none of."""
    t = _tensors(PRUNED)
    cfg = json.loads((PRUNED / "config.json").read_text())
    V, Vd, r = cfg["vocab_size"], cfg["draft_vocab_size"], cfg["markov_rank"]
    assert Vd < V and "lm_head.weight" not in t
    assert list(t["markov_head.markov_w2.weight"].shape) == [V, r]
    assert list(t["markov_head.markov_w1.weight"].shape) == [V, r]
    assert t["d2t"].dtype == torch.int64 and list(t["d2t"].shape) == [Vd] and t["t2d"].dtype == torch.bool
    ids = (t["d2t"] + t["d2t"].new_tensor(range(Vd))).tolist()  # speculators' offset convention
    assert ids == sorted(set(ids)) and t["t2d"].nonzero().flatten().tolist() == ids
    plain = _tensors(PLAIN)  # the same trained weights, pruned or not
    assert all(plain[k].equal(v) for k, v in t.items() if k in plain)


@pytest.mark.parametrize("folder", [PLAIN, PRUNED], ids=["plain", "pruned"])
def test_detected_as_torchspec(folder):
    d = open_draft(folder)
    s = d.spec
    assert d.recipe.name == "torchspec"
    assert (s.variant, s.family, s.block_layout, s.block_size) == ("dspark", "qwen3", "anchor_first", 7)
    assert any("block size 7 assumed" in n for n in s.notes)
    assert s.target_layer_ids == [1, 2]
    assert s.num_target_layers == 4  # target_num_hidden_layers, not TorchSpec's num_target_layers (2 read)
    assert (s.markov_rank, s.markov_head_type) == (8, "vanilla")
    assert s.confidence_head and s.confidence_head_with_markov
    assert s.draft_vocab_size == s.vocab_size == 128  # --prune-vocab's subset is dropped (see the next test)
    assert any("'d2t' is TorchSpec --prune-vocab's" in n for n in s.notes) == (folder == PRUNED)


def test_block_size_written_into_the_config_wins(fixture_copy):
    folder = fixture_copy("torchspec-dspark")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "block_size": 5}))
    d = open_draft(folder)
    assert d.recipe.name == "torchspec" and d.spec.block_size == 5
    assert not any("assumed" in n for n in d.spec.notes)


def test_torchspec_defaults_apply_when_the_keys_are_absent(fixture_copy):
    """DSparkConfig's defaults (torchspec/models/draft/dspark.py:55-58): vanilla, confidence head on, with Markov."""
    folder = fixture_copy("torchspec-dspark")
    cfg = json.loads((folder / "config.json").read_text())
    for key in ("markov_head_type", "enable_confidence_head", "confidence_head_with_markov"):
        del cfg[key]
    (folder / "config.json").write_text(json.dumps(cfg))
    s = open_draft(folder).spec
    assert (s.markov_head_type, s.confidence_head, s.confidence_head_with_markov) == ("vanilla", True, True)


def test_inspect_json():
    res = CliRunner().invoke(main, ["inspect", str(PLAIN), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["layout"] == "torchspec" and info["block_size"] == 7


def test_validate_against_the_target(toy_target):
    report = validate(PLAIN, toy_target)
    assert not report.errors, [f.code for f in report.findings]
    assert not report.findings, [f.code for f in report.findings]  # anchor-first: vLLM's native default (DSH106 off)
    res = CliRunner().invoke(main, ["validate", str(PLAIN), "--target", str(toy_target)])
    assert res.exit_code == 0, res.output


def test_the_pruned_export_converts_as_the_full_vocab_drafter_it_was_trained_as(converted_all, toy_target):
    """vLLM 0.32 (qwen3_dspark.py) wants lm_head and markov_w2 with draft_vocab_size rows for a reduced vocab, and
    the pruned export has no lm_head and a markov_w2 over the full vocab; SGLang 0.5.23 never reads d2t. The subset
    is dropped, so both exports convert to the same bytes (the same trained weights)."""
    assert validate(PRUNED, toy_target).errors == []
    plain, pruned = converted_all[PLAIN], converted_all[PRUNED]
    assert json.loads((plain / "config.json").read_text()) == json.loads((pruned / "config.json").read_text())
    assert (plain / "model.safetensors").read_bytes() == (pruned / "model.safetensors").read_bytes()


def test_convert_writes_what_both_engines_read_and_tensors_come_back_bit_identical(converted, toy_target):
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["target_layer_ids"]) == (7, 4, [1, 2])
    assert cfg["sample_from_anchor"] is True and cfg["confidence_head_with_markov"] is True
    assert cfg["markov_head_type"] == "vanilla" and cfg["enable_confidence_head"] is True
    assert cfg["dflash_config"] == {"block_size": 7, "mask_token_id": 127, "target_layer_ids": [1, 2],
                                    "num_target_layers": 4}
    assert not {"_torchspec_version", "target_num_hidden_layers", "torch_dtype"} & set(cfg)
    src, out = _tensors(PLAIN), _tensors(converted)
    assert set(src) - set(out) == {"embed_tokens.weight"}  # byte-identical to the target's: shared
    assert set(out) <= set(src)
    for k, v in out.items():  # bytes, not values: a NaN or a -0.0 must come back too
        assert v.dtype == src[k].dtype and v.shape == src[k].shape, k
        assert v.contiguous().view(torch.uint8).equal(src[k].contiguous().view(torch.uint8)), k
    assert validate(converted, toy_target).errors == []


@pytest.mark.slow
@pytest.mark.vllm
def test_converted_torchspec_export_passes_vllm_check(converted, toy_target):
    from conftest import vllm_check

    report = vllm_check(converted, toy_target)
    assert report.ok, report.to_dict()
    assert report.stage("config").details["architectures"] == ["Qwen3DSparkModel"]


@pytest.mark.slow
@pytest.mark.sglang
def test_converted_torchspec_export_passes_sglang_check(converted, toy_target):
    from dsparkhub.verify.sglang.checks import check_with_sglang, find_sglang_python

    if find_sglang_python() is None:
        reason = ".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`"
        if _ci():
            pytest.fail(f"CI must run the SGLang checks, but {reason}")
        pytest.skip(reason)
    report = check_with_sglang(converted, toy_target)
    assert report.ok, report.to_dict()
    cfg = report.stage("config").details
    assert cfg["model_class"] == "sglang.srt.models.dspark.Qwen3DSparkModel"
    assert (cfg["gamma"], cfg["speculative_num_draft_tokens"]) == (7, 8)
    assert cfg["target_layer_ids"] == [1, 2]
    lw = report.stage("load_weights").details
    assert lw["missing"] == [] and lw["dropped_silently"] == [] and lw["mismatched"] == []
    assert lw["confidence_head_loaded"] is True
    assert lw["compared_bit_exact"] == lw["checkpoint_tensors"]


def test_convert_draft_vocab_re_applies_a_subset_from_the_full_vocab_rows(toy_target, tmp_path):
    """What vLLM 0.32 needs for a reduced vocab, built from the full-vocab rows TorchSpec ships: lm_head rows of the
    target, markov_w2 rows of the drafter, d2t (speculators' offsets, as TorchSpec's own)."""
    ids = tmp_path / "ids.jsonl"
    ids.write_text("".join(json.dumps({"prompt_token_ids": list(range(0, 128, 3))}) + "\n" for _ in range(2)))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["convert", str(PRUNED), "--target", str(toy_target), "--out", str(out),
                                    "--draft-vocab", "16", "--draft-vocab-from", str(ids)])
    assert res.exit_code == 0, res.output
    t, src = _tensors(out), _tensors(PRUNED)
    with safe_open(str(toy_target / "model.safetensors"), "pt") as f:
        target_head = f.get_tensor("lm_head.weight")
    kept = t["d2t"] + torch.arange(16)
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 16
    assert t["markov_head.markov_w2.weight"].equal(src["markov_head.markov_w2.weight"][kept])
    assert t["lm_head.weight"].equal(target_head[kept])
    assert validate(out, toy_target).errors == []
