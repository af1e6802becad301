"""``dsparkhub push`` and remote header reads, end to end against LocalHub with the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from huggingface_hub import snapshot_download
from safetensors.torch import save_file

import dsparkhub.hub.push as hub_mod
from dsparkhub.cli import main
from dsparkhub.errors import (CheckpointFormatError, CheckpointNotFoundError, ConversionRefusedError, HubError,
                              ResultsError, ValidationFailedError)
from dsparkhub.hub.files import local_files
from dsparkhub.hub.push import push
from dsparkhub.hub.remote import check_remote, remote_checkpoint, remote_checkpoint_headers
from dsparkhub.io.hashing import sha256_files
from dsparkhub.repo_ids import check_repo_id
from dsparkhub.testing import LocalHub

TOKEN = "hf_FAKEtoken0123456789abcdefghijklm"
OTHER = "hf_FAKEother0123456789abcdefghijklm"


# ---- fixtures ---------------------------------------------------------------------------------------------------


@dataclass
class _Finding:
    code: str
    severity: str
    message: str
    location: str = ""


@dataclass
class _Report:
    """Stands in for dsparkhub.validate.ValidationReport (same attributes push reads)."""

    findings: list = field(default_factory=list)

    @property
    def errors(self):
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self):
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self):
        return not self.errors

    def to_dict(self):
        return {"ok": self.ok, "errors": len(self.errors), "warnings": len(self.warnings),
                "findings": [asdict(f) for f in self.findings]}


@pytest.fixture
def validation(monkeypatch):
    """Replace validation with a scripted report; ``validation.findings`` can be edited by a test."""
    report = _Report()
    calls = []

    def fake(draft_dir, target, endpoint=None, token=None, **_reuse):
        calls.append((Path(draft_dir), target))
        return report

    monkeypatch.setattr(hub_mod, "_run_validation", fake)
    report.calls = calls
    return report


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """LocalHub with alice (TOKEN, in HF_TOKEN) and bob; huggingface_hub pointed at it."""
    torch.set_num_threads(1)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with LocalHub(tmp_path / "hub", tokens={TOKEN: "alice", OTHER: "bob"}) as server, server.client_settings():
        yield server
        assert server.server_errors == []


@pytest.fixture
def hub(local_hub, validation):
    """LocalHub, with validation scripted (these tests are about the Hub side)."""
    return local_hub


@pytest.fixture
def no_retry_sleep(monkeypatch):
    import huggingface_hub.utils._http as http

    monkeypatch.setattr(http.time, "sleep", lambda s: None)


def make_drafter(folder: Path, seed: int = 0) -> Path:
    """A tiny converted drafter: config, two safetensors shards + index, provenance, card."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    h = 32
    shard1 = {"fc.weight": torch.randn(h, 3 * h, generator=g), "hidden_norm.weight": torch.ones(h)}
    shard2 = {"layers.0.mlp.down_proj.weight": torch.randn(h, 64, generator=g).to(torch.bfloat16),
              "norm.weight": torch.ones(h)}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, str(folder / names[0]), metadata={"format": "pt"})
    save_file(shard2, str(folder / names[1]), metadata={"format": "pt"})
    weight_map = {**{k: names[0] for k in shard1}, **{k: names[1] for k in shard2}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3DSparkModel"], "hidden_size": h,
                                                    "block_size": 7, "seed": seed}))
    (folder / "dsparkhub_provenance.json").write_text(json.dumps(
        {"source": "/runs/dspark/step_1200", "target": "Qwen/Qwen3-8B", "options": {"keep_embeddings": False},
         "hashes": {"source": "ab" * 32}, "dsparkhub_version": "0.1.0"}))
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny drafter\n")
    return folder


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.parts}


# ---- push -------------------------------------------------------------------------------------------------------


def test_push_then_download_gives_the_same_bytes(hub, tmp_path, validation):
    draft = make_drafter(tmp_path / "draft")
    report = push(draft, "alice/tiny-dspark", endpoint=hub.url, target="Qwen/Qwen3-8B")

    assert validation.calls == [(draft, "Qwen/Qwen3-8B")]
    assert report.committed and report.remote_check == "ok"
    assert report.commit_oid == hub.head("alice/tiny-dspark")
    assert report.commit_url == f"{hub.url}/alice/tiny-dspark/commit/{report.commit_oid}"
    local = _bytes(draft)
    assert report.bytes_uploaded == sum(len(b) for b in local.values())
    assert {f.path: f.action for f in report.plan.files} == {p: "add" for p in local}
    got = Path(snapshot_download("alice/tiny-dspark", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "dl"))
    remote = _bytes(got)
    assert remote.pop(".gitattributes")
    assert remote == local
    # one commit on top of the repo's initial one, with provenance and no token
    commits = hub.commits("alice/tiny-dspark")
    assert len(commits) == 2
    text = commits[0]["summary"] + commits[0]["description"]
    assert commits[0]["summary"] == "dsparkhub push: 6 added, 0 changed, 0 deleted"
    assert "/runs/dspark/step_1200" in text and "dsparkhub 0.1.0" in text
    assert hashlib.sha256(local["model-00001-of-00002.safetensors"]).hexdigest() in text
    assert TOKEN not in text and TOKEN not in json.dumps(report.to_dict())


