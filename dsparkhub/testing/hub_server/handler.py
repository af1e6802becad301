"""The HTTP request handler bound to one :class:`~dsparkhub.testing.hub_server.hub.LocalHub`: plumbing (bodies,
replies, dropped connections), tokens and access rules, and the routing table; the routes themselves live in
:mod:`~dsparkhub.testing.hub_server.repos` and :mod:`~dsparkhub.testing.hub_server.uploads`."""

from __future__ import annotations

import json
import re
import socket
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from dsparkhub.testing.hub_server.repos import RepoRoutes
from dsparkhub.testing.hub_server.store import Commit, HttpError, HubRequest, Repo
from dsparkhub.testing.hub_server.uploads import UploadRoutes


#: requests huggingface_hub makes on its own (utils/_detect_agent.py registry); answered 404, not logged.
_HOUSEKEEPING = frozenset({"/api/agent-harnesses"})


class Handler(RepoRoutes, UploadRoutes, BaseHTTPRequestHandler):
    """Routes one request to the LocalHub it is bound to (``hub`` class attribute)."""

    hub: Any  # the LocalHub (dsparkhub.testing.hub_server.hub) this handler class is bound to
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
                raise HttpError(fault.status, fault.message)
            if fault is not None and fault.kind == "call":
                fault.action()
            segments = [unquote(s) for s in split.path.split("/")[1:]]
            status, payload, headers = self._route(method, segments, user)
        except HttpError as err:
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
            raise HttpError(400, f"request body is not JSON: {exc}") from None

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization")
        if not auth:
            return None
        token = auth.split(" ", 1)[1].strip() if auth.lower().startswith("bearer ") else auth.strip()
        user = self.hub.tokens.get(token)
        if user is None:
            raise HttpError(401, "Invalid credentials in Authorization header")
        self._token = token
        return user

    # ---- access ---------------------------------------------------------------------------------------------

    def _repo(self, ns: str, name: str, user: str | None, *, write: bool = False) -> Repo:
        repo_id = f"{ns}/{name}"
        repo = self.hub._repos.get(repo_id)
        visible = repo is not None and (not repo.private or (user is not None and self._may_write(user, ns)))
        if not visible:
            raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        if write:
            self._check_write(user, ns)
        return repo

    def _may_write(self, user: str, ns: str) -> bool:
        return ns == user or ns in self.hub.orgs.get(user, [])

    def _check_write(self, user: str | None, ns: str) -> None:
        if user is None:
            raise HttpError(401, "You must be authenticated to write (no token sent)")
        if self._token in self.hub.read_only_tokens:
            raise HttpError(403, "This token has read access only")
        if not self._may_write(user, ns):
            raise HttpError(403, f"You don't have the rights to write to the namespace {ns}")

    def _resolve(self, repo: Repo, revision: str) -> Commit:
        pr = re.fullmatch(r"refs/pr/(\d+)", revision)
        oid = (repo.pulls.get(int(pr.group(1))) if pr else repo.branches.get(revision)) or (
            revision if revision in repo.commits else None)
        if oid is None:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
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
                        raise HttpError(401, "Invalid credentials in Authorization header")
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
                    raise HttpError(404, f"LFS object {s[3]} not found in {repo.repo_id}")
                return 200, {"success": True}, {}
            elif len(s) == 6 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "batch"]:
                return self._lfs_batch(s[0], s[1][: -len(".git")], user)
            elif len(s) >= 5 and s[2] == "resolve" and method in ("GET", "HEAD"):
                return self._resolve_file(method, s[0], s[1], s[3], "/".join(s[4:]), user)
        raise HttpError(404, f"LocalHub has no route for {method} {'/'.join([''] + s)}")

