"""LocalHub's records: file entries, commits, repos, the request log and injected faults, and the small helpers
that define their wire forms (git blob ids, LFS pointers, timestamps)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from huggingface_hub.utils.sha import git_hash

LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores files of 10 MiB and more in LFS
DEFAULT_GITATTRIBUTES = "".join(
    f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
    for ext in ("safetensors", "bin", "pt", "pth", "ckpt", "h5", "msgpack", "onnx", "npy", "npz", "gguf", "zip",
                "tar", "gz", "pkl", "pickle", "model", "arrow", "parquet")
)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub reports as a regular file's ``oid``):
    ``huggingface_hub.utils.sha.git_hash``."""
    return git_hash(data)


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file text for an object (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Entry:
    size: int
    blob_id: str  # git sha1 of the content (regular file) or of the LFS pointer (LFS file)
    sha256: str | None = None  # set for LFS files

    @property
    def oid(self) -> str:
        """What preupload reports as the remote oid: sha256 for LFS files, git sha1 for regular ones."""
        return self.sha256 or self.blob_id


@dataclass
class Commit:
    oid: str
    parent: str | None
    tree: dict[str, Entry]
    summary: str
    description: str
    date: str


@dataclass
class Repo:
    repo_id: str
    private: bool
    created: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
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


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.extra = extra or {}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

