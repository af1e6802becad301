"""What is on the Hub for a push: a repo's head and tree, its LFS store, its README (may a push replace it?), and the
read-back check after a commit.

Reads only (GET / HEAD, plus the LFS batch query, a POST that writes nothing), every one through
``huggingface_hub.HfApi``; errors are mapped by :func:`dsparkhub.io.hub_errors.hub_error`. A remote checkpoint's
headers are read by :mod:`dsparkhub.io.hub_checkpoint` (below the target, which opens Hub targets with it);
:func:`remote_checkpoint` / :func:`remote_checkpoint_headers` are re-exported here for existing callers.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.lfs import post_lfs_batch_info
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils.sha import git_hash

from dsparkhub.card import CARD_MARKER
from dsparkhub.errors import CardError, HubError
from dsparkhub.hub.files import NEVER_DELETE, README
from dsparkhub.io.hashing import sha256_files
from dsparkhub.io.hub_checkpoint import remote_checkpoint, remote_checkpoint_headers
from dsparkhub.io.hub_errors import HUB_ERRORS, hub_error

__all__ = ["check_remote", "git_blob_sha1", "guard_readme", "lfs_objects_present", "remote_checkpoint",
           "remote_checkpoint_headers", "remote_state", "same_file"]

# ---- a repo's state -----------------------------------------------------------------------------------------------


def remote_state(api: HfApi, repo_id: str, revision: str, token: str | None):
    """(repo_exists, branch_exists, head oid, {path: RepoFile}) with reads only."""
    try:
        head = api.model_info(repo_id, revision=revision).sha
    except RevisionNotFoundError:
        return True, False, None, {}
    except RepositoryNotFoundError:  # missing, or private and not visible to this token: create_repo will tell
        return False, False, None, {}
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"read {repo_id}", repo_id, token) from exc
    try:
        tree = {f.path: f for f in api.list_repo_tree(repo_id, recursive=True, revision=head)
                if isinstance(f, RepoFile)}
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"list the files of {repo_id}", repo_id, token) from exc
    return True, True, head, tree


def git_blob_sha1(path: str | Path) -> str:
    """The git object id of a file (``sha1("blob <size>\\0" + bytes)``): the Hub's ``oid`` of a regular file.

    ``huggingface_hub.utils.sha.git_hash`` of the file's bytes, read whole: only regular (non-LFS) Hub files are
    compared this way, and the Hub stores files over 10 MB in LFS.
    """
    return git_hash(Path(path).read_bytes())


def same_file(local: Path, sha256: str, remote: RepoFile) -> bool:
    """Whether ``local`` (whose sha256 hex is ``sha256``) has the size and hash of ``remote`` (sha256 for LFS files,
    git blob sha1 for regular ones)."""
    size = local.stat().st_size
    if remote.size != size:
        return False
    if remote.lfs is not None:
        return remote.lfs.sha256 == sha256
    return remote.blob_id == git_blob_sha1(local)


def guard_readme(api: HfApi, repo_id: str, head: str | None, files: dict[str, Path], remote: dict[str, RepoFile],
                  delete: list[str] | None, token: str | None) -> None:
    """Refuse to replace a ``README.md`` on the Hub that ``dsparkhub card`` did not write (it lacks
    :data:`dsparkhub.card.CARD_MARKER`) unless ``delete`` names ``README.md`` itself (deleting one is ruled out by
    :func:`dsparkhub.hub.files.deletions`). Reads the remote README only when it would change (one GET, allowed in
    dry runs).

    Raises:
        CardError: the hand-written README would go.
    """

    ours, theirs = files.get(README), remote.get(README)
    # a README the folder lacks is deleted only when `delete` names it (see files.deletions): nothing to guard then
    if ours is None or theirs is None or head is None or README in (delete or []):
        return
    if same_file(ours, sha256_files([ours])[str(ours)], theirs):
        return
    try:
        text = Path(hf_hub_download(repo_id, README, revision=head, token=token, endpoint=api.endpoint)
                    ).read_text(encoding="utf-8", errors="replace")
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"read {README} of {repo_id}", repo_id, token, reading=True) from exc
    if CARD_MARKER not in text:
        raise CardError(f"{repo_id} has a {README} on the Hub that dsparkhub did not write; this push would "
                        "replace it",
                        hint=f"pass --delete {README} to let it go, --exclude {README} to keep it, or merge it "
                             "into the card (`dsparkhub card --template`)")


def lfs_objects_present(api: HfApi, repo_id: str, revision: str, adds: list[CommitOperationAdd],
                        token: str | None) -> set[str]:
    """sha256 of the objects among ``adds`` the Hub's LFS store already holds (the batch answer has no actions).

    Only used to report bytes uploaded; the upload itself asks the same question.
    """
    infos = [op.upload_info for op in adds if op.upload_info.size > 0]
    if not infos:
        return set()
    try:
        actions, _errors, _ = post_lfs_batch_info(upload_infos=infos, token=None, repo_type="model",
                                                  repo_id=repo_id, revision=quote(revision, safe=""),
                                                  endpoint=api.endpoint, headers=build_hf_headers(token=token))
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"query the LFS store of {repo_id}", repo_id, token) from exc
    return {a["oid"] for a in actions if not a.get("actions")}


def check_remote(api: HfApi, repo_id: str, oid: str, files: dict[str, Path], hashes: dict[str, str],
                 token: str | None, kept: set[str] = frozenset()) -> dict[str, RepoFile]:
    """Read the tree of commit ``oid`` back and compare it with the local files (``kept``: files left out here but
    kept on the Hub, see ``dsparkhub.hub.push._diff``).

    Raises:
        HubError: a file missing, of another size or hash, or an unexpected extra file.
    """
    try:
        tree = {f.path: f for f in api.list_repo_tree(repo_id, recursive=True, revision=oid)
                if isinstance(f, RepoFile)}
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"read back commit {oid[:12]} of {repo_id}", repo_id, token) from exc
    problems = []
    for path, local in files.items():
        remote = tree.get(path)
        if remote is None:
            problems.append(f"{path}: missing on the Hub")
        elif not same_file(local, hashes[str(local)], remote):
            lfs = f", sha256 {remote.lfs.sha256}" if remote.lfs else f", git oid {remote.blob_id}"
            problems.append(f"{path}: Hub has {remote.size} bytes{lfs}; local has {local.stat().st_size} bytes, "
                            f"sha256 {hashes[str(local)]}")
    extra = sorted(set(tree) - set(files) - NEVER_DELETE - set(kept))
    problems += [f"{p}: on the Hub but not in the local folder" for p in extra]
    if problems:
        raise HubError(f"after commit {oid[:12]}, {repo_id} differs from the local folder: " + "; ".join(problems),
                       hint="run the push again; if it persists, compare with `hf download` and report it")
    return tree
