"""pipeline.quickstart: the steps run in order, hand typed values on, stop after a failed validation; the CLI prints
each step's header and result (library steps replaced by fakes: the real flow is the slow example build)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

import dsparkhub.pipeline as pipeline
from dsparkhub.cli import main


def _fakes(monkeypatch, tmp_path, *, ok=True):
    calls = []
    ex = SimpleNamespace(target=tmp_path / "target", deepspec_run=tmp_path / "run", prompts=tmp_path / "p.jsonl")
    spec = SimpleNamespace(summary=lambda: {})
    monkeypatch.setattr(pipeline, "build_example", lambda: calls.append("build") or ex)
    monkeypatch.setattr(pipeline, "open_draft", lambda p: calls.append(("open", p)) or SimpleNamespace(
        checkpoint=SimpleNamespace(path=p, files=[]), recipe=SimpleNamespace(title="DeepSpec"), spec=spec))
    monkeypatch.setattr(pipeline, "convert", lambda src, out, t, overwrite: calls.append(("convert", out)) or
                        SimpleNamespace(out=out, plan="PLAN"))
    report = SimpleNamespace(ok=ok, draft="d", layout="vllm", errors=[], warnings=[], findings=[])
    monkeypatch.setattr(pipeline, "validate_reusing", lambda d, t, record, num_speculative_tokens: (calls.append(
        ("validate", num_speculative_tokens)) or report, record))
    monkeypatch.setattr(pipeline, "run_verify", lambda d, t, settings=None, **kw: calls.append(("verify", kw["out"])) or "RESULTS")
    monkeypatch.setattr(pipeline, "write_card", lambda d, paths, **kw: calls.append(("card", kw["repo_id"])) or
                        SimpleNamespace(readme=d / "README.md", plots=[]))
    monkeypatch.setattr(pipeline, "push", lambda d, repo, **kw: calls.append(("push", repo, kw.get("dry_run"))) or
                        "PUSHED")
    return calls


def test_steps_run_in_order_and_hand_values_on(monkeypatch, tmp_path):
    calls = _fakes(monkeypatch, tmp_path)
    seen = []
    q = pipeline.quickstart(tmp_path / "out", repo_id="alice/x", starting=lambda s: seen.append(s),
                            finished=lambda s, state: seen.append(f"/{s}"))
    assert seen == [x for s in pipeline.QUICKSTART_STEPS for x in (s, f"/{s}")]
    drafter = tmp_path / "out" / pipeline.QUICKSTART_DRAFTER
    assert calls == ["build", ("open", tmp_path / "run"), ("convert", drafter), ("validate", 7),
                     ("verify", tmp_path / "out" / "results.json"), ("card", pipeline.QUICKSTART_REPO),
                     ("push", "alice/x", True)]
    assert q.ok and q.push == "PUSHED" and q.results == "RESULTS" and q.drafter == drafter


def test_failed_validation_stops_the_flow_and_the_cli_exits_1(monkeypatch, tmp_path):
    calls = _fakes(monkeypatch, tmp_path, ok=False)
    q = pipeline.quickstart(tmp_path / "out", repo_id="alice/x")
    assert not q.ok and calls[-1] == ("validate", 7)
    for name in ("print_spec", "print_plan", "print_report"):  # the fakes carry no real spec / plan / findings
        monkeypatch.setattr(f"dsparkhub.cli.release.{name}", lambda *a: None)
    res = CliRunner().invoke(main, ["quickstart", str(tmp_path / "out2"), "--repo", "alice/x"])
    assert res.exit_code == 1
    headers = [line for line in res.output.splitlines() if line.startswith("== ")]
    assert [h.split()[1] for h in headers] == ["1/7", "2/7", "3/7", "4/7"]
    assert Path(tmp_path / "out2").is_dir()


def test_the_cli_prints_the_local_push_plan_before_the_upload(monkeypatch, tmp_path):
    """Issue 29 item 8: the quickstart's push prints its plan before anything is uploaded (as `dsparkhub push`)."""
    _fakes(monkeypatch, tmp_path)
    order = []

    def push(d, repo, **kw):  # the real push calls on_plan once the plan is final, then uploads
        kw["on_plan"]("PLANNED")
        order.append("upload")
        return "PUSHED"

    monkeypatch.setattr(pipeline, "push", push)
    for name in ("print_spec", "print_plan", "print_report"):
        monkeypatch.setattr(f"dsparkhub.cli.release.{name}", lambda *a, **k: "")
    monkeypatch.setattr("dsparkhub.verify.results.table.format_summary_table", lambda r: "")
    monkeypatch.setattr("dsparkhub.cli.release.print_push_plan", lambda r: order.append(("plan", r)))
    monkeypatch.setattr("dsparkhub.cli.release.print_push", lambda r, plan_shown=False: order.append(
        ("report", r, plan_shown)))
    res = CliRunner().invoke(main, ["quickstart", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert order == [("plan", "PLANNED"), "upload", ("report", "PUSHED", True)]
