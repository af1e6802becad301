"""LocalHub routes that read a repo or manage it: model info, refs, tree, paths-info, branch creation, repo
creation and ``/resolve/`` (HEAD / GET with ``Range``). A mixin of the request handler."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import parse_qs

from dsparkhub.testing.hub_server.store import Commit, Entry, HttpError, lfs_pointer

_ID_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class RepoRoutes:
    """Routes over repos and their files (methods of :class:`~dsparkhub.testing.hub_server.handler.Handler`)."""

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
                raise HttpError(409, f"Reference refs/heads/{rest[1]} already exists")
            start = self._resolve(repo, self._json().get("startingPoint") or "main")
            repo.branches[rest[1]] = start.oid
            return 200, {}, {}
        if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
            return self._preupload(ns, name, rest[1], user)
        if method == "POST" and len(rest) == 2 and rest[0] == "commit":
            return self._commit(ns, name, rest[1], user)
        raise HttpError(404, f"LocalHub has no route for {method} /api/models/{ns}/{name}/{'/'.join(rest)}")

    def _create_repo(self, user: str | None):
        payload = self._json()
        if user is None:
            raise HttpError(401, "You must be authenticated to create a repo")
        if payload.get("type", "model") not in (None, "model"):
            raise HttpError(400, "LocalHub only hosts model repos")
        ns = payload.get("organization") or user
        name = payload.get("name") or ""
        if not (_ID_SEGMENT.match(ns) and _ID_SEGMENT.match(name)):
            raise HttpError(400, f"Invalid repo name {ns}/{name}")
        self._check_write(user, ns)
        repo_id = f"{ns}/{name}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub._repos:
            raise HttpError(409, "You already created this model repo", extra={"url": url})
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.hub._create_repo(repo_id, private)
        return 200, {"url": url, "name": repo_id}, {}

    def _file_info(self, path: str, entry: Entry) -> dict:
        info = {"type": "file", "oid": entry.blob_id, "size": entry.size, "path": path}
        if entry.sha256:
            info["lfs"] = {"oid": entry.sha256, "size": entry.size,
                           "pointerSize": len(lfs_pointer(entry.sha256, entry.size))}
        return info

    def _tree(self, commit: Commit, prefix: str, recursive: bool) -> list[dict]:
        base = prefix + "/" if prefix else ""
        if prefix and prefix not in commit.tree and not any(p.startswith(base) for p in commit.tree):
            raise HttpError(404, f"Path {prefix} not found", "EntryNotFound")
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

    def _resolve_file(self, method: str, ns: str, name: str, revision: str, path: str, user: str | None):
        repo = self._repo(ns, name, user)
        commit = self._resolve(repo, revision)
        entry = commit.tree.get(path)
        if entry is None:
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
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
                raise HttpError(416, f"Range not satisfiable for {path} ({len(data)} bytes)",
                                 headers={"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return 206, data[start:end + 1], headers
        return 200, data, headers
