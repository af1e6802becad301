"""``convert --to eagle3-hf``: the EAGLE-3 HF layout SGLang 0.5.23 loads (``LlamaForCausalLMEagle3``, model_type
``llama``, ``eagle_config``; what TorchSpec's ``tools/convert_to_hf.py`` writes, without ``_torchspec_version``),
written from every EAGLE-3 layout dsparkhub reads: TorchSpec's export (plain, and ``--prune-vocab`` with its head
re-trimmed right, since the export's own is refused: DSH208) and speculators' ``Eagle3Speculator``.

What SGLang reads is in ``converters/eagle3-hf.yaml`` with file:line; the two rules its loader imposes: an absent
``draft_vocab_size`` makes it take ``lm_head`` from the target (so it is always written and ``lm_head`` always
kept), and its layer has no ``norm_before_residual`` (the residual is taken before ``hidden_norm``), so a drafter
trained with it true is refused rather than silently changed.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsparkhub.convert import convert
from dsparkhub.errors import ConversionRefusedError
from dsparkhub.layouts.reading import open_draft

from .conftest import FIXTURES, need_sglang

SPECULATORS = FIXTURES / "speculators-eagle3"
TORCHSPEC = FIXTURES / "torchspec-eagle3"


def _tensors(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


def _rewrite_tensors(folder, edit) -> None:
    """Rewrite ``folder``'s model.safetensors with ``edit(tensors)`` applied (a test's private copy only)."""
    t = _tensors(folder / "model.safetensors")
    edit(t)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{name: source folder}: the TorchSpec export, its pruned export with rows k + d2t[k], and the speculators
    fixture as trained with speculators' default norm_before_residual=false (the fixture itself has true)."""
    root = tmp_path_factory.mktemp("eagle3-sources")
    spec = shutil.copytree(SPECULATORS, root / "speculators-eagle3")
    cfg = json.loads((SPECULATORS / "config.json").read_text())
    (spec / "config.json").write_text(json.dumps({**cfg, "norm_before_residual": False}))
    pruned = shutil.copytree(FIXTURES / "torchspec-eagle3-pruned", root / "torchspec-eagle3-pruned")
    full_head = _tensors(TORCHSPEC / "model.safetensors")["lm_head.weight"]

    def right_rows(t):
        t["lm_head.weight"] = full_head[torch.arange(64) + t["d2t"]].contiguous()

    _rewrite_tensors(pruned, right_rows)
    return {"torchspec": TORCHSPEC, "torchspec-pruned": pruned, "speculators": spec}


@pytest.fixture(scope="module")
def written(sources, toy_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3-hf")
    for name, src in sources.items():
        convert(src, root / name, toy_target, to="eagle3-hf")
    return {name: root / name for name in sources}


def test_the_torchspec_export_is_written_as_its_own_layout_less_the_torchspec_keys(written):
    out = written["torchspec"]
    cfg, src_cfg = (json.loads((f / "config.json").read_text()) for f in (out, TORCHSPEC))
    assert (cfg["architectures"], cfg["model_type"]) == (["LlamaForCausalLMEagle3"], "llama")
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}  # layer indices, as SGLang's
    assert (cfg["draft_vocab_size"], cfg["tie_word_embeddings"], cfg["norm_output"]) == (128, False, False)
    assert not {"_torchspec_version", "torch_dtype", "target_hidden_size"} & set(cfg)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "rms_norm_eps", "rope_theta", "num_hidden_layers"):
        assert cfg[key] == src_cfg[key], key
    src, got = _tensors(TORCHSPEC / "model.safetensors"), _tensors(out / "model.safetensors")
    assert set(src) - set(got) == {"embed_tokens.weight"}  # the target's bytes: SGLang sets the target's embed
    assert all(_same(v, src[k]) for k, v in got.items())
    d = open_draft(out)
    assert (d.recipe.name, d.spec.variant, d.spec.block_size, d.spec.target_layer_ids) == (
        "eagle3-hf", "eagle3", 7, [0, 1, 2])


