"""dsparkhub.verify.spec_options: --adaptive-verification (arms kept apart, the admitted-drafts note, refusals off
the GPU path), --speculative-option (a lossy rejection method refused for a lossless check) and
--lossless-at-block-size (n = the drafter's block size added to the sweep). The GPU-only parts run against fakes:
the engine request vLLM would get, and a stand-in run_verify."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.testing.factories import make_qwen3_target, make_speculators_drafter
from dsparkhub.verify import runner
from dsparkhub.verify.settings import VerifySettings
from dsparkhub.verify import spec_options as so
from dsparkhub.verify.vllm.offline import VllmBackend
from test_verify_cli import FakeBackend, no_validate


def make_drafter(path, confidence=False):
    """A real speculators DSpark drafter (block size 3), with or without a confidence head (testing factories)."""
    target = make_qwen3_target(path.parent / f".{path.name}-target")
    return make_speculators_drafter(path, target, confidence=confidence, block_size=3)


@pytest.fixture
def setup(tmp_path):
    draft = make_drafter(tmp_path / "draft", confidence=True)
    target = tmp_path / "target"
    target.mkdir()
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in [[3, 4, 5], [7, 1]]))
    return draft, target, prompts


# ---- adaptive verification ----------------------------------------------------------------------------------------


def test_arms_and_paths():
    assert so.adaptive_arms("off") == [False] and so.adaptive_arms("on") == [True]
    assert so.adaptive_arms("both") == [False, True]
    assert so.arm_paths("r/res.json", "both") == ["r/res.adaptive-off.json", "r/res.adaptive-on.json"]
    assert so.arm_paths("r/res.json", "on") == ["r/res.json"]
    assert so.arm_config({"x": 1}, False, "both") == {"x": 1, "enable_adaptive_verification": False}
    assert so.arm_config({"x": 1}, False, "off") == {"x": 1}
    with pytest.raises(so.SpecOptionError):
        so.adaptive_arms("auto")


def test_check_adaptive_refusals(setup, tmp_path):
    draft = setup[0]
    so.check_adaptive("off", backend="reference", method="dflash", draft=draft, cuda=False)  # off: never refused
    with pytest.raises(so.SpecOptionError, match="reference engine has no verification cost model"):
        so.check_adaptive("on", backend="reference", method="dspark", draft=draft, cuda=True)
    with pytest.raises(so.SpecOptionError, match="fixed when it started"):
        so.check_adaptive("both", backend="vllm-serve", method="dspark", draft=draft, cuda=True)
    with pytest.raises(so.AdaptiveUnavailableError, match="no CUDA device"):
        so.check_adaptive("on", backend="vllm", method="dspark", draft=draft, cuda=False)
    with pytest.raises(so.AdaptiveUnavailableError, match="dflash drafter"):
        so.check_adaptive("on", backend="vllm", method="dflash", draft=draft, cuda=True)
    headless = make_drafter(tmp_path / "headless")
    with pytest.raises(so.AdaptiveUnavailableError, match="no enable_confidence_head"):
        so.check_adaptive("on", backend="vllm", method="dspark", draft=headless, cuda=True)
    so.check_adaptive("on", backend="vllm", method="dspark", draft=draft, cuda=True)  # the GPU path passes


def test_adaptive_key_reaches_vllm_speculative_config(tmp_path):
    # the engine request the vLLM child turns into LLM(speculative_config=...): the exact 0.32 key
    backend = runner.make_backend("vllm", target="org/target", draft=str(tmp_path), method="dspark",
                                  speculative_config={"enable_adaptive_verification": True})
    spec = backend.engine_request(7)["engine_args"]["speculative_config"]
    assert spec == {"method": "dspark", "num_speculative_tokens": 7, "model": str(tmp_path),
                    "enable_adaptive_verification": True}
    assert "speculative_config" not in backend.engine_request(None)["engine_args"]  # the baseline has none
    assert VllmBackend("org/target", method="dspark").engine_request(3)["engine_args"]["speculative_config"] == \
        {"method": "dspark", "num_speculative_tokens": 3}


def test_run_verify_arms_keeps_arms_apart(setup, tmp_path):
    draft, target, prompts = setup
    seen = []

    class FakeVllm(FakeBackend):  # the vLLM backend's name, the fake's counters
        name = "vllm"

    def fake_run(**kw):  # stands in for run_verify on a GPU node: the real one with a fake engine
        seen.append((kw["out"], kw["spec_options"]))
        return runner.run_verify(backend=FakeVllm(), validate_fn=no_validate, progress=False,
                                 **{k: v for k, v in kw.items() if k != "backend"})

    out = tmp_path / "res.json"
    arms = so.run_verify_arms(fake_run, mode="both", out=out, cuda=True, draft=str(draft), target=str(target),
                              backend="vllm", settings=VerifySettings(num_speculative_tokens=[2, 3],
                                                                      datasets=[str(prompts)], max_new_tokens=4))
    assert [p for p, _ in arms] == [str(tmp_path / "res.adaptive-off.json"), str(tmp_path / "res.adaptive-on.json")]
    assert [o.speculative_config for _, o in seen] == [{"enable_adaptive_verification": False},
                                                       {"enable_adaptive_verification": True}]
    off, on = arms[0][1], arms[1][1]
    assert not any("admitted drafts only" in w for w in off.warnings)
    assert any("admitted drafts only" in w for w in on.warnings)
    assert (tmp_path / "res.adaptive-on.json").is_file() and not out.exists()


def test_cli_adaptive_refused_for_reference_engine(setup):
    draft, target, prompts = setup
    r = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--datasets", str(prompts),
                                  "--adaptive-verification", "on"])
    assert r.exit_code == 2 and "needs --backend vllm" in r.output and "Traceback" not in r.output


def test_cli_adaptive_refused_without_cuda(setup, monkeypatch):
    draft, target, prompts = setup
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    r = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--datasets", str(prompts),
                                  "--backend", "vllm", "--adaptive-verification", "both"])
    assert r.exit_code == 1 and "V2 GPU model runner" in r.output and "Traceback" not in r.output


# ---- lossy rejection and n = block size ----------------------------------------------------------------------------


def test_parse_speculative_options():
    assert so.parse_speculative_options(["rejection_sample_method=block", "x=3", "y=true"]) == \
        {"rejection_sample_method": "block", "x": 3, "y": True}
    for bad in (["novalue"], ["=3"], ["a=1", "a=2"], ["enable_adaptive_verification=true"]):
        with pytest.raises(so.SpecOptionError):
            so.parse_speculative_options(bad)


@pytest.mark.parametrize("method", ["fly", "synthetic"])
def test_lossy_rejection_refused_for_lossless_check(method):
    with pytest.raises(so.SpecOptionError, match="is lossy"):
        so.refuse_lossy_rejection({"rejection_sample_method": method}, 0.0)
    so.refuse_lossy_rejection({"rejection_sample_method": method}, 0.7)  # sampled: no lossless check, allowed
    so.refuse_lossy_rejection({"rejection_sample_method": "block"}, 0.0)  # block verification is lossless


def test_cli_lossy_rejection_is_one_paragraph(setup):
    draft, target, prompts = setup
    r = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--datasets", str(prompts),
                                  "--backend", "vllm", "--speculative-option", "rejection_sample_method=fly"])
    assert r.exit_code == 2 and "rejection_sample_method='fly' is lossy" in r.output
    assert "Traceback" not in r.output


def test_speculative_option_refused_for_other_backends(setup, tmp_path):
    draft, target, prompts = setup
    with pytest.raises(so.SpecOptionError, match="--backend vllm only"):
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)]), backend="reference", progress=False,
                          validate_fn=no_validate, out=tmp_path / "r.json",
                          spec_options=so.SpecOptions(speculative_config={"rejection_sample_method": "block"}))


def test_lossless_at_block_size_adds_n(setup, tmp_path):
    draft, target, prompts = setup  # block_size 3
    fake = FakeBackend()
    res = runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[2], datasets=[str(prompts)],
                                                          max_new_tokens=4),
                            backend=fake, progress=False, validate_fn=no_validate,
                            spec_options=so.SpecOptions(lossless_at_block_size=True))
    assert res.settings.num_speculative_tokens == [2, 3] and res.datasets[0].run(3).lossless is True
    assert any("block size 3" in w and "sglang#32038" in w for w in res.warnings)
    assert so.with_block_size([3], draft, 0.0) == ([3], None)  # already measured
    assert so.with_block_size([2], draft, 0.5) == ([2], None)  # sampled: no lossless check
    assert so.block_size_of(tmp_path) is None
