"""Issue 29 items 8 and 9: silence and noise, CLI conventions (``--debug`` anywhere, ``hub serve``, verify on the
speculators layout, sglang-check's drafter name, hints that name options, card images, the push plan first, verify's
bars cleared, DSH106 on the shipped example)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner
from test_push import TOKEN, hub, local_hub, make_drafter, validation  # noqa: F401 - fixtures reused

import dsparkhub
import dsparkhub.hub.push as hub_mod
from dsparkhub.cli import main
from dsparkhub.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from dsparkhub.errors import CardError

# ---------------------------------------------------------------------------------------------- --debug anywhere


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_works_before_and_after_the_subcommand(tmp_path, where):
    args = ["inspect", str(tmp_path / "missing")]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == EXIT_FAILED, res.output
    assert "Traceback (most recent call last)" in res.output and "Error (CheckpointNotFoundError)" in res.output


def test_every_command_takes_debug():
    def leaves(group):
        for command in group.commands.values():
            yield from leaves(command) if isinstance(command, click.Group) else [command]

    lacking = [c.name for c in leaves(main) if not any("--debug" in p.opts for p in c.params)]
    assert lacking == []


# ---------------------------------------------------------------------------------------------- hub serve + push


def test_hub_serve_rehearses_a_push_with_what_it_prints(tmp_path, validation, monkeypatch):  # noqa: F811
    from huggingface_hub import constants

    proc = subprocess.Popen([sys.executable, "-m", "dsparkhub.cli", "hub", "serve", "--user", "alice",
                             "--dir", str(tmp_path / "hubdir")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=Path(dsparkhub.__file__).parents[1])
    try:
        lines = []
        while not lines or not lines[-1].startswith("Ctrl-C"):
            line = proc.stdout.readline()
            assert line, f"hub serve ended early: {lines} {proc.stderr.read()}"
            lines.append(line.rstrip("\n"))
        rehearse = next(x for x in lines if x.strip().startswith("rehearse")).split()
        endpoint, token = rehearse[rehearse.index("--endpoint") + 1], rehearse[rehearse.index("--token") + 1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", endpoint) and "HF_HUB_DISABLE_XET=1" in rehearse
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the conftest default; the server is local
        draft = make_drafter(tmp_path / "draft")
        res = CliRunner().invoke(main, ["push", str(draft), "--repo", "alice/tiny", "--endpoint", endpoint,
                                        "--token", token])
        assert res.exit_code == EXIT_OK, res.output
        assert f"commit: {endpoint}/alice/tiny/commit/" in res.output and "remote check: ok" in res.output
    finally:
        proc.send_signal(2)  # Ctrl-C
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == EXIT_OK and "stopped the local Hub" in err


def test_push_prints_its_plan_before_the_upload(hub, tmp_path, monkeypatch):  # noqa: F811
    draft = make_drafter(tmp_path / "draft")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C during the upload: what was being sent is already on screen

    monkeypatch.setattr(hub_mod.HfApi, "create_commit", interrupted)
    res = CliRunner().invoke(main, ["push", str(draft), "--repo", "alice/tiny", "--endpoint", hub.url])
    assert res.exit_code == EXIT_INTERRUPTED, res.output
    assert "Push: alice/tiny@main" in res.output and "model-00001-of-00002.safetensors" in res.output
    assert res.output.index(" added, 0 changed") < res.output.index("interrupted")


def test_push_refuses_a_card_that_links_a_missing_image(tmp_path):
    draft = make_drafter(tmp_path / "draft")
    (draft / "plots").mkdir()
    (draft / "plots" / "acceptance.png").write_bytes(b"\x89PNG")
    (draft / "README.md").write_text("# d\n![ok](./plots/acceptance.png)\n![speedup](plots/speedup.png)\n"
                                     '<img src="tau.png" width=300>\n![web](https://example.org/x.png)\n')
    with pytest.raises(CardError, match=r"links 2 image\(s\) the folder lacks: plots/speedup.png, tau.png"):
        hub_mod.push(draft, "alice/tiny", dry_run=True)


@pytest.mark.parametrize("text, missing", [
    ("![a](a.png)", []),
    ("![a](<./a.png> \"title\")", []),
    ("![b](b%20c.png) ![d](d.png)", ["d.png"]),
    ("![a](a.png?raw=true#x)", []),
    ("![u](https://x/y.png) ![d](data:image/png;base64,AAAA)", []),
    ("![abs](/home/me/plot.png)", ["/home/me/plot.png"]),
    ('<IMG alt=x SRC="sub/p.png">', ["sub/p.png"]),
])
def test_missing_image_links(text, missing):
    from dsparkhub.hub.files import missing_image_links

    assert missing_image_links(text, {"a.png", "b c.png"}) == missing


# ---------------------------------------------------------------------------------------------- sglang-check


def test_sglang_check_without_a_drafter_path_does_not_call_it_none(tmp_path, monkeypatch):
    import dsparkhub.verify.sglang.checks as checks
    from dsparkhub.verify.vllm.checks import StageResult

    report = checks.SglangCheckReport(draft=None, target=str(tmp_path), algorithm="DSPARK", sglang_version="0.5.23",
                                      stages=[StageResult("config", "failed", "ValueError: no drafter", {}, 0.1)])
    monkeypatch.setattr(checks, "check_with_sglang", lambda draft, target, algorithm=None: report)
    res = CliRunner().invoke(main, ["sglang-check", "--target", str(tmp_path)])
    assert res.exit_code == EXIT_FAILED
    first = res.output.splitlines()[0]
    assert not first.startswith("None") and f"SGLang looked for one in {tmp_path}" in first


# ---------------------------------------------------------------------------------------------- verify


def test_the_reference_engine_loads_the_speculators_layout_convert_writes(models, tmp_path):
    from dsparkhub.convert import convert
    from dsparkhub.verify.reference.loading import load_drafter

    target, step = models
    convert(step, tmp_path / "vllm", target, keep_embeddings=True)
    convert(step, tmp_path / "spec", target, to="speculators", keep_embeddings=True, base_model="Qwen/Qwen3-8B")
    a, b = load_drafter(tmp_path / "vllm"), load_drafter(tmp_path / "spec")
    assert a.config == b.config
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_verify_clears_its_progress_bars(capsys):
    from dsparkhub.verify.runner import _run_one
    from dsparkhub.verify.stats import RunStats

    class Backend:
        name = "fake"

        def run(self, prompts, num_speculative_tokens, max_new_tokens, temperature, seed, progress):
            for _ in prompts:
                progress(1)
            return RunStats(outputs=[[1]] * len(prompts), wall_s=0.1)

    for n in (3, 5):
        _run_one(Backend(), [[1], [2]], n=n, max_new_tokens=4, temperature=0.0, seed=0, desc=f"n={n}", progress=True)
    err = capsys.readouterr().err
    assert "n=3" in err  # the bars were shown ...
    assert "\n" not in err and err.rsplit("\r", 1)[-1].strip() == ""  # ... and cleared: no finished line is left


# ---------------------------------------------------------------------------------------------- hints


#: flags of the engines and tools dsparkhub's hints tell users to pass to them (not dsparkhub options)
ENGINE_FLAGS = {"--speculative-config", "--speculative-algorithm", "--speculative-draft-model-path", "--model-path",
                "--model", "--enable-metrics", "--save-result", "--save-detailed",
                "--head", "--address",  # `ray start --head` / `ray start --address` (verify on a Ray cluster)
                "--prune-vocab"}  # TorchSpec tools/convert_to_hf.py (DSH208's hint)


def _hint_texts():
    def text(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if isinstance(node, ast.BinOp):
            return text(node.left) + text(node.right)
        if isinstance(node, ast.IfExp):
            return text(node.body) + " | " + text(node.orelse)
        return ""

    root = Path(dsparkhub.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                yield f"{path.relative_to(root)}:{node.value.lineno}", text(node.value)


def _commands(group, prefix=""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", {o for p in command.params for o in getattr(p, "opts", [])}


def test_every_option_a_hint_names_exists():
    """Each ``--flag`` in a ``hint=`` is an option of some dsparkhub command (or an engine's flag); a hint that
    spells ``dsparkhub CMD ... --flag`` names an option CMD has."""
    commands = dict(_commands(main))
    every = set().union(*commands.values()) | {"--help"}  # click gives every command --help
    bad = []
    for where, hint in _hint_texts():
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", hint):
            if flag not in every and flag not in ENGINE_FLAGS:
                bad.append(f"{where}: {flag} (no command has it): {hint}")
        for m in re.finditer(r"dsparkhub ([a-z-]+(?: [a-z-]+)?)([^`]*)", hint):
            name = m.group(1) if m.group(1) in commands else m.group(1).split()[0]
            for flag in re.findall(r"--[a-z][a-z0-9-]*", m.group(2)):
                if name in commands and flag not in commands[name]:
                    bad.append(f"{where}: `dsparkhub {name}` has no {flag}: {hint}")
    assert bad == []


def test_a_hint_naming_an_option_the_command_lacks_says_which_command_has_it(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Foo"]}')
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    res = CliRunner().invoke(main, ["verify", str(tmp_path), "--target", str(tmp_path)])
    assert res.exit_code == EXIT_FAILED, res.output
    assert "pass --layout NAME to force one (--layout is an option of `dsparkhub inspect`, `dsparkhub validate`, " \
           "`dsparkhub convert`)" in res.output
    res = CliRunner().invoke(main, ["inspect", str(tmp_path)])  # inspect has --layout: the hint stays as it is
    assert "to force one\n" in res.output + "\n" and "is an option of" not in res.output


# ---------------------------------------------------------------------------------------------- DSH106


def test_converting_the_shipped_example_warns_nothing(example):
    from dsparkhub.convert.plan import plan_conversion

    plan = plan_conversion(example.deepspec_run, example.target)
    assert [f.code for f in plan.report.findings] == []


def test_dsh106_still_flags_an_implicit_one_plus_n_drafter(models):
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.validate.drafter import check_intrinsic
    from dsparkhub.validate.report import Collector

    _, step = models
    d = open_draft(step)
    out = Collector()
    check_intrinsic(d, out)
    assert "DSH106" not in {f.code for f in out.items}  # DeepSpec is anchor-first: vLLM's default is right
    d.spec.block_layout = "one_plus_n"
    out = Collector()
    check_intrinsic(d, out)
    assert "DSH106" in {f.code for f in out.items}


# ---------------------------------------------------------------------------------------------- silent phases


@pytest.mark.parametrize("seconds, shown", [(0.05, False), (0.6, True)])
def test_working_shows_a_long_step_after_its_delay_and_clears_it(capsys, seconds, shown):
    import time

    from dsparkhub.cli.render import working

    with working("linking", delay_s=0.3):
        time.sleep(seconds)
    err = capsys.readouterr().err
    assert ("linking: 00:00" in err) is shown
    assert err == "" or err.endswith("\r") and err.rsplit("\r", 2)[-2].strip() == ""  # cleared, no line left
    with working("linking", delay_s=0.1, show=False):  # a --json run: its output is for a program
        time.sleep(0.3)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("args, module, what", [
    (["detach", "{tmp}/missing", "--out", "{tmp}/o"], "source", "detaching"),
    (["convert", "{tmp}/missing", "--attach", "{tmp}/t", "--out", "{tmp}/o"], "source", "attaching"),
    (["convert", "{tmp}/missing", "--attach", "{tmp}/t", "--attach-as", "dspark-subfolder", "--out", "{tmp}/o"],
     "source", "attaching"),
    (["vllm-check", "{tmp}", "--target", "{tmp}"], "verify", "vLLM's checks"),
    (["sglang-check", "{tmp}", "--target", "{tmp}"], "verify", "SGLang's checks"),
])
def test_silent_commands_show_their_step(tmp_path, monkeypatch, args, module, what):
    import contextlib
    import importlib

    import dsparkhub.verify.sglang.checks as sglang_checks
    import dsparkhub.verify.vllm.checks as vllm_checks
    from dsparkhub.errors import VerifyError

    def refused(*a, **k):
        raise VerifyError("stopped here by the test")

    monkeypatch.setattr(vllm_checks, "check_with_vllm", refused)
    monkeypatch.setattr(sglang_checks, "check_with_sglang", refused)
    entered = []

    @contextlib.contextmanager
    def working(desc, **kwargs):
        entered.append(desc)
        yield

    monkeypatch.setattr(importlib.import_module(f"dsparkhub.cli.{module}"), "working", working)
    res = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert res.exit_code == EXIT_FAILED, res.output
    assert len(entered) == 1 and entered[0].startswith(what)