def test_the_speculators_drafter_keeps_its_norms_steps_and_layer_numbering(written):
    out = written["speculators"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # speculators wrote [1, 2, 3]
    assert (cfg["norm_before_fc"], cfg["fc_norm"], cfg["norm_output"], cfg["ttt_length"]) == (True, False, True, 3)
    assert "norm_before_residual" not in cfg and "speculators_config" not in cfg
    got = _tensors(out / "model.safetensors")
    assert "input_norm.weight" in got and "lm_head.weight" in got and "t2d" not in got
    assert open_draft(out).spec.block_size == 3


def test_the_pruned_drafter_carries_d2t_and_its_draft_vocab(sources, written):
    out = written["torchspec-pruned"]
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["draft_vocab_size"], cfg["vocab_size"]) == (64, 128)
    got, src = _tensors(out / "model.safetensors"), _tensors(sources["torchspec-pruned"] / "model.safetensors")
    assert list(got["lm_head.weight"].shape) == [64, 32] and got["d2t"].dtype == torch.int64
    assert all(_same(got[k], src[k]) for k in ("d2t", "t2d", "lm_head.weight"))


def test_norm_before_residual_true_is_refused_naming_the_key(toy_target, tmp_path):
    with pytest.raises(ConversionRefusedError, match="norm_before_residual") as exc:
        convert(SPECULATORS, tmp_path / "out", toy_target, to="eagle3-hf")
    assert "speculators-eagle3" in exc.value.hint and not (tmp_path / "out").exists()


def test_lm_head_equal_to_the_targets_is_kept(sources, toy_target, tmp_path):
    """SGLang reads the drafter's own lm_head whenever draft_vocab_size is set; the speculators layout drops it."""
    src = shutil.copytree(sources["speculators"], tmp_path / "src")
    target_head = _tensors(toy_target / "model.safetensors")["lm_head.weight"]

    def targets_head(t):
        t["lm_head.weight"] = target_head.to(t["lm_head.weight"].dtype)

    _rewrite_tensors(src, targets_head)
    convert(src, tmp_path / "hf", toy_target, to="eagle3-hf")
    convert(src, tmp_path / "spec", toy_target, to="speculators-eagle3", base_model="toy/toy-qwen3-target")
    assert "lm_head.weight" in _tensors(tmp_path / "hf" / "model.safetensors")
    assert "lm_head.weight" not in _tensors(tmp_path / "spec" / "model.safetensors")


def test_a_drafter_without_its_own_lm_head_is_refused(sources, toy_target, tmp_path):
    """SGLang takes lm_head from the target only when draft_vocab_size is absent, which eagle3-hf never writes."""
    src = shutil.copytree(sources["speculators"], tmp_path / "src")
    _rewrite_tensors(src, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ConversionRefusedError, match="reads lm_head.weight from the drafter itself"):
        convert(src, tmp_path / "out", toy_target, to="eagle3-hf")
    assert not (tmp_path / "out").exists()


def test_back_to_speculators_states_norm_before_residual_false(written, toy_target, tmp_path):
    """vLLM's speculators reader defaults norm_before_residual to true: the way back writes SGLang's false."""
    convert(written["speculators"], tmp_path / "back", toy_target, to="speculators-eagle3",
            base_model="toy/toy-qwen3-target")
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg["norm_before_residual"] is False and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.parametrize("name", ["speculators", "torchspec-pruned"])
def test_sglang_loads_the_written_layout(written, toy_target, name):
    from dsparkhub.verify.sglang.checks import check_with_sglang

    need_sglang()
    report = check_with_sglang(written[name], toy_target)
    lw = report.stage("load_weights").details
    assert report.algorithm == "EAGLE3" and report.ok, report.to_dict()
    assert lw["missing"] == [] and lw["dropped_silently"] == [] and lw["mismatched"] == []
    # every tensor but d2t / t2d (read as SGLang's hot-token map) landed bit-exact
    assert lw["compared_bit_exact"] == lw["checkpoint_tensors"] - (2 if name == "torchspec-pruned" else 0)
