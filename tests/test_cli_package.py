"""The cli/ package: one group with every command, shared option sets, exit codes; one validation error format."""

from __future__ import annotations

from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.cli.errors import EXIT_FAILED, EXIT_USAGE
from dsparkhub.errors import ValidationFailedError
from dsparkhub.validate.report import Finding, ValidationReport, validation_error

COMMANDS = {"inspect", "validate", "convert", "detach", "manifests", "skeleton", "verify", "calibrate", "card", "compare", "push",
            "example", "vllm-check", "sglang-check", "quickstart", "schedule", "hub"}


def test_one_group_holds_every_command():
    assert set(main.commands) == COMMANDS


def test_shared_generation_options_keep_each_commands_minimum(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["calibrate", str(tmp_path), "--target", str(tmp_path), "--max-prompts", "1"])
    assert res.exit_code == EXIT_USAGE and "--max-prompts" in res.output
    for command in ("verify", "calibrate"):
        names = [p.name for p in main.commands[command].params]
        i = names.index("max_prompts")
        assert names[i:i + 4] == ["max_prompts", "max_new_tokens", "temperature", "seed"]


def test_validation_error_lists_every_error_once():
    report = ValidationReport("d", "t", "vllm", [
        Finding("DSH204", "error", "fc input width is wrong", "tensor fc.weight", "384", "256"),
        Finding("DSH102", "error", "mask token outside the vocab"),
        Finding("DSH401", "warning", "n larger than a block"),
    ])
    err = validation_error(report, against="its target t", refusing="nothing was converted", path="d",
                           hint="pass --force")
    assert isinstance(err, ValidationFailedError) and err.report is report and err.hint == "pass --force"
    assert "(2 error(s)); nothing was converted:" in err.message
    assert "  - [DSH204] tensor fc.weight: fc input width is wrong (expected 384, found 256)" in err.message
    assert "  - [DSH102] mask token outside the vocab" in err.message and "DSH401" not in err.message


def test_validation_errors_exit_1_with_the_listing(tmp_path):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    other = make_qwen3_target(tmp_path / "other", hidden=48)  # another width: fc / embeddings no longer fit
    run = make_deepspec_drafter(tmp_path / "run", target)
    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(other), "--out", str(tmp_path / "out")])
    assert res.exit_code == EXIT_FAILED and "error(s)); nothing was converted:" in res.output
