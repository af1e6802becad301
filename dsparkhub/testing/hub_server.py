"""A local Hugging Face Hub for tests: the HTTP protocol huggingface_hub 2.4 speaks, nothing more.

``LocalHub`` is a threaded stdlib HTTP server on ``127.0.0.1`` (random port) that answers the requests
``huggingface_hub.HfApi(endpoint=hub.url)`` makes for ``create_repo``, ``create_branch``, ``create_commit`` (the classic
preupload -> LFS batch -> PUT -> verify -> NDJSON commit path, used when ``HF_HUB_DISABLE_XET=1`` or ``hf_xet`` is
absent), ``repo_info`` / ``model_info``, ``list_repo_refs``, ``list_repo_tree``, ``get_paths_info``, ``whoami``,
``hf_hub_download`` / ``snapshot_download`` (``/resolve/`` HEAD and GET with the ETag / X-Repo-Commit / X-Linked-Etag /
X-Linked-Size headers) and ``get_safetensors_metadata`` (HTTP ``Range`` reads). Wire formats follow
huggingface_hub 2.4.0 ``_commit_api.py``, ``lfs.py``, ``hf_api.py`` and ``file_download.py``.

Storage: file bytes live on disk under ``root`` — LFS objects keyed by sha256 (``lfs/<sha256>``), regular files keyed
by their git blob sha1 (``git/<sha1>``); repositories, commits (oid, parent, tree) and branches live in memory.

For tests it records every request (:class:`HubRequest`: method, path, whether it is a write) and injects faults
(:meth:`LocalHub.inject`): an HTTP status (5xx / 401 / 403 ...), a dropped connection (for a PUT: after reading part
of the body, i.e. mid-upload), or a callable run before the request is served (to change the repo between a client's
plan and its commit). Faults are count-limited.

Pull requests: a commit with ``create_pr=1`` opens ``refs/pr/N`` from its parent commit (the branch is left alone) and
answers ``pullRequestUrl`` (``.../discussions/N``) as the Hub does; there is no discussion API.

Deliberately not implemented: xet storage, multipart LFS uploads, discussions / PR merging, tags, datasets and spaces,
pagination (one page), gated repos. Unknown routes answer 404 with a JSON error naming the route, so gaps show up
loudly.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores files of 10 MiB and more in LFS
DEFAULT_GITATTRIBUTES = "".join(
    f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
    for ext in ("safetensors", "bin", "pt", "pth", "ckpt", "h5", "msgpack", "onnx", "npy", "npz", "gguf", "zip",
                "tar", "gz", "pkl", "pickle", "model", "arrow", "parquet")
)
#: requests huggingface_hub makes on its own (utils/_detect_agent.py registry); answered 404, not logged.
_HOUSEKEEPING = frozenset({"/api/agent-harnesses"})
_ID_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub reports as a regular file's ``oid``):
    ``huggingface_hub.utils.sha.git_hash``."""
    from huggingface_hub.utils.sha import git_hash

    return git_hash(data)


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file text for an object (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class _Entry:
    size: int
    blob_id: str  # git sha1 of the content (regular file) or of the LFS pointer (LFS file)
    sha256: str | None = None  # set for LFS files

    @property
    def oid(self) -> str:
        """What preupload reports as the remote oid: sha256 for LFS files, git sha1 for regular ones."""
        return self.sha256 or self.blob_id


@dataclass
class _Commit:
    oid: str
    parent: str | None
    tree: dict[str, _Entry]
    summary: str
    description: str
    date: str


@dataclass
class _Repo:
    repo_id: str
    private: bool
    created: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)
    #: pull requests by number -> head commit of their ref ``refs/pr/N`` (kept apart from the branches)
    pulls: dict[int, str] = field(default_factory=dict)


@dataclass
class HubRequest:
    """One request the server received.

    ``is_write`` is True for every method other than GET / HEAD, except ``paths-info`` (a read sent as POST).
    ``status`` is None when the connection was dropped by an injected fault; ``range`` is the ``Range`` header, if
    any. The token is never recorded.
    """

    method: str
    path: str
    query: str
    is_write: bool
    user: str | None = None
    status: int | None = None
    range: str | None = None