def test_repush_of_unchanged_release_makes_no_commit_and_uploads_nothing(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/r", endpoint=hub.url)
    head = hub.head("alice/r")
    hub.clear_requests()
    report = push(draft, "alice/r", endpoint=hub.url)
    assert not report.committed and report.bytes_uploaded == 0 and report.remote_check == "ok"
    assert {f.action for f in report.plan.files} == {"unchanged"}
    assert hub.head("alice/r") == head
    assert hub.writes == []


def test_changed_files_make_one_commit_and_remote_only_files_are_kept_unless_deleted(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/c", endpoint=hub.url)
    make_drafter(draft, seed=1)  # new weights and config
    (draft / "README.md").unlink()
    (draft / "model.safetensors.index.json").unlink()
    n_commits = len(hub.commits("alice/c"))
    report = push(draft, "alice/c", endpoint=hub.url)  # as `hf upload`: what the folder lacks stays on the Hub
    actions = {f.path: f.action for f in report.plan.files}
    assert actions == {"README.md": "keep", "config.json": "change", "dsparkhub_provenance.json": "unchanged",
                       "model-00001-of-00002.safetensors": "change", "model-00002-of-00002.safetensors": "change",
                       "model.safetensors.index.json": "keep"}
    assert len(hub.commits("alice/c")) == n_commits + 1
    assert {"README.md", "model.safetensors.index.json"} <= set(hub.files("alice/c"))
    changed = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert report.bytes_uploaded == sum((draft / p).stat().st_size for p in changed)
    # --delete '*' deletes what the folder lacks, but never the hand-written README (only --delete README.md does)
    report = push(draft, "alice/c", endpoint=hub.url, delete=["*"])
    actions = {f.path: f.action for f in report.plan.files}
    assert actions["model.safetensors.index.json"] == "delete" and actions["README.md"] == "keep"
    assert any("README.md on the Hub is kept" in n for n in report.notes), report.notes
    report = push(draft, "alice/c", endpoint=hub.url, delete=["README.md"])
    assert [f.path for f in report.plan.by_action("delete")] == ["README.md"]
    files = hub.files("alice/c")
    assert set(files) == set(_bytes(draft)) | {".gitattributes"}
    assert files["config.json"] == (draft / "config.json").read_bytes()


def test_a_file_left_out_here_is_kept_on_the_hub(hub, tmp_path):
    from huggingface_hub import HfApi

    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/k", endpoint=hub.url)
    api = HfApi(endpoint=hub.url, token=TOKEN)  # an older push (or the Hub UI) added a pickle
    api.upload_file(path_or_fileobj=b"old pickle", path_in_repo="pytorch_model.bin", repo_id="alice/k")
    (draft / "pytorch_model.bin").write_bytes(b"local pickle")  # the folder still holds one: left out, kept remotely
    report = push(draft, "alice/k", endpoint=hub.url)
    assert report.plan.by_action("delete") == [] and "pytorch_model.bin" in hub.files("alice/k")
    assert any("kept on the Hub although not pushed from here: pytorch_model.bin" in n for n in report.notes), \
        report.notes
    make_drafter(draft, seed=1)  # a real change beside the kept file: committed, and the read-back accepts it
    report = push(draft, "alice/k", endpoint=hub.url)
    assert report.committed and report.plan.by_action("delete") == []
    report = push(draft, "alice/k", revision="dev", endpoint=hub.url)  # a new branch starts from main: kept too
    assert report.plan.by_action("delete") == [] and "pytorch_model.bin" in hub.files("alice/k", revision="dev")
    report = push(draft, "alice/k", endpoint=hub.url, delete=["*.bin"])  # left out here: --delete spares it
    assert report.plan.by_action("delete") == [] and "pytorch_model.bin" in hub.files("alice/k")
    (draft / "pytorch_model.bin").unlink()  # gone from the folder too: --delete now deletes it
    report = push(draft, "alice/k", endpoint=hub.url, delete=["*.bin"])
    assert [f.path for f in report.plan.by_action("delete")] == ["pytorch_model.bin"]
    assert "pytorch_model.bin" not in hub.files("alice/k")


def test_dry_run_sends_no_write_request(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    report = push(draft, "alice/new", endpoint=hub.url, dry_run=True)
    assert report.dry_run and not report.plan.repo_exists
    assert {f.action for f in report.plan.files} == {"add"}
    assert report.plan.bytes_to_send == sum(len(b) for b in _bytes(draft).values())
    assert hub.writes == [] and {r.method for r in hub.requests} <= {"GET", "HEAD"}
    with pytest.raises(KeyError):
        hub.head("alice/new")

    push(draft, "alice/new", endpoint=hub.url)
    (draft / "config.json").write_text("{}")
    hub.clear_requests()
    head = hub.head("alice/new")
    report = push(draft, "alice/new", endpoint=hub.url, dry_run=True)
    assert [f.path for f in report.plan.changes] == ["config.json"]
    assert report.plan.parent_commit == head and not report.committed and report.bytes_uploaded == 0
    assert hub.requests and hub.writes == [] and hub.head("alice/new") == head


def test_interrupted_push_leaves_remote_unchanged_and_rerun_completes(hub, tmp_path, no_retry_sleep):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/i", endpoint=hub.url)
    make_drafter(draft, seed=2)
    head = hub.head("alice/i")
    shard2 = draft / "model-00002-of-00002.safetensors"
    oid2 = hashlib.sha256(shard2.read_bytes()).hexdigest()
    oid1 = hashlib.sha256((draft / "model-00001-of-00002.safetensors").read_bytes()).hexdigest()
    fault = hub.inject(method="PUT", path=f"/_lfs/alice/i/{oid2}$", kind="drop", count=None)

    with pytest.raises(HubError, match="network error") as err:
        push(draft, "alice/i", endpoint=hub.url)
    assert "run the push again" in err.value.hint
    assert fault.hits >= 1
    assert hub.head("alice/i") == head  # no partial release
    assert oid1 in hub.lfs_objects() and oid2 not in hub.lfs_objects()

    hub.clear_faults()
    hub.clear_requests()
    report = push(draft, "alice/i", endpoint=hub.url)
    puts = [r.path for r in hub.requests if r.method == "PUT"]
    assert puts == [f"/_lfs/alice/i/{oid2}"]  # shard 1 was already on the server
    assert report.bytes_uploaded == shard2.stat().st_size + (draft / "config.json").stat().st_size
    assert hub.files("alice/i")[shard2.name] == shard2.read_bytes()


@pytest.mark.parametrize("status, words", [(401, "HTTP 401"), (403, "HTTP 403"), (404, "was not found"),
                                           (503, "HTTP 503")])
def test_commit_errors_are_clear_and_leave_remote_unchanged(hub, tmp_path, status, words):
    draft = make_drafter(tmp_path / "draft")
    hub.create_repo("alice/e")
    head = hub.head("alice/e")
    hub.inject(method="POST", path=r"/api/models/alice/e/commit/", status=status, count=1)
    with pytest.raises(HubError, match=words) as err:
        push(draft, "alice/e", endpoint=hub.url)
    assert err.value.hint and TOKEN not in str(err.value)
    assert err.value.__cause__ is not None
    assert hub.head("alice/e") == head


def test_token_not_shaped_like_hf_is_redacted_too(hub, tmp_path):
    plain = "plain-secret-value-42"
    hub.tokens[plain] = "alice"
    hub.inject(method="POST", path=r"/commit/", status=403, message=f"token {plain} may not write")
    with pytest.raises(HubError, match="403") as err:
        push(make_drafter(tmp_path / "draft"), "alice/plain", endpoint=hub.url, token=plain)
    assert plain not in str(err.value) and "***" in str(err.value)


def test_wrong_token_gives_401_with_hint(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_FAKEwrongtoken0123456789abcdefg")
    with pytest.raises(HubError, match="401") as err:
        push(make_drafter(tmp_path / "draft"), "alice/w", endpoint=hub.url)
    assert "HF_TOKEN" in err.value.hint and "hf_FAKEwrong" not in str(err.value)


def test_no_write_access_to_namespace(hub, tmp_path):
    hub.create_repo("bob/theirs")
    with pytest.raises(HubError, match="403") as err:
        push(make_drafter(tmp_path / "draft"), "bob/theirs", endpoint=hub.url)
    assert "write access" in err.value.hint


def test_repo_changed_between_plan_and_commit_fails_cleanly(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    hub.create_repo("alice/race")
    hub.inject(method="POST", path=r"/commit/main$", kind="call",
               action=lambda: hub.put_files("alice/race", {"other.txt": b"someone else"}))
    with pytest.raises(HubError, match="changed on the Hub") as err:
        push(draft, "alice/race", endpoint=hub.url)
    assert "again" in err.value.hint
    assert set(hub.files("alice/race")) == {".gitattributes", "other.txt"}
    report = push(draft, "alice/race", endpoint=hub.url, delete=["*"])  # re-planning sees the stray file
    assert [f.path for f in report.plan.by_action("delete")] == ["other.txt"]
    assert set(hub.files("alice/race")) == set(_bytes(draft)) | {".gitattributes"}


@pytest.mark.parametrize("repo_id", ["tiny", "a/b/c", "/name", "ns/", "ns/na me", "ns/a--b", "ns/..x", "-ns/x",
                                     "ns/x.", "n" * 97 + "/x"])
def test_invalid_repo_id_refused_before_any_request(hub, tmp_path, repo_id):
    with pytest.raises(HubError, match="invalid Hub repo id"):
        push(make_drafter(tmp_path / "draft"), repo_id, endpoint=hub.url)
    assert hub.requests == []


def test_valid_repo_ids():
    for repo_id in ("alice/qwen3-8b-dspark", "Org_1/Name.v2", "a/b"):
        assert check_repo_id(repo_id) == repo_id


def test_validation_errors_refuse_push_unless_forced(hub, tmp_path, validation):
    validation.findings.append(_Finding("DSH204", "error", "fc input width is wrong", "tensor fc.weight"))
    draft = make_drafter(tmp_path / "draft")
    with pytest.raises(ValidationFailedError, match="DSH204") as err:
        push(draft, "alice/v", endpoint=hub.url)
    assert "--force" in err.value.hint and hub.requests == []
    report = push(draft, "alice/v", endpoint=hub.url, force=True)
    assert report.forced
    commit = hub.commits("alice/v")[0]
    assert "FORCED" in commit["summary"] and "DSH204" in commit["description"]


def test_branch_is_created_and_main_left_alone(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/b", endpoint=hub.url)
    main_head = hub.head("alice/b")
    (draft / "config.json").write_text('{"v": 2}')
    report = push(draft, "alice/b", endpoint=hub.url, revision="v2")
    assert "created branch v2" in report.notes
    assert [f.path for f in report.plan.changes] == ["config.json"]  # planned against main's files
    assert hub.head("alice/b") == main_head
    assert hub.files("alice/b", "v2")["config.json"] == b'{"v": 2}'


def test_private_repo_and_missing_token(hub, tmp_path, monkeypatch):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/p", endpoint=hub.url, private=True)
    assert hub.is_private("alice/p")
    monkeypatch.delenv("HF_TOKEN")
    report = push(draft, "alice/public", endpoint=hub.url, dry_run=True)  # dry run needs no token
    assert not report.plan.repo_exists and "no token" in report.notes[0]
    hub.clear_requests()
    with pytest.raises(HubError, match="no Hugging Face token"):
        push(draft, "alice/public", endpoint=hub.url)
    assert hub.requests == []


def test_offline_mode_is_explained(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="offline mode") as err:
        push(make_drafter(tmp_path / "draft"), "alice/off", endpoint=hub.url, dry_run=True)
    assert "HF_HUB_OFFLINE" in err.value.hint and hub.requests == []


def test_missing_folder(hub, tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        push(tmp_path / "nope", "alice/x", endpoint=hub.url)


def test_remote_check_reports_every_difference(hub, tmp_path):
    from huggingface_hub import HfApi

    draft = make_drafter(tmp_path / "draft")
    report = push(draft, "alice/chk", endpoint=hub.url)
    (draft / "config.json").write_text('{"edited": true}')
    (draft / "extra.txt").write_text("x")
    (draft / "README.md").unlink()
    files = local_files(draft)
    hashes = sha256_files(list(files.values()))
    with pytest.raises(HubError) as err:
        check_remote(HfApi(endpoint=hub.url, token=TOKEN), "alice/chk", report.commit_oid, files, hashes,
                              TOKEN)
    msg = str(err.value)
    assert "config.json: Hub has" in msg and "extra.txt: missing" in msg and "README.md: on the Hub" in msg


def test_local_files_skip_caches(tmp_path):
    draft = make_drafter(tmp_path / "draft")
    (draft / ".cache" / "huggingface").mkdir(parents=True)
    (draft / ".cache" / "huggingface" / "x.lock").write_text("")
    (draft / "__pycache__").mkdir()
    (draft / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (draft / "sub").mkdir()
    (draft / "sub" / "plot.png").write_bytes(b"\x89PNG")
    for name in (".env", "training_state.rank0.pt", "pytorch_model.bin", "optimizer.safetensors"):
        (draft / name).write_bytes(b"x")
    (draft / ".secrets").mkdir()
    (draft / ".secrets" / "token.txt").write_text("hf_x")
    left_out: dict[str, str] = {}
    assert sorted(local_files(draft, left_out)) == sorted(
        ["README.md", "config.json", "dsparkhub_provenance.json", "model-00001-of-00002.safetensors",
         "model-00002-of-00002.safetensors", "model.safetensors.index.json", "sub/plot.png"])
    assert sorted(x.split(" ")[0] for x in left_out) == [".env", ".secrets/token.txt", "optimizer.safetensors",
                                                          "pytorch_model.bin", "training_state.rank0.pt"]


def test_a_deepspec_training_folder_is_not_pushed_without_force(local_hub, tmp_path):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    step = run / "step_latest"
    with pytest.raises(ConversionRefusedError, match="training layout"):
        push(step, "alice/train", endpoint=local_hub.url, target=str(target))
    report = push(step, "alice/train", endpoint=local_hub.url, target=str(target), force=True, dry_run=True)
    assert report.forced and not any("training_state" in f.path for f in report.plan.files)


def test_real_convert_validate_and_push_against_a_hub_target(local_hub, tmp_path):
    """No scripted validation: the lead's convert + validate, with the target read from the Hub by header reads."""
    from huggingface_hub import HfApi

    from dsparkhub.convert import convert
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    make_qwen3_target(tmp_path / "target")
    make_deepspec_drafter(tmp_path / "run", tmp_path / "target")
    convert(tmp_path / "run", tmp_path / "out", tmp_path / "target")
    api = HfApi(endpoint=local_hub.url, token=TOKEN)
    api.create_repo("alice/tiny-target")
    api.upload_folder(repo_id="alice/tiny-target", folder_path=str(tmp_path / "target"))
    local_hub.clear_requests()

    res = CliRunner().invoke(main, ["push", str(tmp_path / "out"), "--repo", "alice/tiny-dspark", "--endpoint",
                                    local_hub.url, "--target", "alice/tiny-target"])
    assert res.exit_code == 0, res.output
    assert "validation: ok" in res.output and "remote check: ok" in res.output
    target_gets = [r for r in local_hub.requests if r.method == "GET" and r.path.startswith("/alice/tiny-target/")
                   and r.path.endswith(".safetensors")]
    assert target_gets and all(r.range for r in target_gets)  # the target's weights were never downloaded
    description = local_hub.commits("alice/tiny-dspark")[0]["description"]
    assert '"command": "convert"' in description and '"name": "step_' in description
    assert str(tmp_path) not in description  # provenance names folders, never where they lie
    assert set(local_hub.files("alice/tiny-dspark")) == {".gitattributes", "config.json", "model.safetensors",
                                                         "dsparkhub_provenance.json"}

    # a broken drafter is refused before any write
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    cfg["target_layer_ids"] = [0, 7]
    (tmp_path / "out" / "config.json").write_text(json.dumps(cfg))
    local_hub.clear_requests()
    res = CliRunner().invoke(main, ["push", str(tmp_path / "out"), "--repo", "alice/tiny-dspark", "--endpoint",
                                    local_hub.url, "--target", "alice/tiny-target"])
    assert res.exit_code == 1 and "ValidationFailedError" in res.output and "--force" in res.output
    assert local_hub.writes == []


# ---- remote headers ---------------------------------------------------------------------------------------------


def test_remote_checkpoint_headers_sharded_reads_headers_only(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/h", endpoint=hub.url)
    hub.clear_requests()
    config, tensors, index = remote_checkpoint_headers("alice/h", endpoint=hub.url, cache_dir=tmp_path / "c")
    assert config["block_size"] == 7
    assert tensors["fc.weight"] == ("F32", (32, 96), "model-00001-of-00002.safetensors")
    assert tensors["layers.0.mlp.down_proj.weight"] == ("BF16", (32, 64), "model-00002-of-00002.safetensors")
    assert set(tensors) == set(index["weight_map"])
    weight_gets = [r for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors")]
    assert weight_gets and all(r.range for r in weight_gets)  # never a whole weights file

    ckpt = remote_checkpoint("alice/h", endpoint=hub.url, cache_dir=tmp_path / "c")
    assert ckpt.remote and ckpt.path == f"hub:alice/h@{hub.head('alice/h')}"
    assert ckpt.tensors["norm.weight"].nbytes == 32 * 4
    assert ckpt.files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_remote_checkpoint_headers_single_file_and_revision(hub, tmp_path):
    hub.create_repo("alice/one")
    path = tmp_path / "m.safetensors"
    save_file({"embed_tokens.weight": torch.zeros(16, 8, dtype=torch.float16)}, str(path))
    first = hub.put_files("alice/one", {"config.json": b'{"hidden_size": 8}', "model.safetensors": path.read_bytes()})
    hub.put_files("alice/one", {"config.json": b'{"hidden_size": 9}'})
    config, tensors, index = remote_checkpoint_headers("alice/one", revision=first, endpoint=hub.url,
                                                       cache_dir=tmp_path / "c")
    assert config == {"hidden_size": 8} and index is None
    assert tensors == {"embed_tokens.weight": ("F16", (16, 8), "model.safetensors")}


def test_remote_checkpoint_other_safetensors_name_and_no_progress_bar(hub, tmp_path, capfd):
    """Neither model.safetensors nor an index: each top-level *.safetensors is read (as for a local folder); the
    library's progress bar over shards stays off (dsparkhub prints nothing while reading headers)."""
    hub.create_repo("alice/other")
    path = tmp_path / "w.safetensors"
    save_file({"norm.weight": torch.zeros(8, dtype=torch.bfloat16)}, str(path))
    hub.put_files("alice/other", {"config.json": b"{}", "weights.safetensors": path.read_bytes()})
    capfd.readouterr()
    _, tensors, index = remote_checkpoint_headers("alice/other", endpoint=hub.url, cache_dir=tmp_path / "c")
    assert tensors == {"norm.weight": ("BF16", (8,), "weights.safetensors")} and index is None
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/bars", endpoint=hub.url)
    capfd.readouterr()
    remote_checkpoint_headers("alice/bars", endpoint=hub.url, cache_dir=tmp_path / "c")
    assert "Parse safetensors files" not in capfd.readouterr().err


def test_repo_id_rule_is_huggingface_hubs_plus_a_namespace():
    from dsparkhub.repo_ids import is_repo_id

    assert is_repo_id("Qwen/Qwen3-8B") and is_repo_id("org/x_1.v2")
    assert not is_repo_id("tiny") and not is_repo_id("a/b/c") and not is_repo_id("ns/x.git")
    assert not is_repo_id("Qwen/Qwen3-8B@main") and is_repo_id("Qwen/Qwen3-8B@main", revision=True)
    assert is_repo_id("o/n@refs/pr/1", revision=True) and not is_repo_id("o/n@", revision=True)
    assert not is_repo_id("o/n@a b", revision=True) and not is_repo_id(None)


def test_remote_checkpoint_errors(hub, tmp_path, monkeypatch):
    hub.create_repo("alice/noweights")
    hub.put_files("alice/noweights", {"config.json": b"{}"})
    with pytest.raises(CheckpointNotFoundError, match="no model.safetensors"):
        remote_checkpoint_headers("alice/noweights", endpoint=hub.url, cache_dir=tmp_path / "c")
    hub.create_repo("alice/secret", private=True)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubError, match="not found, or this token cannot see it"):
        remote_checkpoint_headers("alice/secret", endpoint=hub.url, cache_dir=tmp_path / "c")


# ---- CLI --------------------------------------------------------------------------------------------------------


def test_cli_push_prints_plan_and_result_without_token(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    runner = CliRunner()
    res = runner.invoke(main, ["push", str(draft), "--repo", "alice/cli", "--endpoint", hub.url, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "dry run: nothing was written" in res.output and "model-00001-of-00002.safetensors" in res.output
    assert hub.writes == []
    res = runner.invoke(main, ["push", str(draft), "--repo", "alice/cli", "--endpoint", hub.url])
    assert res.exit_code == 0, res.output
    head = hub.head("alice/cli")
    assert f"commit: {hub.url}/alice/cli/commit/{head}" in res.output
    assert "remote check: ok" in res.output and "bytes uploaded:" in res.output
    assert "add" in res.output and "KiB" in res.output
    res = runner.invoke(main, ["push", str(draft), "--repo", "alice/cli", "--endpoint", hub.url])
    assert res.exit_code == 0 and "no commit made, 0 bytes uploaded" in res.output
    res = runner.invoke(main, ["push", str(draft), "--repo", "alice/cli", "--endpoint", hub.url, "--json"])
    assert json.loads(res.output)["plan"]["files"][0]["action"] == "unchanged"
    for r in (res,):
        assert TOKEN not in r.output
    assert all(TOKEN not in c["summary"] + c["description"] for c in hub.commits("alice/cli"))


@pytest.mark.parametrize("debug", [False, True])
def test_cli_failures_never_show_the_token(hub, tmp_path, monkeypatch, debug):
    draft = make_drafter(tmp_path / "draft")
    runner = CliRunner()
    pre = ["--debug"] if debug else []
    hub.inject(method="POST", path=r"/commit/", status=403, count=1, message=f"forbidden for token {TOKEN}")
    res = runner.invoke(main, pre + ["push", str(draft), "--repo", "alice/f", "--endpoint", hub.url])
    assert res.exit_code == 1
    assert "HTTP 403" in res.output and TOKEN not in res.output
    if debug:
        assert "Traceback" in res.output
    wrong = "hf_FAKEwrongtoken0123456789abcdefg"
    monkeypatch.setenv("HF_TOKEN", wrong)
    res = runner.invoke(main, pre + ["push", str(draft), "--repo", "alice/f", "--endpoint", hub.url])
    assert res.exit_code == 1 and "401" in res.output and wrong not in res.output
    res = runner.invoke(main, pre + ["push", str(draft), "--repo", "not-a-repo-id", "--endpoint", hub.url])
    assert res.exit_code == 1 and "invalid Hub repo id" in res.output


def test_push_refuses_when_the_repo_moved_since_the_reviewed_dry_run(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/m", endpoint=hub.url)
    (draft / "config.json").write_text('{"a": 1}')
    reviewed = push(draft, "alice/m", endpoint=hub.url, dry_run=True).plan.parent_commit
    other = make_drafter(tmp_path / "other", seed=7)  # someone else pushes in between
    push(other, "alice/m", endpoint=hub.url)
    moved = hub.head("alice/m")
    assert moved != reviewed
    hub.clear_requests()
    with pytest.raises(HubError, match="has moved since the plan you reviewed"):
        push(draft, "alice/m", endpoint=hub.url, expect_head=reviewed)
    assert hub.writes == [] and hub.head("alice/m") == moved
    report = push(draft, "alice/m", endpoint=hub.url, expect_head=moved[:12])
    assert report.committed and report.plan.parent_commit == moved


def test_a_mistyped_local_target_folder_is_named_as_such(local_hub, tmp_path, monkeypatch):
    """`--target ex/targt` next to a local `ex/`: the error says no such folder (a typo?), not a push failure."""
    from dsparkhub.errors import CheckpointNotFoundError
    from dsparkhub.target import open_target

    (tmp_path / "ex").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="no local folder ex/targt .*a typo") as err:
        open_target("ex/targt")
    assert "nothing was committed" not in str(err.value)
    with pytest.raises(HubError, match="cannot read the headers of nobody/sometarget"):
        open_target("nobody/sometarget")


def test_pickle_and_training_state_names_are_matched_loosely(tmp_path):
    draft = make_drafter(tmp_path / "draft")
    for name in ("b.pickle", "c.PKL", "w.Bin"):
        (draft / name).write_bytes(b"x")
    left_out: dict[str, str] = {}
    files = local_files(draft, left_out)
    assert not {"b.pickle", "c.PKL", "w.Bin"} & set(files)
    assert sorted(x.split(" ")[0] for x in left_out) == ["b.pickle", "c.PKL", "w.Bin"]


def test_a_hub_target_is_read_from_the_push_endpoint(local_hub, tmp_path):
    """`push --endpoint URL --target ns/name`: the target's headers come from URL (a second Hub here, not the
    default one the fixture points huggingface_hub at) with the push's token."""
    from huggingface_hub import HfApi

    from dsparkhub.convert import convert
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    out = tmp_path / "conv"
    convert(make_deepspec_drafter(tmp_path / "run", target), out, target)
    with LocalHub(tmp_path / "hub2", tokens={TOKEN: "alice"}) as other:
        api = HfApi(endpoint=other.url, token=TOKEN)
        api.create_repo("alice/tgt")
        api.upload_folder(folder_path=str(target), repo_id="alice/tgt")
        report = push(out, "alice/conv", endpoint=other.url, token=TOKEN, target="alice/tgt", dry_run=True)
    assert report.validation["ok"], report.validation


# ---- hf upload semantics, release checks (issue 13) ------------------------------------------------------------


def test_include_exclude_commit_message_and_token_follow_hf_upload(hub, tmp_path, monkeypatch):
    draft = make_drafter(tmp_path / "draft")
    (draft / "notes.txt").write_text("scratch")
    monkeypatch.delenv("HF_TOKEN")
    res = CliRunner().invoke(main, ["push", str(draft), "--repo", "alice/f", "--endpoint", hub.url, "--token", TOKEN,
                                    "--exclude", "*.txt", "--commit-message", "release 1",
                                    "--commit-description", "first cut"])
    assert res.exit_code == 0, res.output
    assert "notes.txt" not in hub.files("alice/f") and "config.json" in hub.files("alice/f")
    commit = hub.commits("alice/f")[0]
    assert commit["summary"] == "release 1" and commit["description"].startswith("first cut\n")
    assert TOKEN not in res.output
    report = push(draft, "alice/f", endpoint=hub.url, token=TOKEN, include=["notes.txt"])
    assert [(f.path, f.action) for f in report.plan.changes] == [("notes.txt", "add")]
    assert {f.path for f in report.plan.by_action("keep")} >= {"config.json", "README.md"}  # not pushed: kept
    with pytest.raises(CheckpointNotFoundError, match="no file of the folder matches"):
        push(draft, "alice/f", endpoint=hub.url, token=TOKEN, include=["*.nothing"])


def test_create_pr_opens_a_pull_request_and_leaves_main_alone(hub, tmp_path):
    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/pr", endpoint=hub.url)
    main_head = hub.head("alice/pr")
    make_drafter(draft, seed=1)
    report = push(draft, "alice/pr", endpoint=hub.url, create_pr=True)
    assert report.pr_url == f"{hub.url}/alice/pr/discussions/1"
    assert hub.head("alice/pr") == main_head  # main untouched
    assert hub.files("alice/pr", revision="refs/pr/1")["config.json"] == (draft / "config.json").read_bytes()
    res = CliRunner().invoke(main, ["push", str(draft), "--repo", "alice/pr", "--endpoint", hub.url, "--create-pr",
                                    "--revision", "dev"])
    assert res.exit_code == 2 and "--create-pr" in res.output


def test_a_card_whose_serve_command_names_a_placeholder_or_a_local_path_is_refused(hub, tmp_path):
    from dsparkhub.errors import CardError

    draft = make_drafter(tmp_path / "draft")
    for model in ("drafter", "<your-namespace>/draft", str(draft)):
        (draft / "README.md").write_text("# card\n\n```bash\nvllm serve Qwen/Qwen3-8B \\\n  --speculative-config "
                                         f"'{{\"model\": \"{model}\", \"method\": \"dspark\"}}'\n```\n")
        with pytest.raises(CardError, match="serve commands") as err:
            push(draft, "alice/card", endpoint=hub.url, dry_run=True)
        assert "--repo-id alice/card" in err.value.hint
    assert hub.writes == []
    (draft / "README.md").write_text("```bash\nvllm serve ./target --speculative-config '{\"model\": \"alice/card\"}'"
                                     "\n```\n")
    with pytest.raises(CardError, match="'./target' is a local path"):
        push(draft, "alice/card", endpoint=hub.url, dry_run=True)
    (draft / "README.md").write_text("```bash\nvllm serve Qwen/Qwen3-8B --speculative-config "
                                     "'{\"model\": \"alice/card\"}'\n```\n")
    assert push(draft, "alice/card", endpoint=hub.url).committed


def test_a_hand_written_readme_on_the_hub_is_not_replaced_silently(hub, tmp_path):
    from dsparkhub.card import CARD_MARKER
    from dsparkhub.errors import CardError

    draft = make_drafter(tmp_path / "draft")
    push(draft, "alice/hw", endpoint=hub.url)  # the Hub now holds the hand-written README
    (draft / "README.md").write_text(f"# generated card\n\n{CARD_MARKER}\n")
    with pytest.raises(CardError, match="did not write") as err:
        push(draft, "alice/hw", endpoint=hub.url, dry_run=True)
    assert "--delete README.md" in err.value.hint
    assert hub.files("alice/hw")["README.md"].startswith(b"---\nlicense")
    push(draft, "alice/hw", endpoint=hub.url, delete=["README.md"])  # said explicitly: replaced
    assert CARD_MARKER.encode() in hub.files("alice/hw")["README.md"]
    (draft / "README.md").write_text(f"# card, second version\n\n{CARD_MARKER}\n")
    assert push(draft, "alice/hw", endpoint=hub.url).committed  # a card dsparkhub wrote is replaced freely


# ---- what is pushed describes the weights: no NaN / Inf, fingerprints agree ---------------------------------------


def _converted_example(example, folder: Path) -> Path:
    from dsparkhub.convert import convert

    convert(example.dspark_step, folder, example.target)
    return folder


def _edit_weights(folder: Path, edit) -> str:
    """Rewrite one floating-point tensor of ``model.safetensors`` with ``edit(tensor)``; returns its name."""
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    name = next(k for k, v in sorted(tensors.items()) if v.dtype.is_floating_point and v.numel() >= 8)
    tensors[name] = edit(tensors[name].clone())
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return name


def test_hash_and_scan_counts_nan_and_inf_per_tensor_in_the_one_read(tmp_path, monkeypatch):
    """Every float dtype, elements split across chunks (a 5-byte chunk), the digests of the hash alone, one open."""
    import dsparkhub.io.hashing as hashing

    tensors, expected = {}, {}
    g = torch.Generator().manual_seed(0)
    for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn,
                               torch.float8_e5m2]):
        t = torch.randn(101 + i, generator=g)
        t[[3, 50, 100][: 1 + i % 3]] = float("nan")
        if dtype is not torch.float8_e4m3fn:  # e4m3fn has no Inf (saturates to NaN)
            t[7] = float("-inf")
        tensors[f"w{i}"] = t.to(dtype)
        expected[f"w{i}"] = int((~torch.isfinite(tensors[f"w{i}"].float())).sum())
    tensors["odd"] = torch.ones(3, dtype=torch.bfloat16)  # leaves the next tensors' elements unaligned
    tensors["ids"] = torch.tensor([-1, 2**31 - 1], dtype=torch.int32)  # integers are not looked at
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    (tmp_path / "config.json").write_text("{}")
    opened = []
    monkeypatch.setattr(hashing, "CHUNK", 5)
    monkeypatch.setattr(hashing, "open", lambda p, *a, **k: opened.append(p) or open(p, *a, **k), raising=False)
    hashes, found = hashing.hash_and_scan([path, tmp_path / "config.json"])
    assert {x.tensor: x.count for x in found} == expected and all(x.file == str(path) for x in found)
    w0 = next(x for x in found if x.tensor == "w0")
    assert w0.numel == 101 and w0.dtype == "F32"
    assert sorted(map(str, opened)) == sorted([str(path), str(tmp_path / "config.json")])  # read once each
    assert hashes == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in (path, tmp_path / "config.json")}


def test_nan_corrupted_weights_are_refused_naming_the_tensor(local_hub, tmp_path, example):
    draft = _converted_example(example, tmp_path / "draft")
    push(draft, "alice/clean", endpoint=local_hub.url, target=str(example.target), dry_run=True)  # clean: fine

    def poison(t):
        t.view(-1)[:5] = float("nan")
        t.view(-1)[5] = float("inf")
        return t

    name = _edit_weights(draft, poison)
    local_hub.clear_requests()
    with pytest.raises(CheckpointFormatError) as err:
        push(draft, "alice/nan", endpoint=local_hub.url, target=str(example.target))
    msg = str(err.value)
    assert f"model.safetensors tensor `{name}`" in msg and "6 of " in msg and "NaN / Inf" in msg
    assert "--force" in err.value.hint and local_hub.writes == []
    report = push(draft, "alice/nan", endpoint=local_hub.url, target=str(example.target), force=True)
    assert report.committed and report.forced and any("NaN / Inf" in n for n in report.notes)
    assert "FORCED past NaN / Inf in the weights" in local_hub.commits("alice/nan")[0]["summary"]


def test_weights_changed_after_verify_and_card_are_refused(local_hub, tmp_path, example):
    """A real card and results file of these weights push; after the weights change, both are named with the
    fingerprint they say and the one the weights hash to."""
    from test_card import make_results

    from dsparkhub.card.render import write_card
    from dsparkhub.hub.trust import fingerprint_claims
    from dsparkhub.io.ownership import RESULTS_SCHEMA_PREFIX
    from dsparkhub.io.hashing import checkpoint_fingerprint
    from dsparkhub.verify.results.schema import SCHEMA

    assert SCHEMA.startswith(RESULTS_SCHEMA_PREFIX)
    draft = _converted_example(example, tmp_path / "draft")
    old = checkpoint_fingerprint(draft)
    make_results(draft, draft / "results.json")
    write_card(draft, [draft / "results.json"], repo_id="alice/tiny-dspark", base_model="alice/tiny-target")
    claims = fingerprint_claims(local_files(draft))
    assert claims == [("README.md", old), ("results.json", old)]  # the card's line as the template writes it
    assert push(draft, "alice/tiny-dspark", endpoint=local_hub.url, target=str(example.target),
                dry_run=True).plan.files

    _edit_weights(draft, lambda t: t * 1.01)  # still finite: another drafter, measured by nobody
    new = checkpoint_fingerprint(draft)
    local_hub.clear_requests()
    with pytest.raises(ResultsError) as err:
        push(draft, "alice/tiny-dspark", endpoint=local_hub.url, target=str(example.target))
    msg = str(err.value)
    assert f"README.md says drafter fingerprint {old[:16]}" in msg
    assert f"results.json says drafter fingerprint {old[:16]}" in msg
    assert f"config.json + model.safetensors hash to fingerprint {new[:16]}" in msg
    assert "dsparkhub verify" in err.value.hint and "dsparkhub card" in err.value.hint
    assert "--force" in err.value.hint and local_hub.writes == []
