"""LocalHub speaks the protocol huggingface_hub 2.4 uses: every test drives it with the real ``HfApi`` client."""

from __future__ import annotations

import hashlib
import json

import httpx2
import pytest
import torch
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from safetensors.torch import save_file

from dsparkhub.testing import LocalHub
from dsparkhub.testing.hub_server.store import git_blob_sha1

ALICE = "hf_ALICEtoken0123456789abcdefghij"
BOB = "hf_BOBtoken0123456789abcdefghijkl"
READER = "hf_READERtoken0123456789abcdefgh"


@pytest.fixture
def hub(tmp_path):
    torch.set_num_threads(1)
    with LocalHub(tmp_path / "hub", tokens={ALICE: "alice", BOB: "bob", READER: "alice"}, orgs={"alice": ["acme"]},
                  read_only_tokens={READER}) as server, server.client_settings():
        yield server
        assert server.server_errors == []


@pytest.fixture
def no_retry_sleep(monkeypatch):
    """huggingface_hub retries dropped connections and 5xx with 1-8 s sleeps; make them instant."""
    import huggingface_hub.utils._http as http

    monkeypatch.setattr(http.time, "sleep", lambda s: None)


def _api(hub, token=ALICE):
    return HfApi(endpoint=hub.url, token=token)


def _weights(path, seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    save_file({"fc.weight": torch.randn(n, 32, generator=g), "norm.weight": torch.ones(32, dtype=torch.bfloat16)},
              str(path))
    return path


def test_whoami_checks_the_token(hub):
    assert _api(hub).whoami()["name"] == "alice"
    with pytest.raises(HfHubHTTPError) as err:
        _api(hub, "hf_WRONGtoken0123456789abcdefghij").whoami()
    assert err.value.response.status_code == 401
    assert [r.status for r in hub.requests] == [200, 401]
    assert all(r.user in ("alice", None) for r in hub.requests)


def test_create_repo_private_and_exist_ok(hub):
    url = _api(hub).create_repo("alice/drafter", private=True)
    assert url == f"{hub.url}/alice/drafter"
    assert hub.is_private("alice/drafter")
    with pytest.raises(HfHubHTTPError) as err:
        _api(hub).create_repo("alice/drafter")
    assert err.value.response.status_code == 409
    assert _api(hub).create_repo("alice/drafter", exist_ok=True).repo_id == "alice/drafter"
    # the Hub makes an initial commit holding .gitattributes
    assert list(hub.files("alice/drafter")) == [".gitattributes"]
    # private: invisible to another user and to anonymous requests
    with pytest.raises(RepositoryNotFoundError):
        _api(hub, BOB).model_info("alice/drafter")
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info("alice/drafter")
    assert _api(hub).model_info("alice/drafter").private is True


def test_write_permissions(hub):
    with pytest.raises(HfHubHTTPError) as err:
        _api(hub, BOB).create_repo("alice/x")
    assert err.value.response.status_code == 403
    _api(hub).create_repo("acme/x")  # alice's organisation
    with pytest.raises(HfHubHTTPError) as err:
        _api(hub, READER).create_commit("acme/x", [CommitOperationAdd("a.txt", b"a")], commit_message="m")
    assert err.value.response.status_code == 403
    assert list(hub.files("acme/x")) == [".gitattributes"]


def test_commit_lfs_and_regular_files_then_read_back(hub, tmp_path):
    api = _api(hub)
    api.create_repo("alice/m")
    w = _weights(tmp_path / "model.safetensors")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 32}))
    info = api.create_commit("alice/m", [CommitOperationAdd("model.safetensors", str(w)),
                                         CommitOperationAdd("sub/config.json", str(cfg))], commit_message="add")
    assert info.oid == hub.head("alice/m")
    assert hub.commits("alice/m")[0]["summary"] == "add"

    tree = {f.path: f for f in api.list_repo_tree("alice/m", recursive=True)}
    assert set(tree) == {".gitattributes", "model.safetensors", "sub", "sub/config.json"}
    wbytes, cbytes = w.read_bytes(), cfg.read_bytes()
    assert tree["model.safetensors"].size == len(wbytes)
    assert tree["model.safetensors"].lfs.sha256 == hashlib.sha256(wbytes).hexdigest()
    assert tree["sub/config.json"].lfs is None
    assert tree["sub/config.json"].blob_id == git_blob_sha1(cbytes)
    top = [f.path for f in api.list_repo_tree("alice/m")]
    assert top == [".gitattributes", "model.safetensors", "sub"]
    assert [f.path for f in api.get_paths_info("alice/m", ["sub/config.json", "nope"])] == ["sub/config.json"]

    cache = tmp_path / "cache"
    assert open(hf_hub_download("alice/m", "model.safetensors", endpoint=hub.url, token=ALICE,
                                cache_dir=cache), "rb").read() == wbytes
    snap = snapshot_download("alice/m", endpoint=hub.url, token=ALICE, cache_dir=tmp_path / "snap")
    assert (tmp_path / "snap").exists() and open(f"{snap}/sub/config.json", "rb").read() == cbytes

    meta = api.get_safetensors_metadata("alice/m")
    fc = meta.files_metadata["model.safetensors"].tensors["fc.weight"]
    assert (fc.dtype, fc.shape) == ("F32", [64, 32])
    assert meta.files_metadata["model.safetensors"].tensors["norm.weight"].dtype == "BF16"
    # headers come from Range requests, the weights are not downloaded for it
    ranged = [r for r in hub.requests if r.path.endswith("/model.safetensors") and r.range]
    assert ranged and all(r.status == 206 for r in ranged)