@dataclass
class Fault:
    """An injected fault: requests whose method and path match get ``kind`` instead of a normal answer.

    ``kind``: ``"status"`` (answer ``status`` with a JSON error), ``"drop"`` (close the connection without an answer;
    for a request with a body, after reading half of it) or ``"call"`` (run ``action()`` then serve normally).
    ``count`` is how many matching requests are affected (None: all); ``hits`` how many were.
    """

    kind: str
    method: str | None
    path: re.Pattern
    status: int = 500
    count: int | None = 1
    message: str = "injected fault"
    action: Callable[[], object] | None = None
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or self.method == method) and bool(self.path.search(path))
                and (self.count is None or self.hits < self.count))


class _HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.extra = extra or {}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class LocalHub:
    """A local Hub server for tests (see the module docstring for what it speaks).

    Args:
        root: folder where LFS objects and git blobs are stored (created if missing).
        tokens: token -> user name. Requests carrying any other token get 401.
        orgs: user name -> organisations the user may write to (besides their own namespace).
        read_only_tokens: tokens (also listed in ``tokens``) that may read but get 403 on writes.

    Example::

        with LocalHub(tmp_path, tokens={"hf_aliceToken": "alice"}) as hub:
            api = HfApi(endpoint=hub.url, token="hf_aliceToken")
            api.create_repo("alice/drafter")
            assert [r.path for r in hub.writes] == ["/api/repos/create"]
    """

    def __init__(self, root: str | Path, *, tokens: dict[str, str] | None = None,
                 orgs: dict[str, list[str]] | None = None, read_only_tokens: set[str] | frozenset = frozenset()):
        self.root = Path(root)
        (self.root / "lfs").mkdir(parents=True, exist_ok=True)
        (self.root / "git").mkdir(parents=True, exist_ok=True)
        self.tokens = dict(tokens or {})
        self.orgs = {k: list(v) for k, v in (orgs or {}).items()}
        self.read_only_tokens = set(read_only_tokens)
        self.lfs_bytes_received = 0
        #: unexpected exceptions inside the server (each answered 500); tests can assert it stays empty.
        self.server_errors: list[str] = []
        self._repos: dict[str, _Repo] = {}
        self._requests: list[HubRequest] = []
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> LocalHub:
        """Start serving on 127.0.0.1 on a free port (see :attr:`url`)."""
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="LocalHub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @contextmanager
    def client_settings(self) -> Iterator[LocalHub]:
        """Point huggingface_hub's module-level settings at this server while the block runs, then restore them.

        Online (``HF_HUB_OFFLINE`` off: the server is local), xet off (the classic LFS path this server speaks),
        ``ENDPOINT`` and the resolve-URL template = :attr:`url` (a call that forgets ``endpoint=`` still cannot reach
        the real Hub), and the token file inside ``root`` (a developer's own login is never read).
        """
        from huggingface_hub import constants

        values = {"HF_HUB_OFFLINE": False, "HF_HUB_DISABLE_XET": True, "ENDPOINT": self.url,
                  "HUGGINGFACE_CO_URL_TEMPLATE": self.url + "/{repo_id}/resolve/{revision}/{filename}",
                  "HF_TOKEN_PATH": str(self.root / "token"), "HF_STORED_TOKENS_PATH": str(self.root / "tokens")}
        saved = {k: getattr(constants, k) for k in values if hasattr(constants, k)}
        try:
            for k, v in values.items():
                setattr(constants, k, v)
            yield self
        finally:
            for k in values:
                if k in saved:
                    setattr(constants, k, saved[k])
                else:
                    delattr(constants, k)

    @property
    def url(self) -> str:
        """Base URL to pass as ``endpoint`` to huggingface_hub (``http://127.0.0.1:<port>``)."""
        if self._server is None:
            raise RuntimeError("LocalHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ---- request log and faults -----------------------------------------------------------------------------

    @property
    def requests(self) -> list[HubRequest]:
        """A copy of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def writes(self) -> list[HubRequest]:
        """The requests that were writes (see :class:`HubRequest`)."""
        return [r for r in self.requests if r.is_write]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def inject(self, *, path: str = ".*", method: str | None = None, kind: str = "status", status: int = 500,
               count: int | None = 1, message: str = "injected fault",
               action: Callable[[], object] | None = None) -> Fault:
        """Make the next ``count`` requests matching ``method`` and the regex ``path`` fail (see :class:`Fault`).

        Raises:
            ValueError: ``kind`` is not ``"status"``, ``"drop"`` or ``"call"``, or ``"call"`` has no ``action``.
        """
        if kind not in ("status", "drop", "call"):
            raise ValueError(f"fault kind must be 'status', 'drop' or 'call', got {kind!r}")
        if kind == "call" and action is None:
            raise ValueError("a 'call' fault needs an action")
        fault = Fault(kind=kind, method=method.upper() if method else None, path=re.compile(path), status=status,
                      count=count, message=message, action=action)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    # ---- server-side helpers for tests (no HTTP) ------------------------------------------------------------

    def create_repo(self, repo_id: str, *, private: bool = False) -> None:
        """Create a repo with its initial commit (``.gitattributes``), as the Hub does.

        Raises:
            ValueError: ``repo_id`` is not ``namespace/name`` or already exists.
        """
        with self._lock:
            if repo_id in self._repos:
                raise ValueError(f"repo {repo_id} already exists")
            self._create_repo(repo_id, private)

    def put_files(self, repo_id: str, files: dict[str, bytes], *, revision: str = "main",
                  delete: tuple[str, ...] = (), message: str = "server-side commit") -> str:
        """Commit ``files`` (path -> bytes; LFS by the repo's rules) and ``delete`` directly; returns the commit oid."""
        with self._lock:
            repo = self._repos[repo_id]
            head = repo.branches[revision]
            tree = dict(repo.commits[head].tree)
            for path in delete:
                tree.pop(path)
            for path, data in files.items():
                if self._is_lfs(repo, tree, path, len(data), data[:512]):
                    sha = hashlib.sha256(data).hexdigest()
                    self._store_lfs(sha, data)
                    tree[path] = _Entry(len(data), git_blob_sha1(lfs_pointer(sha, len(data))), sha)
                else:
                    tree[path] = _Entry(len(data), self._store_git(data))
            return self._commit(repo, revision, tree, message, "")

    def head(self, repo_id: str, revision: str = "main") -> str:
        """The commit oid a branch points to."""
        with self._lock:
            return self._repos[repo_id].branches[revision]

    def branches(self, repo_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._repos[repo_id].branches)

    def is_private(self, repo_id: str) -> bool:
        with self._lock:
            return self._repos[repo_id].private

    def commits(self, repo_id: str, revision: str = "main") -> list[dict]:
        """The history of a branch, newest first: ``{oid, parent, summary, description}`` each."""
        with self._lock:
            repo = self._repos[repo_id]
            out, oid = [], repo.branches[revision]
            while oid is not None:
                c = repo.commits[oid]
                out.append({"oid": c.oid, "parent": c.parent, "summary": c.summary, "description": c.description})
                oid = c.parent
            return out

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Every file of a branch (or commit) with its bytes."""
        with self._lock:
            repo = self._repos[repo_id]
            pr = re.fullmatch(r"refs/pr/(\d+)", revision)
            oid = repo.pulls[int(pr.group(1))] if pr else repo.branches.get(revision, revision)
            tree = repo.commits[oid].tree
            return {p: self._read(e) for p, e in tree.items()}

    def lfs_objects(self) -> set[str]:
        """sha256 of every LFS object stored (uploaded and verified, committed or not)."""
        return {p.name for p in (self.root / "lfs").iterdir() if len(p.name) == 64}

    # ---- internals (call with the lock held) ----------------------------------------------------------------

    def _create_repo(self, repo_id: str, private: bool) -> _Repo:
        repo = _Repo(repo_id=repo_id, private=private, created=_now())
        self._repos[repo_id] = repo
        tree = {".gitattributes": _Entry(len(DEFAULT_GITATTRIBUTES), self._store_git(DEFAULT_GITATTRIBUTES.encode()))}
        self._commit(repo, "main", tree, "initial commit", "")
        return repo

    def _commit(self, repo: _Repo, branch: str, tree: dict[str, _Entry], summary: str, description: str) -> str:
        oid = self._commit_on(repo, repo.branches.get(branch), tree, summary, description)
        repo.branches[branch] = oid
        return oid

    def _commit_on(self, repo: _Repo, parent: str | None, tree: dict[str, _Entry], summary: str,
                   description: str) -> str:
        """A commit with ``parent`` that no branch points at yet (pull requests keep their own refs)."""
        self._counter += 1
        listing = "".join(f"{p} {e.blob_id}\n" for p, e in sorted(tree.items()))
        oid = hashlib.sha1(f"{parent}\n{listing}{summary}\n{self._counter}\n{time.time_ns()}".encode()).hexdigest()
        repo.commits[oid] = _Commit(oid, parent, dict(tree), summary, description, _now())
        return oid

    def _store_git(self, data: bytes) -> str:
        sha1 = git_blob_sha1(data)
        path = self.root / "git" / sha1
        if not path.exists():
            _atomic_write(path, data)
        return sha1

    def _store_lfs(self, sha256: str, data: bytes) -> None:
        path = self.root / "lfs" / sha256
        if not path.exists():
            _atomic_write(path, data)

    def _lfs_size(self, sha256: str) -> int | None:
        path = self.root / "lfs" / sha256
        return path.stat().st_size if re.fullmatch(r"[0-9a-f]{64}", sha256) and path.exists() else None

    def _read(self, entry: _Entry) -> bytes:
        sub = ("lfs", entry.sha256) if entry.sha256 else ("git", entry.blob_id)
        return (self.root / sub[0] / sub[1]).read_bytes()

    def _is_lfs(self, repo: _Repo, tree: dict[str, _Entry], path: str, size: int, sample: bytes) -> bool:
        if size >= LFS_SIZE_THRESHOLD or b"\0" in sample:
            return True
        attributes = tree.get(".gitattributes")
        text = self._read(attributes).decode(errors="replace") if attributes else ""
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and "filter=lfs" in parts[1:]:
                pattern = parts[0]
                target = path if "/" in pattern else path.rsplit("/", 1)[-1]
                if fnmatch.fnmatch(target, pattern.lstrip("/")):
                    return True
        return False


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _Handler(BaseHTTPRequestHandler):
    """Routes one request to the LocalHub it is bound to (``hub`` class attribute)."""

    hub: LocalHub
    protocol_version = "HTTP/1.1"
    server_version = "dsparkhub-LocalHub/1"

    def log_message(self, format, *args):  # noqa: A002 - silence the stdlib's stderr access log
        pass

    def do_GET(self):
        self._handle("GET")

    def do_HEAD(self):
        self._handle("HEAD")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    # ---- plumbing -------------------------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        self._query = parse_qs(split.query)
        self._body: bytes | None = None
        self._token: str | None = None  # the handler object lives as long as the keep-alive connection
        is_write = method not in ("GET", "HEAD") and "/paths-info/" not in split.path
        record = HubRequest(method=method, path=split.path, query=split.query, is_write=is_write,
                            range=self.headers.get("Range"))
        if split.path in _HOUSEKEEPING:  # asked by huggingface_hub itself once per process, not by the code tested
            self._reply(method, 404, {"error": "not served by LocalHub"}, {})
            return
        with self.hub._lock:
            self.hub._requests.append(record)
        try:
            user = self._user()
            record.user = user
            fault = self.hub._take_fault(method, split.path)
            if fault is not None and fault.kind == "drop":
                self._drop()
                return
            if fault is not None and fault.kind == "status":
                raise _HttpError(fault.status, fault.message)
            if fault is not None and fault.kind == "call":
                fault.action()
            segments = [unquote(s) for s in split.path.split("/")[1:]]
            status, payload, headers = self._route(method, segments, user)
        except _HttpError as err:
            status, headers = err.status, dict(err.headers)
            payload = {"error": err.message, **err.extra}
            headers.setdefault("X-Error-Message", err.message)
            if err.code:
                headers["X-Error-Code"] = err.code
        except Exception as exc:  # noqa: BLE001 - the server boundary: a bug here must reach the test as a 500
            with self.hub._lock:
                self.hub.server_errors.append(f"{method} {split.path}: {type(exc).__name__}: {exc}")
            status, headers = 500, {"X-Error-Message": f"LocalHub bug: {type(exc).__name__}"}
            payload = {"error": f"LocalHub bug: {type(exc).__name__}: {exc}"}
        record.status = status
        self._reply(method, status, payload, headers)

    def _reply(self, method: str, status: int, payload, headers: dict) -> None:
        if isinstance(payload, (bytes, bytearray)):
            body = bytes(payload)
            headers.setdefault("Content-Type", "application/octet-stream")
        else:
            body = json.dumps(payload).encode()
            headers.setdefault("Content-Type", "application/json")
        if self._body is None and method in ("POST", "PUT"):
            self._read_body()  # keep the connection usable: consume what we did not need
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def _drop(self) -> None:
        """Close the connection without an answer; for a request with a body, after reading half of it."""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(max(1, length // 2))
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_body(self) -> bytes:
        if self._body is not None:
            return self._body
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self._body = b"".join(chunks)
        else:
            self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return self._body

    def _json(self) -> dict:
        try:
            return json.loads(self._read_body() or b"{}")
        except json.JSONDecodeError as exc:
            raise _HttpError(400, f"request body is not JSON: {exc}") from None

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization")
        if not auth:
            return None
        token = auth.split(" ", 1)[1].strip() if auth.lower().startswith("bearer ") else auth.strip()
        user = self.hub.tokens.get(token)
        if user is None:
            raise _HttpError(401, "Invalid credentials in Authorization header")
        self._token = token
        return user

    # ---- access ---------------------------------------------------------------------------------------------

    def _repo(self, ns: str, name: str, user: str | None, *, write: bool = False) -> _Repo:
        repo_id = f"{ns}/{name}"
        repo = self.hub._repos.get(repo_id)
        visible = repo is not None and (not repo.private or (user is not None and self._may_write(user, ns)))
        if not visible:
            raise _HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        if write:
            self._check_write(user, ns)
        return repo

    def _may_write(self, user: str, ns: str) -> bool:
        return ns == user or ns in self.hub.orgs.get(user, [])

    def _check_write(self, user: str | None, ns: str) -> None:
        if user is None:
            raise _HttpError(401, "You must be authenticated to write (no token sent)")
        if self._token in self.hub.read_only_tokens:
            raise _HttpError(403, "This token has read access only")
        if not self._may_write(user, ns):
            raise _HttpError(403, f"You don't have the rights to write to the namespace {ns}")

    def _resolve(self, repo: _Repo, revision: str) -> _Commit:
        pr = re.fullmatch(r"refs/pr/(\d+)", revision)
        oid = (repo.pulls.get(int(pr.group(1))) if pr else repo.branches.get(revision)) or (
            revision if revision in repo.commits else None)
        if oid is None:
            raise _HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    # ---- routes ---------------------------------------------------------------------------------------------

    def _route(self, method: str, s: list[str], user: str | None):
        hub = self.hub
        if len(s) == 4 and s[0] == "_lfs" and method == "PUT":
            return self._lfs_put(s[1], s[2], s[3])
        with hub._lock:
            if s[:1] == ["api"]:
                if s == ["api", "whoami-v2"] and method == "GET":
                    if user is None:
                        raise _HttpError(401, "Invalid credentials in Authorization header")
                    return 200, {"type": "user", "name": user,
                                 "orgs": [{"name": o} for o in hub.orgs.get(user, [])],
                                 "auth": {"type": "access_token", "accessToken": {
                                     "role": "read" if self._token in hub.read_only_tokens else "write"}}}, {}
                if s == ["api", "repos", "create"] and method == "POST":
                    return self._create_repo(user)
                if s == ["api", "validate-yaml"] and method == "POST":
                    return 200, {"errors": [], "warnings": []}, {}
                if len(s) >= 4 and s[1] == "models":
                    return self._model_route(method, s[2], s[3], s[4:], user)
            elif len(s) == 5 and s[0] == "_lfs" and s[4] == "verify" and method == "POST":
                repo = self._repo(s[1], s[2], user, write=True)
                size = hub._lfs_size(s[3])
                if size is None or size != self._json().get("size"):
                    raise _HttpError(404, f"LFS object {s[3]} not found in {repo.repo_id}")
                return 200, {"success": True}, {}
            elif len(s) == 6 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "batch"]:
                return self._lfs_batch(s[0], s[1][: -len(".git")], user)
            elif len(s) >= 5 and s[2] == "resolve" and method in ("GET", "HEAD"):
                return self._resolve_file(method, s[0], s[1], s[3], "/".join(s[4:]), user)
        raise _HttpError(404, f"LocalHub has no route for {method} {'/'.join([''] + s)}")

    def _model_route(self, method: str, ns: str, name: str, rest: list[str], user: str | None):
        if method == "GET" and (rest == [] or (len(rest) == 2 and rest[0] == "revision")):
            repo = self._repo(ns, name, user)
            commit = self._resolve(repo, rest[1] if rest else "main")
            return 200, {"id": repo.repo_id, "author": ns, "sha": commit.oid, "private": repo.private,
                         "lastModified": commit.date, "createdAt": repo.created, "tags": [], "downloads": 0,
                         "likes": 0, "siblings": [{"rfilename": p} for p in sorted(commit.tree)]}, {}
        if method == "GET" and rest == ["refs"]:
            repo = self._repo(ns, name, user)
            return 200, {"branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid}
                                      for b, oid in sorted(repo.branches.items())],
                         "converts": [], "tags": [],
                         "pullRequests": [{"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": oid}
                                          for n, oid in sorted(repo.pulls.items())]}, {}
        if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
            repo = self._repo(ns, name, user)
            recursive = self._query.get("recursive", ["False"])[0].lower() in ("1", "true")
            return 200, self._tree(self._resolve(repo, rest[1]), "/".join(rest[2:]).strip("/"), recursive), {}
        if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
            repo = self._repo(ns, name, user)
            commit = self._resolve(repo, rest[1])
            form = parse_qs(self._read_body().decode())
            out = []
            for path in form.get("paths", []):
                path = path.strip("/")
                if path in commit.tree:
                    out.append(self._file_info(path, commit.tree[path]))
                elif any(p.startswith(path + "/") for p in commit.tree):
                    out.append({"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()})
            return 200, out, {}
        if method == "POST" and len(rest) == 2 and rest[0] == "branch":
            repo = self._repo(ns, name, user, write=True)
            if rest[1] in repo.branches:
                raise _HttpError(409, f"Reference refs/heads/{rest[1]} already exists")
            start = self._resolve(repo, self._json().get("startingPoint") or "main")
            repo.branches[rest[1]] = start.oid
            return 200, {}, {}
        if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return self._preupload(ns, name, rest[1], user)
        if method == "POST" and len(rest) == 2 and rest[0] == "commit":
            return self._commit(ns, name, rest[1], user)
        raise _HttpError(404, f"LocalHub has no route for {method} /api/models/{ns}/{name}/{'/'.join(rest)}")

    def _create_repo(self, user: str | None):
        payload = self._json()
        if user is None:
            raise _HttpError(401, "You must be authenticated to create a repo")
        if payload.get("type", "model") not in (None, "model"):
            raise _HttpError(400, "LocalHub only hosts model repos")
        ns = payload.get("organization") or user
        name = payload.get("name") or ""
        if not (_ID_SEGMENT.match(ns) and _ID_SEGMENT.match(name)):
            raise _HttpError(400, f"Invalid repo name {ns}/{name}")
        self._check_write(user, ns)
        repo_id = f"{ns}/{name}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub._repos:
            raise _HttpError(409, "You already created this model repo", extra={"url": url})
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.hub._create_repo(repo_id, private)
        return 200, {"url": url, "name": repo_id}, {}

    def _file_info(self, path: str, entry: _Entry) -> dict:
        info = {"type": "file", "oid": entry.blob_id, "size": entry.size, "path": path}
        if entry.sha256:
            info["lfs"] = {"oid": entry.sha256, "size": entry.size,
                           "pointerSize": len(lfs_pointer(entry.sha256, entry.size))}
        return info

    def _tree(self, commit: _Commit, prefix: str, recursive: bool) -> list[dict]:
        base = prefix + "/" if prefix else ""
        if prefix and prefix not in commit.tree and not any(p.startswith(base) for p in commit.tree):
            raise _HttpError(404, f"Path {prefix} not found", "EntryNotFound")
        out, folders = [], set()
        for path in sorted(commit.tree):
            if not path.startswith(base):
                continue
            rel = path[len(base):]
            parts = rel.split("/")
            for depth in range(1, len(parts)):
                folder = base + "/".join(parts[:depth])
                if (recursive or depth == 1) and folder not in folders:
                    folders.add(folder)
                    out.append({"type": "directory", "path": folder,
                                "oid": hashlib.sha1(folder.encode()).hexdigest()})
            if recursive or len(parts) == 1:
                out.append(self._file_info(path, commit.tree[path]))
        return out

    def _preupload(self, ns: str, name: str, revision: str, user: str | None):
        repo = self._repo(ns, name, user, write=True)
        commit = self._resolve(repo, revision)
        payload = self._json()
        ignore = [ln.strip() for ln in (payload.get("gitIgnore") or "").splitlines()
                  if ln.strip() and not ln.startswith("#")]
        files = []
        for item in payload.get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample") or "")
            lfs = self.hub._is_lfs(repo, commit.tree, path, size, sample)
            existing = commit.tree.get(path)
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular",
                          "shouldIgnore": any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.rsplit("/", 1)[-1], p)
                                              for p in ignore),
                          "oid": existing.oid if existing else None})
        return 200, {"files": files, "commitOid": commit.oid}, {}

    def _lfs_batch(self, ns: str, name: str, user: str | None):
        repo = self._repo(ns, name, user, write=True)
        payload = self._json()
        if payload.get("operation") != "upload":
            raise _HttpError(400, "LocalHub's LFS batch endpoint only answers uploads")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = str(obj["oid"]), int(obj["size"])
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "oid is not a sha256"}})
            elif self.hub._lfs_size(oid) == size:
                objects.append({"oid": oid, "size": size})  # already stored: no actions, the client skips it
            else:
                href = f"{self.hub.url}/_lfs/{repo.repo_id}/{oid}"
                objects.append({"oid": oid, "size": size, "authenticated": True,
                                "actions": {"upload": {"href": href, "header": {}},
                                            "verify": {"href": href + "/verify", "header": {}}}})
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}, {
            "Content-Type": "application/vnd.git-lfs+json"}

    def _lfs_put(self, ns: str, name: str, oid: str):
        """The upload href the batch answer handed out; like a presigned URL, it carries no token."""
        data = self._read_body()  # outside the lock: uploads run in parallel
        digest = hashlib.sha256(data).hexdigest()
        with self.hub._lock:
            if f"{ns}/{name}" not in self.hub._repos:
                raise _HttpError(404, f"Repository {ns}/{name} not found", "RepoNotFound")
            if digest != oid:
                raise _HttpError(400, f"uploaded bytes have sha256 {digest}, expected {oid} ({len(data)} bytes)")
            self.hub._store_lfs(oid, data)
            self.hub.lfs_bytes_received += len(data)
        return 200, b"", {}

    def _commit(self, ns: str, name: str, revision: str, user: str | None):
        repo = self._repo(ns, name, user, write=True)
        create_pr = self._query.get("create_pr", ["0"])[0] in ("1", "true", "True")
        if revision not in repo.branches:
            raise _HttpError(404, f"Invalid rev id: {revision} (commits go to a branch)", "RevisionNotFound")
        try:
            lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise _HttpError(400, f"commit payload is not NDJSON: {exc}") from None
        if not lines or lines[0].get("key") != "header":
            raise _HttpError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        head = repo.branches[revision]
        parent = header.get("parentCommit")
        if create_pr:  # the Hub opens the PR from parentCommit (else the head) and leaves the branch alone
            if parent is not None and parent not in repo.commits:
                raise _HttpError(400, f"parent commit {parent} does not exist")
            head = parent or head
        elif parent is not None and parent != head:
            raise _HttpError(412, f"A commit has happened since. Please refresh and try again. "
                                  f"(parent {parent}, head of {revision} is {head})")
        tree = dict(repo.commits[head].tree)
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = str(value.get("path", "")).strip("/")
            if not path or ".." in path.split("/") or path.startswith(".git/"):
                raise _HttpError(400, f"invalid path {value.get('path')!r}")
            if key == "file":
                data = base64.b64decode(value.get("content", ""))
                tree[path] = _Entry(len(data), self.hub._store_git(data))
            elif key == "lfsFile":
                oid = str(value.get("oid"))
                size = self.hub._lfs_size(oid)
                if size is None or ("size" in value and int(value["size"]) != size):
                    raise _HttpError(422, f"LFS object {oid} for {path} was not uploaded (or has another size)")
                tree[path] = _Entry(size, git_blob_sha1(lfs_pointer(oid, size)), oid)
            elif key == "deletedFile":
                if path not in tree:
                    raise _HttpError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del tree[path]
            elif key == "deletedFolder":
                for p in [p for p in tree if p.startswith(path + "/")]:
                    del tree[p]
            else:
                raise _HttpError(400, f"unknown commit operation {key!r}")
        summary, description = str(header.get("summary", "")), str(header.get("description", ""))
        if create_pr:
            number = len(repo.pulls) + 1
            oid = self.hub._commit_on(repo, head, tree, summary, description)
            repo.pulls[number] = oid
            return 200, {"success": True, "commitOid": oid, "hookOutput": "",
                         "commitUrl": f"{self.hub.url}/{repo.repo_id}/commit/{oid}",
                         "pullRequestUrl": f"{self.hub.url}/{repo.repo_id}/discussions/{number}"}, {}
        oid = self.hub._commit(repo, revision, tree, summary, description)
        return 200, {"success": True, "commitOid": oid, "commitUrl": f"{self.hub.url}/{repo.repo_id}/commit/{oid}",
                     "hookOutput": ""}, {}

    def _resolve_file(self, method: str, ns: str, name: str, revision: str, path: str, user: str | None):
        repo = self._repo(ns, name, user)
        commit = self._resolve(repo, revision)
        entry = commit.tree.get(path)
        if entry is None:
            raise _HttpError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes", "ETag": f'"{entry.oid}"'}
        if entry.sha256:
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
        if method == "HEAD":
            headers["Content-Length"] = str(entry.size)
            return 200, b"", headers
        data = self.hub._read(entry)
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if match and (match.group(1) or match.group(2)):
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
            else:
                start, end = max(0, len(data) - int(match.group(2))), len(data) - 1
            if start >= len(data) or start > end:
                raise _HttpError(416, f"Range not satisfiable for {path} ({len(data)} bytes)",
                                 headers={"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return 206, data[start:end + 1], headers
        return 200, data, headers
