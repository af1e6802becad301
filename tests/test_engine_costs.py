"""Step costs from the serving engines themselves (issue 26): `vllm bench forward` (vLLM 0.33+, GPU) and SGLang's
`dspark_sps_profiler` (against a running server), driven with stand-ins on CPU; `schedule --sps-from`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.sps_table import FORMAT, check_source, table_problems
from dsparkhub.verify.vllm.bench_forward import (bench_forward, costs_from_forward, forward_cases, forward_command,
                                                 read_forward)

ROOT = Path(__file__).resolve().parents[1]

# ---- vllm bench forward -----------------------------------------------------------------------------------------


def test_cases_are_vllms_request_syntax():
    assert forward_cases([4, 1], [0, 1, 3], 64) == ["r1_kt=1*1@65", "r1_k1=1*2@66:1", "r1_k3=1*4@68:3",
                                                    "r4_kt=4*1@65", "r4_k1=4*2@66:1", "r4_k3=4*4@68:3"]
    with pytest.raises(VerifyError, match="request counts >= 1"):
        forward_cases([0], [1], 64)


def _fake_run(medians: dict[str, dict[str, float]], calls: list, scope_override: str | None = None, rc: int = 0):
    """A `subprocess.run` stand-in for `vllm bench forward`: writes --output-json as vLLM 0.34's main() does."""

    def run(cmd, **kwargs):
        calls.append(cmd)
        if rc:
            return subprocess.CompletedProcess(cmd, rc, "", "Traceback ...\nRuntimeError: no CUDA GPUs are available")
        scope = "target_only" if "--exclude-drafter" in cmd else "target_and_drafter"
        cases = [cmd[i + 1].partition("=")[0] for i, a in enumerate(cmd) if a == "--case"]
        out = [{"case": c, "requests": [], "median_us": medians[scope][c],
                "ranks": [{"timing_scope": scope_override or scope, "latency_us": {"median": medians[scope][c]}}]}
               for c in cases]
        Path(cmd[cmd.index("--output-json") + 1]).write_text(json.dumps(out))
        return subprocess.CompletedProcess(cmd, 0, "[forward] ...", "")

    return run


def _medians():
    plain = {"r1_kt": 100.0, "r2_kt": 120.0}
    verify = {f"r{r}_k{k}": base + 10.0 * k * r for r, base in ((1, 100.0), (2, 120.0)) for k in (1, 2)}
    return {"target_only": {**plain, **verify},
            "target_and_drafter": {**plain, **{name: v + 30.0 for name, v in verify.items()}}}


def test_bench_forward_runs_both_scopes_and_separates_draft_from_verify(tmp_path):
    calls = []
    vllm = tmp_path / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    costs, source = bench_forward(target="Qwen/Qwen3-8B", draft="/d", method="dspark", n=2, requests=[2, 1],
                                  context=64, vllm=vllm, run=_fake_run(_medians(), calls))
    assert [("--exclude-drafter" in c) for c in calls] == [False, True]
    first = calls[0]
    assert first[:3] == [str(vllm), "bench", "forward"] and first[first.index("--kv-len-jitter") + 1] == "0"
    assert json.loads(first[first.index("--speculative-config") + 1]) == {
        "method": "dspark", "model": "/d", "num_speculative_tokens": 2}
    assert costs.median(2, 2) == (pytest.approx(30e-6), pytest.approx(160e-6))  # draft = with - without
    assert costs.median(1, None) == (0.0, pytest.approx(100e-6))
    tokens, sps = costs.sps_probes()
    assert tokens == [2, 3, 4, 6] and sps[0] == pytest.approx(1 / 140e-6)  # 1 request x (1 + 1): 110 + 30 us
    assert "vllm bench forward" in source and "0..2" in source