def test_lfs_object_already_stored_is_not_uploaded_again(hub, tmp_path):
    api = _api(hub)
    api.create_repo("alice/a")
    api.create_repo("alice/b")
    w = _weights(tmp_path / "w.safetensors")
    api.create_commit("alice/a", [CommitOperationAdd("w.safetensors", str(w))], commit_message="1")
    puts = [r for r in hub.requests if r.method == "PUT"]
    assert len(puts) == 1
    api.create_commit("alice/b", [CommitOperationAdd("copy.safetensors", str(w))], commit_message="2")
    assert len([r for r in hub.requests if r.method == "PUT"]) == 1
    assert hub.files("alice/b")["copy.safetensors"] == w.read_bytes()


def test_parent_commit_mismatch_is_412(hub):
    api = _api(hub)
    api.create_repo("alice/p")
    first = hub.head("alice/p")
    hub.put_files("alice/p", {"other.txt": b"concurrent"})
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit("alice/p", [CommitOperationAdd("a.txt", b"mine")], commit_message="m", parent_commit=first)
    assert err.value.response.status_code == 412
    assert set(hub.files("alice/p")) == {".gitattributes", "other.txt"}


def test_branches_refs_and_deletes(hub):
    api = _api(hub)
    api.create_repo("alice/br")
    hub.put_files("alice/br", {"a.txt": b"a", "b.txt": b"b"})
    api.create_branch("alice/br", branch="v1")
    with pytest.raises(HfHubHTTPError):
        api.create_branch("alice/br", branch="v1")
    api.create_branch("alice/br", branch="v1", exist_ok=True)
    api.create_commit("alice/br", [CommitOperationDelete("a.txt"), CommitOperationAdd("c.txt", b"c")],
                      commit_message="on v1", revision="v1")
    refs = {b.name: b.target_commit for b in api.list_repo_refs("alice/br").branches}
    assert refs == {"main": hub.head("alice/br"), "v1": hub.head("alice/br", "v1")}
    assert set(hub.files("alice/br", "v1")) == {".gitattributes", "b.txt", "c.txt"}
    assert set(hub.files("alice/br")) == {".gitattributes", "a.txt", "b.txt"}
    with pytest.raises(RevisionNotFoundError):
        api.model_info("alice/br", revision="nope")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit("alice/br", [CommitOperationDelete("missing.txt")], commit_message="m")
    assert err.value.response.status_code == 404


