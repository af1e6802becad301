"""`verify --backend sglang-serve` against a fake SGLang server on 127.0.0.1 that speaks SGLang 0.5.23's native
/generate (token ids in, output_ids + per-request speculative counters in meta_info) and /metrics (the
sglang:spec_accept_length / sglang:spec_accept_rate gauges)."""

from __future__ import annotations

import json

import pytest

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify import runner
from dsparkhub.verify.sglang.backend import SglangServerBackend, sglang_gauges

from conftest import FakeHTTPServer


class _FakeSglang(FakeHTTPServer):
    """A stand-in for `python -m sglang.launch_server`: each request decodes in verify steps of gamma drafts that
    accept `accept` drafts (plus the bonus token), as tokenizer_manager.py:3149-3201 reports them."""

    def __init__(self, gamma: int | None, accept: int = 2, gauge_offset: float = 0.0):
        self.gamma, self.accept, self.gauge_offset = gamma, accept, gauge_offset
        self.last_tau = 0.0
        super().__init__()

    def get(self, path):
        if path == "/metrics":
            return 200, self.metrics(), "text/plain"
        return 404, "{}", "application/json"

    def post(self, path, body):
        if path != "/generate" or not isinstance(body.get("input_ids"), list):
            return 400, json.dumps({"error": "bad request"}), "application/json"
        n_out = body["sampling_params"]["max_new_tokens"]
        ids = [(sum(body["input_ids"]) + i) % 50 for i in range(n_out)]
        meta = {"completion_tokens": n_out}
        if self.gamma:
            steps = -(-n_out // (self.accept + 1))
            hist = [0] * (self.accept + 1)
            hist[self.accept] = steps
            meta.update(spec_verify_ct=steps, spec_num_proposed_drafts=steps * self.gamma,
                        spec_num_correct_drafts=steps * self.accept, spec_correct_drafts_histogram=hist,
                        spec_accept_length=n_out / steps)
            self.last_tau = n_out / steps
        return 200, json.dumps({"text": "", "output_ids": ids, "meta_info": meta}), "application/json"

    def metrics(self) -> str:
        lab = 'model_name="tiny-target",engine_type="unified",tp_rank="0"'
        lines = ["# HELP sglang:spec_accept_length Mean acceptance length", "# TYPE sglang:spec_accept_length gauge",
                 f"sglang:spec_accept_length{{{lab}}} {self.last_tau + self.gauge_offset if self.gamma else 0.0}",
                 f"sglang:spec_accept_rate{{{lab}}} {self.accept / self.gamma if self.gamma else 0.0}",
                 f"sglang:num_running_reqs{{{lab}}} 0.0"]
        return "\n".join(lines) + "\n"



@pytest.fixture
def servers():
    spec, base = _FakeSglang(gamma=5, accept=2), _FakeSglang(gamma=None)
    yield spec, base
    spec.close()
    base.close()


def test_sglang_serve_measures_outputs_and_acceptance(servers):
    spec, base = servers
    backend = SglangServerBackend(spec.url + "/", baseline_url=base.url, ignore_eos=True, tau_tolerance=0.01)
    prompts = [[1, 2, 3], [4, 5]]
    s = backend.run(prompts, num_speculative_tokens=5, max_new_tokens=6)
    b = backend.run(prompts, num_speculative_tokens=None, max_new_tokens=6)
    assert s.outputs == b.outputs == [[(6 + i) % 50 for i in range(6)], [(9 + i) % 50 for i in range(6)]]
    # 6 tokens = 2 verify steps of (2 accepted + bonus) per prompt
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (4, 20, 8)
    assert s.accepted_per_pos == [4, 4, 0, 0, 0] and s.tau == 3.0
    assert b.num_drafts == 0 and b.accepted_per_pos == [] and s.wall_s > 0 and b.wall_s > 0
    assert backend.last_metrics == {"sglang:spec_accept_length": 0.0, "sglang:spec_accept_rate": 0.0}
    assert spec.requests[0] == {"input_ids": [1, 2, 3], "stream": False,
                                "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True,
                                                    "sampling_seed": 0}}


def test_sglang_serve_reads_the_metrics_gauges_and_cross_checks_them(servers):
    spec, base = servers
    backend = SglangServerBackend(spec.url, baseline_url=base.url, tau_tolerance=0.01)
    backend.run([[1, 2, 3]], num_speculative_tokens=5, max_new_tokens=6)
    assert backend.last_metrics == {"sglang:spec_accept_length": 3.0, "sglang:spec_accept_rate": 0.4}
    spec.gauge_offset = 0.5
    with pytest.raises(VerifyError, match="spec_accept_length is 3.500 but the per-request counters give 3.000"):
        backend.run([[1, 2, 3]], num_speculative_tokens=5, max_new_tokens=6)


def test_sglang_serve_refuses_what_does_not_match(servers):
    spec, base = servers
    backend = SglangServerBackend(spec.url, baseline_url=base.url)
    with pytest.raises(VerifyError, match="proposes 5 draft tokens per verify step but num_speculative_tokens=3"):
        backend.run([[1]], num_speculative_tokens=3, max_new_tokens=4)
    with pytest.raises(VerifyError, match="runs without a drafter"):
        SglangServerBackend(base.url).run([[1]], num_speculative_tokens=5, max_new_tokens=4)
    with pytest.raises(VerifyError, match="it runs a drafter"):
        SglangServerBackend(base.url, baseline_url=spec.url).run([[1]], num_speculative_tokens=None,
                                                                 max_new_tokens=4)
    with pytest.raises(EngineUnavailableError, match="no baseline server"):
        SglangServerBackend(spec.url).run([[1]], num_speculative_tokens=None, max_new_tokens=4)
    gone = _FakeSglang(gamma=5)
    gone.close()
    with pytest.raises(EngineUnavailableError, match="Cannot reach the SGLang server"):
        SglangServerBackend(gone.url, timeout_s=2).run([[1]], num_speculative_tokens=5, max_new_tokens=4)


def test_sglang_gauges_parse_the_prometheus_page():
    page = ('# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name="m"} 2.75\n'
            'sglang:spec_accept_rate 0.35\nsglang:spec_accept_lengthx 9\n')
    assert sglang_gauges(page) == {"sglang:spec_accept_length": 2.75, "sglang:spec_accept_rate": 0.35}


def test_make_backend_builds_sglang_serve_and_checks_its_options():
    s = runner.make_backend("sglang-serve", target="t", draft="d", method="dspark", server_url="http://h:1/",
                            baseline_url="http://h:2")
    assert (s.name, s.base_url, s.baseline_url) == ("sglang-serve", "http://h:1", "http://h:2")
    with pytest.raises(runner.EngineOptionError, match="sglang-serve needs --server-url"):
        runner.make_backend("sglang-serve", target="t", draft="d", method="dspark")
    with pytest.raises(runner.EngineOptionError, match="--device is for the reference engine"):
        runner.make_backend("sglang-serve", target="t", draft="d", method="dspark", device="cpu",
                            server_url="http://h:1")
