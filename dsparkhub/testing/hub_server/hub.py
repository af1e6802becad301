"""The :class:`LocalHub` object: start / stop, huggingface_hub client settings, the request log and faults,
server-side helpers for tests, and storage (LFS objects by sha256, git blobs by sha1, on disk under ``root``)."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from dsparkhub.testing.hub_server.handler import Handler
from dsparkhub.testing.hub_server.store import (
    DEFAULT_GITATTRIBUTES,
    LFS_SIZE_THRESHOLD,
    Commit,
    Entry,
    Fault,
    HubRequest,
    Repo,
    atomic_write,
    git_blob_sha1,
    lfs_pointer,
    now,
)


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
        self._repos: dict[str, Repo] = {}
        self._requests: list[HubRequest] = []
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------

    def start(self, port: int = 0) -> LocalHub:
        """Start serving on 127.0.0.1 (see :attr:`url`).

        Args:
            port: TCP port; 0 (default) = a free one chosen by the OS.

        Raises:
            OSError: the port is taken (``EADDRINUSE``) or not allowed.
        """
        handler = type("_BoundHandler", (Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
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
                    tree[path] = Entry(len(data), git_blob_sha1(lfs_pointer(sha, len(data))), sha)
                else:
                    tree[path] = Entry(len(data), self._store_git(data))
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

    def _create_repo(self, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_id=repo_id, private=private, created=now())
        self._repos[repo_id] = repo
        tree = {".gitattributes": Entry(len(DEFAULT_GITATTRIBUTES), self._store_git(DEFAULT_GITATTRIBUTES.encode()))}
        self._commit(repo, "main", tree, "initial commit", "")
        return repo

    def _commit(self, repo: Repo, branch: str, tree: dict[str, Entry], summary: str, description: str) -> str:
        oid = self._commit_on(repo, repo.branches.get(branch), tree, summary, description)
        repo.branches[branch] = oid
        return oid

    def _commit_on(self, repo: Repo, parent: str | None, tree: dict[str, Entry], summary: str,
                   description: str) -> str:
        """A commit with ``parent`` that no branch points at yet (pull requests keep their own refs)."""
        self._counter += 1
        listing = "".join(f"{p} {e.blob_id}\n" for p, e in sorted(tree.items()))
        oid = hashlib.sha1(f"{parent}\n{listing}{summary}\n{self._counter}\n{time.time_ns()}".encode()).hexdigest()
        repo.commits[oid] = Commit(oid, parent, dict(tree), summary, description, now())
        return oid

    def _store_git(self, data: bytes) -> str:
        sha1 = git_blob_sha1(data)
        path = self.root / "git" / sha1
        if not path.exists():
            atomic_write(path, data)
        return sha1

    def _store_lfs(self, sha256: str, data: bytes) -> None:
        path = self.root / "lfs" / sha256
        if not path.exists():
            atomic_write(path, data)

    def _lfs_size(self, sha256: str) -> int | None:
        path = self.root / "lfs" / sha256
        return path.stat().st_size if re.fullmatch(r"[0-9a-f]{64}", sha256) and path.exists() else None

    def _read(self, entry: Entry) -> bytes:
        sub = ("lfs", entry.sha256) if entry.sha256 else ("git", entry.blob_id)
        return (self.root / sub[0] / sub[1]).read_bytes()

    def _is_lfs(self, repo: Repo, tree: dict[str, Entry], path: str, size: int, sample: bytes) -> bool:
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

