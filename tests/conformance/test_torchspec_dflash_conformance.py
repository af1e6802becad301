"""TorchSpec's DFlash export, as TorchSpec's own code writes it (deepinfra/TorchSpec 30189db: ``DFlashDraftModel``
then ``tools/convert_to_hf.py``'s writer; ``generators/make_torchspec_eagle3_fixtures.py`` re-makes it): detected as
``torchspec-dflash`` (not z-lab's layout, whose architecture name it shares), read 1 + N with the target's layer
count, converted to the vllm layout and checked by vLLM 0.32's and SGLang 0.5.23's own classes (markers ``vllm`` /
``sglang``).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from dsparkhub.convert import convert
from dsparkhub.layouts.reading import open_draft
from dsparkhub.validate import validate

from .conftest import FIXTURES

SRC = FIXTURES / "torchspec-dflash"


def _tensors(folder) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, toy_target):
    out = tmp_path_factory.mktemp("torchspec-dflash") / "dflash"
    convert(SRC, out, toy_target)
    return out


def test_fixture_is_torchspec_made():
    up = json.loads((SRC / "UPSTREAM.json").read_text())
    assert (up["repository"], up["commit"]) == ("deepinfra/TorchSpec", "30189db21e1b58f08bac4c6e7397f0344c2d6dd6")
    cfg = json.loads((SRC / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["_torchspec_version"] == "0.1.0"
    assert "dflash_config" not in cfg and "block_size" not in cfg and cfg["num_target_layers"] == 2


def test_detected_as_torchspec_dflash_not_zlab():
    d = open_draft(SRC)
    s = d.spec
    assert d.recipe.name == "torchspec-dflash"
    # torchspec/models/dflash.py:357-375: slot k predicts anchor + k, the anchor slot is not trained
    assert (s.variant, s.family, s.block_layout, s.block_size) == ("dflash", "qwen3", "one_plus_n", 16)
    assert any("block size 16 assumed" in n for n in s.notes)
    assert (s.target_layer_ids, s.num_target_layers, s.mask_token_id) == ([1, 2], 4, 127)


def test_converts_bit_identically_and_validates(converted, toy_target):
    assert validate(SRC, toy_target).findings == []
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 16
    assert cfg["num_target_layers"] == 4 and cfg["dflash_config"]["target_layer_ids"] == [1, 2]
    assert "_torchspec_version" not in cfg
    # DFlashConfig.model_type "dflash" is unknown to transformers (vLLM 0.32 fails at config time): read as qwen3
    assert json.loads((SRC / "config.json").read_text())["model_type"] == "dflash" and cfg["model_type"] == "qwen3"
    src, out = _tensors(SRC), _tensors(converted)
    assert set(src) - set(out) == {"embed_tokens.weight"}
    for k, v in out.items():
        assert v.contiguous().view(torch.uint8).equal(src[k].contiguous().view(torch.uint8)), k
    assert validate(converted, toy_target).errors == []


@pytest.mark.slow
@pytest.mark.vllm
def test_converted_torchspec_dflash_passes_vllm_check(converted, toy_target):
    from conftest import vllm_check

    report = vllm_check(converted, toy_target)
    assert report.ok, report.to_dict()


@pytest.mark.slow
@pytest.mark.sglang
def test_converted_torchspec_dflash_passes_sglang_check(converted, toy_target):
    import os

    from dsparkhub.verify.sglang.checks import check_with_sglang, find_sglang_python

    if find_sglang_python() is None:
        reason = ".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the SGLang checks, but {reason}")
        pytest.skip(reason)
    report = check_with_sglang(converted, toy_target)
    assert report.ok, report.to_dict()
    lw = report.stage("load_weights").details
    assert lw["missing"] == [] and lw["dropped_silently"] == [] and lw["mismatched"] == []
    assert lw["compared_bit_exact"] == lw["checkpoint_tensors"]
