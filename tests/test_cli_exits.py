"""Exit codes and messages of the first run (issue 13, "smaller things"): each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target


@pytest.fixture
def models(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    return make_deepspec_drafter(tmp_path / "run", target), target


def test_skeleton_of_a_release_name_writes_its_target(tmp_path):
    res = CliRunner().invoke(main, ["skeleton", "novita-kimi-k2.6-dspark", "--tiny", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "wrote its target kimi-k2.6" in res.output and (tmp_path / "s" / "config.json").is_file()


def test_ctrl_c_exits_130(models, monkeypatch):
    import dsparkhub.layouts.reading

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dsparkhub.layouts.reading, "open_draft", interrupted)
    res = CliRunner().invoke(main, ["inspect", str(models[0])])
    assert res.exit_code == 130 and "interrupted" in res.output


def test_an_unknown_output_layout_is_a_usage_error(models, tmp_path):
    run, target = models
    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "o"),
                                    "--to", "vlm"])
    assert res.exit_code == 2 and "unknown layout 'vlm'" in res.output and "did you mean vllm" in res.output


def test_a_dry_run_refuses_what_the_real_command_refuses(models, tmp_path):
    run, target = models
    (tmp_path / "exists").mkdir()
    for out, words in ((tmp_path / "exists", "already exists"), (run / "inside", "")):
        args = ["convert", str(run), "--target", str(target), "--out", str(out)]
        real, dry = CliRunner().invoke(main, args), CliRunner().invoke(main, [*args, "--dry-run"])
        assert real.exit_code == dry.exit_code == 1, (real.output, dry.output)
        assert words in dry.output and "OutputExistsError" in dry.output
    res = CliRunner().invoke(main, ["convert", str(run), "--attach", str(target), "--out", str(tmp_path / "a"),
                                    "--dry-run"])
    assert res.exit_code == 2 and not (tmp_path / "a").exists()  # --attach has no dry run: it used to write


def test_a_mistyped_manifest_name_gets_close_names():
    res = CliRunner().invoke(main, ["manifests", "show", "kimi-k26"])
    assert res.exit_code == 1 and "did you mean 'kimi-k2.6'" in res.output


def test_manifests_show_says_which_citations_are_not_in_the_repository():
    from dsparkhub.layouts.manifests import unshipped_citations

    assert unshipped_citations("FORMATS §7, and reference notes §1.4; 3p notes") == [
        "FORMATS §7", "reference notes §1.4", "3p notes"]
    assert unshipped_citations("transformers 5.19 Kimi_K25Config docstring") == []
    res = CliRunner().invoke(main, ["manifests", "show", "qwen3-14b"])
    assert res.exit_code == 0
    assert "vocab_size: verified — FORMATS §7, not marked unverified there [*]" in res.output
    assert "which are not in this repository" in res.output


def test_offline_a_hub_target_in_the_hf_cache_is_read_from_the_cache(models, tmp_path):
    """HF_HUB_OFFLINE=1 (set for every test): a target downloaded before is read from the HF cache, as
    huggingface_hub's local_files_only reads do, instead of being refused with "unset HF_HUB_OFFLINE"."""
    import shutil

    from huggingface_hub import constants

    run, target = models
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(constants.HF_HUB_CACHE) / "models--org--tiny-target"
    shutil.copytree(target, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    try:
        res = CliRunner().invoke(main, ["validate", str(run), "--target", "org/tiny-target"])
        assert res.exit_code == 0, res.output
        assert "against org/tiny-target" in res.output and "HF_HUB_OFFLINE" not in res.output
        res = CliRunner().invoke(main, ["validate", str(run), "--target", "org/not-cached"])
        assert res.exit_code == 1 and "unset HF_HUB_OFFLINE" in res.output  # nothing cached: the hint stays
    finally:
        shutil.rmtree(repo)
