"""LocalHub routes of the classic (non-xet) upload path: preupload, the LFS batch API, the presigned PUT, and the
NDJSON commit (``parentCommit`` checked, ``create_pr`` opening ``refs/pr/N``). A mixin of the request handler."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re

from dsparkhub.testing.hub_server.store import Entry, HttpError, git_blob_sha1, lfs_pointer


class UploadRoutes:
    """Routes that write (methods of :class:`~dsparkhub.testing.hub_server.handler.Handler`)."""

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
            raise HttpError(400, "LocalHub's LFS batch endpoint only answers uploads")
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
                raise HttpError(404, f"Repository {ns}/{name} not found", "RepoNotFound")
            if digest != oid:
                raise HttpError(400, f"uploaded bytes have sha256 {digest}, expected {oid} ({len(data)} bytes)")
            self.hub._store_lfs(oid, data)
            self.hub.lfs_bytes_received += len(data)
        return 200, b"", {}

    def _commit(self, ns: str, name: str, revision: str, user: str | None):
        repo = self._repo(ns, name, user, write=True)
        create_pr = self._query.get("create_pr", ["0"])[0] in ("1", "true", "True")
        if revision not in repo.branches:
            raise HttpError(404, f"Invalid rev id: {revision} (commits go to a branch)", "RevisionNotFound")
        try:
            lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise HttpError(400, f"commit payload is not NDJSON: {exc}") from None
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        head = repo.branches[revision]
        parent = header.get("parentCommit")
        if create_pr:  # the Hub opens the PR from parentCommit (else the head) and leaves the branch alone
            if parent is not None and parent not in repo.commits:
                raise HttpError(400, f"parent commit {parent} does not exist")
            head = parent or head
        elif parent is not None and parent != head:
            raise HttpError(412, f"A commit has happened since. Please refresh and try again. "
                                  f"(parent {parent}, head of {revision} is {head})")
        tree = dict(repo.commits[head].tree)
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = str(value.get("path", "")).strip("/")
            if not path or ".." in path.split("/") or path.startswith(".git/"):
                raise HttpError(400, f"invalid path {value.get('path')!r}")
            if key == "file":
                data = base64.b64decode(value.get("content", ""))
                tree[path] = Entry(len(data), self.hub._store_git(data))
            elif key == "lfsFile":
                oid = str(value.get("oid"))
                size = self.hub._lfs_size(oid)
                if size is None or ("size" in value and int(value["size"]) != size):
                    raise HttpError(422, f"LFS object {oid} for {path} was not uploaded (or has another size)")
                tree[path] = Entry(size, git_blob_sha1(lfs_pointer(oid, size)), oid)
            elif key == "deletedFile":
                if path not in tree:
                    raise HttpError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del tree[path]
            elif key == "deletedFolder":
                for p in [p for p in tree if p.startswith(path + "/")]:
                    del tree[p]
            else:
                raise HttpError(400, f"unknown commit operation {key!r}")
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