def test_bench_forward_refuses_a_failed_run_and_a_wrong_scope(tmp_path):
    vllm = tmp_path / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    kwargs = dict(target="t", draft="/d", method="dspark", n=2, requests=[1, 2], context=64, vllm=vllm)
    with pytest.raises(EngineUnavailableError, match="no CUDA GPUs are available") as err:
        bench_forward(**kwargs, run=_fake_run(_medians(), [], rc=1))
    assert "vLLM 0.33+" in err.value.hint
    with pytest.raises(VerifyError, match="case r1_kt was timed as 'target_only', expected 'target_and_drafter'"):
        bench_forward(**kwargs, run=_fake_run(_medians(), [], scope_override="target_only"))
    with pytest.raises(VerifyError, match="did not time case"):
        costs_from_forward({}, {"r1_kt": 1e-4}, requests=[1], widths=[0, 1], context=8)
    bad = tmp_path / "out.json"
    bad.write_text('{"case": 1}')
    with pytest.raises(VerifyError, match="not a list of cases"):
        read_forward(bad, scope="target_only")


@pytest.mark.vllm034
def test_vllm_034_parses_the_command_and_the_cases():
    """vLLM 0.34's own argument parser and case parser read what dsparkhub passes (`vllm bench forward`)."""
    python = ROOT / ".venv-vllm034" / "bin" / "python"
    if not python.is_file():
        pytest.skip(".venv-vllm034 is missing: build it with `bash scripts/setup_vllm034.sh`")
    cmd = forward_command("vllm", target="/t", draft="/d", method="dspark", n=3,
                          cases=forward_cases([1, 8], [0, 3], 96), output_json="/tmp/x.json", exclude_drafter=True,
                          max_model_len=4096)
    code = (
        "import json, sys\n"
        "from vllm.platforms import current_platform\n"  # 0.34 on an x86 CPU infers no device: parsing needs one
        "current_platform.device_type = current_platform.device_type or 'cpu'\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.benchmarks.forward.main import add_cli_args\n"
        "from vllm.benchmarks.forward.shapes import parse_case\n"
        "p = FlexibleArgumentParser(); add_cli_args(p); a = p.parse_args(json.loads(sys.argv[1]))\n"
        "cases = [parse_case(c) for c in a.case]\n"
        "print(json.dumps({'exclude': a.exclude_drafter, 'jitter': a.kv_len_jitter, 'load': a.load_format,\n"
        "  'spec': a.speculative_config, 'cases': [[c.name, len(c.requests), c.requests[0].query_len,\n"
        "  c.requests[0].kv_len, c.requests[0].num_draft_tokens, c.requests[0].is_decode] for c in cases]}))\n")
    res = subprocess.run([str(python), "-c", code, json.dumps(cmd[3:])], capture_output=True, text=True, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["exclude"] is True and got["jitter"] == 0.0 and got["load"] == "auto"
    assert got["spec"]["num_speculative_tokens"] == 3
    assert got["cases"] == [["r1_kt", 1, 1, 97, 0, True], ["r1_k3", 1, 4, 100, 3, True],
                            ["r8_kt", 8, 1, 97, 0, True], ["r8_k3", 8, 4, 100, 3, True]]


# ---- SGLang's dspark_sps_profiler ---------------------------------------------------------------------------------


def _profiler(table: dict, calls: list, rc: int = 0):
    def run(cmd, **kwargs):
        calls.append(cmd)
        if rc:
            return subprocess.CompletedProcess(cmd, rc, "", "requests.exceptions.ConnectionError: refused")
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text(json.dumps(table))
        out.with_name(out.name + ".manifest.json").write_text(json.dumps({"tp_size": 8, "dp_size": 1}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_sglang_profiler_is_driven_and_its_table_labelled(tmp_path, monkeypatch):
    from dsparkhub.verify import sps_table
    from dsparkhub.verify.sglang import sps_profiler

    calls = []
    table = {"sample_batch_tokens": [8, 64], "sample_steps_per_sec": [90.0, 40.0], "max_batch_tokens": 64}
    data, source = sps_profiler.profile_sps(base_url="http://127.0.0.1:30000/", batch_sizes=[16, 1, 4],
                                            python="/py", run=_profiler(table, calls))
    (cmd,) = calls
    assert cmd[:4] == ["/py", "-m", "sglang.benchmark.dspark_sps_profiler", "all"]
    assert cmd[cmd.index("--base-url") + 1] == "http://127.0.0.1:30000" and "--no-plot" in cmd
    assert cmd[cmd.index("--batch-size") + 1:cmd.index("--batch-size") + 4] == ["1", "4", "16"]
    assert data == table and "tp_size 8" in source and "http://127.0.0.1:30000" in source
    with pytest.raises(EngineUnavailableError, match="exited with 1") as err:
        sps_profiler.profile_sps(base_url="http://x:1", python="/py", run=_profiler(table, [], rc=1))
    assert "never starts one" in err.value.hint
    # schedule --sps-from sglang=URL: SGLang's keys unchanged, dsparkhub's labels added, its reader's rules checked
    got = {}

    def fake(**kwargs):
        got.update(kwargs)
        return dict(got.pop("table")), "the source"

    monkeypatch.setattr(sps_profiler, "profile_sps", lambda **kw: fake(table=table, **kw))
    labelled = sps_table.engine_table("sglang=http://h:1", draft="/d", target="t", n=7, requests=[1, 4], context=9)
    assert got == {"base_url": "http://h:1", "batch_sizes": [1, 4]}
    assert {k: labelled[k] for k in table} == table and table_problems(labelled) == []
    assert (labelled["format"], labelled["engine"], labelled["source"]) == (FORMAT, "sglang (dspark_sps_profiler)",
                                                                            "the source")
    monkeypatch.setattr(sps_profiler, "profile_sps", lambda **kw: fake(table={**table, "max_batch_tokens": 2}, **kw))
    with pytest.raises(VerifyError, match="its reader would refuse"):
        sps_table.engine_table("sglang=http://h:1", draft="/d", target="t", n=7, requests=[1], context=9)


def test_an_unknown_sps_source_is_refused_before_any_model_loads(tiny_models, tmp_path):
    for ok in ("reference", "vllm-forward", "sglang=http://127.0.0.1:30000"):
        check_source(ok)
    root, _ = tiny_models
    res = CliRunner().invoke(main, ["schedule", str(root / "dspark_run"), "--target", str(root / "target"),
                                    "--sps-from", "sglang=localhost:30000", "--sps-out", str(tmp_path / "t.json")])
    assert res.exit_code == 1 and "sglang=http://HOST:PORT" in res.output, res.output
    assert not (tmp_path / "t.json").exists()


def test_vllm_forward_costs_make_the_sps_table(monkeypatch, tiny_models):
    from dsparkhub.verify import sps_table
    from dsparkhub.verify.vllm import bench_forward as bf

    root, _ = tiny_models
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        seconds = {scope: {k: v / 1e6 for k, v in got.items()} for scope, got in _medians().items()}
        return costs_from_forward(seconds["target_and_drafter"], seconds["target_only"], requests=[1, 2],
                                  widths=[0, 1, 2], context=kwargs["context"]), "vllm bench forward: test"

    monkeypatch.setattr(bf, "bench_forward", fake)
    table = sps_table.engine_table("vllm-forward", draft=root / "dspark_run", target="t", n=2, requests=[1, 2],
                                   context=40)
    assert seen == {"target": "t", "draft": str(root / "dspark_run"), "method": "dspark", "n": 2,
                    "requests": [1, 2], "context": 40}
    assert table["sample_batch_tokens"] == [2, 3, 4, 6] and table["engine"] == "vllm (bench forward)"
    assert table["sample_steps_per_sec"][0] == pytest.approx(1 / 140e-6) and table_problems(table) == []