def test_range_reads(hub):
    _api(hub).create_repo("alice/r")
    data = bytes(range(256)) * 4
    hub.put_files("alice/r", {"blob.bin": data})
    url = f"{hub.url}/alice/r/resolve/main/blob.bin"
    r = httpx2.get(url, headers={"Range": "bytes=10-19", "Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 206 and r.content == data[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    r = httpx2.get(url, headers={"Range": "bytes=1000-5000", "Authorization": f"Bearer {ALICE}"})
    assert r.content == data[1000:]
    r = httpx2.get(url, headers={"Range": "bytes=5000-", "Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 416
    r = httpx2.head(url)
    assert r.headers["X-Linked-Etag"].strip('"') == hashlib.sha256(data).hexdigest()
    assert int(r.headers["X-Linked-Size"]) == len(data) and r.headers["X-Repo-Commit"] == hub.head("alice/r")


def test_request_log_classifies_writes(hub):
    api = _api(hub)
    api.create_repo("alice/log")
    list(api.list_repo_tree("alice/log"))
    api.get_paths_info("alice/log", [".gitattributes"])
    assert [(r.method, r.is_write) for r in hub.requests] == [("POST", True), ("GET", False), ("POST", False)]
    hub.clear_requests()
    assert hub.requests == []


def test_fault_status_is_count_limited(hub):
    api = _api(hub)
    fault = hub.inject(path=r"/api/whoami", status=403, count=1)
    with pytest.raises(HfHubHTTPError) as err:
        api.whoami()
    assert err.value.response.status_code == 403
    assert api.whoami()["name"] == "alice"
    assert fault.hits == 1


def test_fault_drop_mid_upload_keeps_repo_unchanged(hub, tmp_path, no_retry_sleep):
    api = _api(hub)
    api.create_repo("alice/d")
    head = hub.head("alice/d")
    w = _weights(tmp_path / "w.safetensors", n=512)
    fault = hub.inject(method="PUT", path=r"^/_lfs/", kind="drop", count=None)
    with pytest.raises(RuntimeError, match="uploading"):
        api.create_commit("alice/d", [CommitOperationAdd("w.safetensors", str(w))], commit_message="m")
    assert fault.hits == 6  # huggingface_hub's first try + 5 retries, each dropped
    assert hub.head("alice/d") == head and hub.lfs_objects() == set()
    assert all(r.status is None for r in hub.requests if r.method == "PUT")
    hub.clear_faults()
    api.create_commit("alice/d", [CommitOperationAdd("w.safetensors", str(w))], commit_message="m")
    assert hub.files("alice/d")["w.safetensors"] == w.read_bytes()


def test_fault_call_runs_before_serving(hub):
    api = _api(hub)
    api.create_repo("alice/c")
    hub.inject(method="POST", path=r"/commit/", kind="call",
               action=lambda: hub.put_files("alice/c", {"x.txt": b"x"}))
    api.create_commit("alice/c", [CommitOperationAdd("y.txt", b"y")], commit_message="m")
    assert set(hub.files("alice/c")) == {".gitattributes", "x.txt", "y.txt"}
    assert [c["summary"] for c in hub.commits("alice/c")] == ["m", "server-side commit", "initial commit"]


def test_unknown_route_and_server_bugs_are_loud(hub):
    r = httpx2.get(f"{hub.url}/api/spaces/alice/x")
    assert r.status_code == 404 and "no route" in r.json()["error"]
    with pytest.raises(ValueError):
        hub.inject(kind="explode")
    _api(hub).create_repo("alice/bug")
    r = httpx2.post(f"{hub.url}/api/models/alice/bug/preupload/main", json={"files": [{"size": 1}]},
                    headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 500 and "KeyError" in r.json()["error"]
    assert len(hub.server_errors) == 1
    hub.server_errors.clear()
