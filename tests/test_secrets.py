"""A Hugging Face token never appears in anything dsparkhub prints or writes.

With a recognisable fake token in ``HF_TOKEN`` (and ``HUGGING_FACE_HUB_TOKEN``), every command runs — success and
failure paths, ``--debug`` included — in-process with click's CliRunner and as a subprocess (all but ``example`` and
``quickstart``, which build the trained example and are covered by their own tests); then the token is
searched in stdout / stderr, exception texts and tracebacks, every file under the test folder (outputs, provenance,
results, cards, logs) and everything the local Hub received (files and commit messages). A second token not shaped
like ``hf_...`` checks that redaction knows the token's value, not only its shape.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target, make_v4_target

torch.set_num_threads(1)

HF_SHAPED = "hf_FAKEdsparkhubTOKEN0123456789abcdefXYZ"
PLAIN = "dsparkhub-plain-SECRET-4242-not-hf-shaped"


def _scan_files(root: Path, token: str) -> list[str]:
    hits = []
    needle = token.encode()
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
            hits.append(str(p))
    return hits


class Recorder:
    """Runs CLI commands and keeps every text they produced (output, exception, formatted traceback)."""

    def __init__(self, token: str):
        self.token = token
        self.texts: list[tuple[str, str]] = []
        self.runs: dict[str, int] = {}

    def invoke(self, args: list[str], *, expect: int | None = None, debug: bool = False) -> str:
        full = (["--debug"] if debug else []) + [str(a) for a in args]
        r = CliRunner().invoke(main, full, catch_exceptions=True)
        texts = [r.output, getattr(r, "stderr", "") or ""]
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            texts += [str(r.exception), repr(r.exception),
                      "".join(traceback.format_exception(r.exception))]
        for t in texts:
            self.texts.append((" ".join(full), t))
        if expect is not None:
            assert r.exit_code == expect, (full, r.exit_code, r.output, r.exception)
        self.runs[full[1] if debug else full[0]] = self.runs.get(full[1] if debug else full[0], 0) + 1
        return r.output

    def subprocess(self, args: list[str], env: dict, *, expect: int | None = None) -> str:
        p = subprocess.run([sys.executable, "-m", "dsparkhub.cli", *map(str, args)], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=300)
        self.texts.append((" ".join(map(str, args)), p.stdout + p.stderr))
        if expect is not None:
            assert p.returncode == expect, (args, p.returncode, p.stdout, p.stderr)
        return p.stdout + p.stderr

    def leaks(self) -> list[str]:
        return [cmd for cmd, text in self.texts if self.token in text]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("secret_models")
    target = make_qwen3_target(root / "target", dtype=torch.float32)
    run = make_deepspec_drafter(root / "run", target, block_size=4)
    v4 = make_v4_target(root / "v4")
    attach_run = make_deepspec_drafter(root / "attach_run", target, block_size=4,
                                       drop=("embed_tokens.weight", "lm_head.weight"))
    return {"target": target, "run": run, "v4": v4, "attach_run": attach_run}


@pytest.mark.slow
@pytest.mark.parametrize("token", [HF_SHAPED, PLAIN])
def test_token_never_printed_or_written_by_any_command(models, tmp_path, monkeypatch, caplog, token):
    import huggingface_hub.utils._http as http

    from dsparkhub.testing import LocalHub

    monkeypatch.setattr(http.time, "sleep", lambda s: None)
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", token)
    caplog.set_level(logging.DEBUG)  # every library's log records, huggingface_hub's HTTP logging included
    rec = Recorder(token)
    target, run, v4 = models["target"], models["run"], models["v4"]
    out, attached, detached = tmp_path / "out", tmp_path / "attached", tmp_path / "detached"
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in [[5, 9, 17, 3], [40, 2]]))
    results = tmp_path / "results.json"

    with LocalHub(tmp_path / "hub", tokens={token: "alice"}) as hub, hub.client_settings():
        env = {"HF_TOKEN": token, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
        # the plain token runs with --debug only (the widest output: tracebacks of every failure)
        for debug in ((False, True) if token == HF_SHAPED else (True,)):
            # success paths
            rec.invoke(["--version"], expect=0)
            rec.invoke(["--help"], expect=0)
            rec.invoke(["inspect", run], expect=0, debug=debug)
            rec.invoke(["inspect", run, "--json"], expect=0, debug=debug)
            rec.invoke(["validate", run, "--target", target], expect=0, debug=debug)
            rec.invoke(["validate", run, "--target", target, "--json"], expect=0, debug=debug)
            rec.invoke(["convert", run, "--target", target, "--out", out, "--dry-run", "--overwrite"], expect=0,
                       debug=debug)
            rec.invoke(["convert", run, "--target", target, "--out", out, "--overwrite"], expect=0, debug=debug)
            # --force: the toy Qwen3 drafter is refused by DSH311 against a V4 target; this test is about secrets
            rec.invoke(["convert", models["attach_run"], "--attach", v4, "--out", attached, "--overwrite", "--force"],
                       expect=0, debug=debug)
            rec.invoke(["detach", attached, "--out", detached, "--overwrite"], expect=0, debug=debug)
            rec.invoke(["manifests", "list"], expect=0, debug=debug)
            rec.invoke(["manifests", "show", "qwen3-8b", "--json"], expect=0, debug=debug)
            rec.invoke(["skeleton", "qwen3-8b", "--tiny", "--out", tmp_path / "skeleton", "--overwrite"], expect=0,
                       debug=debug)
            rec.invoke(["verify", out, "--target", target, "-n", "2", "--datasets", prompts, "--max-new-tokens",
                        "6", "--out", results, "--quiet", "--overwrite"], expect=0, debug=debug)
            rec.invoke(["card", out, "--results", results, "--repo-id", "alice/tiny", "--base-model", "alice/base"],
                       expect=0, debug=debug)
            rec.invoke(["push", out, "--repo", "alice/tiny", "--dry-run", "--endpoint", hub.url], expect=0,
                       debug=debug)
            rec.invoke(["push", out, "--repo", "alice/tiny", "--endpoint", hub.url, "--target", target], expect=0,
                       debug=debug)
            # failure paths
            rec.invoke(["inspect", tmp_path / "missing"], expect=1, debug=debug)
            rec.invoke(["validate", run, "--target", tmp_path / "missing"], expect=1, debug=debug)
            rec.invoke(["convert", run, "--target", target, "--out", out], expect=1, debug=debug)  # OUT exists
            rec.invoke(["card", out, "--results", tmp_path / "missing.json"], expect=2, debug=debug)  # no such file
            rec.invoke(["verify", out, "--target", tmp_path / "missing", "--out", tmp_path / "r.json"], expect=1,
                       debug=debug)
            rec.invoke(["push", out, "--repo", "not a repo id", "--endpoint", hub.url], expect=1, debug=debug)
            rec.invoke(["push", out, "--repo", "bob/theirs", "--endpoint", hub.url], expect=1, debug=debug)
            hub.inject(method="POST", path=r"/commit/", status=403, count=1,
                       message=f"token {token} may not write to this repo")  # a server that echoes the token
            (out / "extra.txt").write_text("changed")
            rec.invoke(["push", out, "--repo", "alice/tiny", "--endpoint", hub.url], expect=1, debug=debug)
            hub.inject(method="POST", path=r"/preupload/", status=500, count=None, message=f"Bearer {token}")
            rec.invoke(["push", out, "--repo", "alice/tiny", "--endpoint", hub.url], expect=1, debug=debug)
            hub.clear_faults()
            (out / "extra.txt").unlink()
            rec.invoke(["detach", tmp_path / "missing", "--out", tmp_path / "d2"], expect=1, debug=debug)
            rec.invoke(["skeleton", "no-such-manifest", "--out", tmp_path / "s2"], expect=1, debug=debug)
            rec.invoke(["vllm-check", out, "--target", tmp_path / "missing"], debug=debug)
            rec.invoke(["convert", run, "--target", "alice/no-such-target", "--out", tmp_path / "o2"], expect=1,
                       debug=debug)  # a Hub target read with the token, answered 404 by the local Hub

        # subprocesses: what a user's terminal shows, tracebacks included
        for debug_env in ({}, {"DSPARKHUB_DEBUG": "1"}):
            e = {**env, **debug_env}
            rec.subprocess(["validate", run, "--target", target], e, expect=0)
            rec.subprocess(["push", out, "--repo", "alice/tiny", "--endpoint", hub.url], e, expect=0)
            rec.subprocess(["push", out, "--repo", "bob/theirs", "--endpoint", hub.url], e, expect=1)
            rec.subprocess(["--debug", "push", out, "--repo", "alice/tiny", "--endpoint", "http://127.0.0.1:9"], e,
                           expect=1)  # connection refused
            rec.subprocess(["--debug", "inspect", tmp_path / "missing"], e, expect=1)
            rec.subprocess(["convert", run, "--target", "alice/no-such-target", "--out", tmp_path / "o3"], e,
                           expect=1)

        hub_texts = [c["summary"] + "\n" + (c["description"] or "") for c in hub.commits("alice/tiny")]
        hub_files = hub.files("alice/tiny")
        assert hub_files and len(hub_texts) >= 2
        assert not [t for t in hub_texts if token in t], "a commit message holds the token"
        assert not [p for p, data in hub_files.items() if token.encode() in data], "a pushed file holds the token"

    assert not rec.leaks(), f"the token appeared in the output of: {rec.leaks()}"
    # httpcore's own DEBUG trace prints raw response headers, so a server that echoes the token shows up there;
    # dsparkhub never enables it. Everything at INFO and above, and every dsparkhub / huggingface_hub record, is clean.
    shown = [r for r in caplog.records if r.levelno >= logging.INFO or r.name.startswith(("dsparkhub",
                                                                                        "huggingface_hub"))]
    assert shown and not [r.name for r in shown if token in r.getMessage()], "a log record holds the token"
    assert not _scan_files(tmp_path, token), f"files holding the token: {_scan_files(tmp_path, token)}"
    for written in (out / "dsparkhub_provenance.json", out / "README.md", results, attached / "dsparkhub_attach.json"):
        assert written.exists(), written
    commands = {"inspect", "validate", "convert", "detach", "manifests", "skeleton", "verify", "card", "push",
                "vllm-check"}
    assert commands <= set(rec.runs), commands - set(rec.runs)
    print(f"secrets ({'hf-shaped' if token == HF_SHAPED else 'plain'} token): {len(rec.texts)} outputs and "
          f"{sum(1 for _ in tmp_path.rglob('*'))} files scanned, 0 leaks")


def test_redact_removes_known_and_token_shaped_values(monkeypatch):
    from dsparkhub.secrets import redact

    monkeypatch.setenv("HF_TOKEN", PLAIN)
    text = f"Authorization: Bearer {PLAIN}; other hf_AAAAAAAAAAAAAAAAAAAAAAAAA; short hf_abc"
    clean = redact(text)
    assert PLAIN not in clean and "hf_AAAAAAAAAAAAAAAAAAAAAAAAA" not in clean
    assert "hf_abc" in clean, "short non-token text must survive"
