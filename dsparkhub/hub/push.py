"""The only networked module: push a drafter folder to the Hub in one commit, and read a remote checkpoint's headers.

Owns:
  * :func:`push` — ``hf upload`` semantics (``--include`` / ``--exclude``; remote files the folder lacks kept unless
    ``--delete PATTERN``; ``--create-pr``); plan (local files vs the remote tree, compared by hash: sha256 for LFS
    files, git blob sha1 for regular ones), then one ``create_commit`` whose ``parent_commit`` is the remote head read while planning, then a
    read-back of the remote tree. A dry run sends only GET / HEAD requests.
  (reading a remote checkpoint's headers and the error mapping live in :mod:`dsparkhub.hub.remote`.)

Every request goes through ``huggingface_hub.HfApi`` (2.4); its typed errors (``HfHubHTTPError`` and subclasses,
``httpx2`` transport errors, ``OfflineModeIsEnabled``) are turned into :class:`~dsparkhub.errors.HubError` with a hint,
keeping the original as ``__cause__``. The token comes from the ``token`` argument, ``HF_TOKEN`` or the
huggingface_hub login, and is kept out of every message, commit text and report (:func:`dsparkhub.secrets.redact`).

Does not: validate (``dsparkhub.validate``), write cards (``dsparkhub.card``), print (``dsparkhub.cli``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token, hf_hub_download
from huggingface_hub.errors import (
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.lfs import post_lfs_batch_info
from huggingface_hub.utils import build_hf_headers, filter_repo_objects

from dsparkhub import __version__
from dsparkhub.card import CARD_MARKER, serve_command_problems
from dsparkhub.convert import PROVENANCE_FILE
from dsparkhub.errors import (
    CardError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConversionRefusedError,
    DsparkhubError,
    HubError,
)
from dsparkhub.hub.remote import HUB_ERRORS, check_repo_id, hub_error, redactor
from dsparkhub.io.checkpoint import PICKLE_SUFFIXES, TRAINING_STATE_PREFIXES
from dsparkhub.io.hashing import checkpoint_fingerprint, sha256_files
from dsparkhub.target import open_target
from dsparkhub.validate import validate as run_validate
from dsparkhub.validate.report import validation_error

#: remote files a push never deletes even when the local folder lacks them (the Hub creates it with the repo).
NEVER_DELETE = frozenset({".gitattributes"})
README = "README.md"
TRAINING_LAYOUTS = ("deepspec",)  # written by training, read by dsparkhub, not loaded by vLLM
#: local path components that are never pushed (caches, VCS, editor and OS litter).
SKIP_PARTS = frozenset({".git", ".cache", ".huggingface", "__pycache__", ".ipynb_checkpoints", ".DS_Store"})
#: Hub repo ids: ``namespace/name``, each part 1-96 of [A-Za-z0-9._-], not starting with ``.`` / ``-``, no ``--``
#: or ``..`` (huggingface_hub ``validate_repo_id`` rules).



# ---- plan and report -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilePlan:
    """One file of a push plan.

    Attributes:
        path: path in the repo (POSIX, relative).
        action: ``"add"`` (absent remotely), ``"change"`` (hash differs), ``"delete"`` (remote only, matched by a
            delete pattern), ``"keep"`` (remote only, kept: as ``hf upload`` does without ``--delete``) or
            ``"unchanged"``.
        size: local size in bytes (None for ``delete``).
        remote_size: remote size in bytes (None for ``add``).
        sha256: local sha256 hex (None for ``delete``).
        remote_lfs: whether the remote copy is stored in LFS (None when there is none).
    """

    path: str
    action: str
    size: int | None
    remote_size: int | None
    sha256: str | None
    remote_lfs: bool | None


@dataclass
class PushPlan:
    """What a push would do, computed from local hashes and the remote tree (reads only).

    Attributes:
        repo_id: ``namespace/name``.
        revision: branch pushed to.
        repo_exists: whether the repo existed when planning.
        branch_exists: whether ``revision`` existed (a missing branch is created from ``main``).
        parent_commit: remote head of ``revision`` when planning (None when the repo or branch does not exist).
        files: every local and remote file, sorted by path.
    """

    repo_id: str
    revision: str
    repo_exists: bool
    branch_exists: bool
    parent_commit: str | None
    files: list[FilePlan] = field(default_factory=list)

    def by_action(self, action: str) -> list[FilePlan]:
        return [f for f in self.files if f.action == action]

    @property
    def changes(self) -> list[FilePlan]:
        """Files the commit touches (added, changed, deleted)."""
        return [f for f in self.files if f.action not in ("unchanged", "keep")]

    @property
    def bytes_to_send(self) -> int:
        """Upper bound of bytes to upload: sizes of added and changed files (LFS objects the Hub already has are
        skipped at upload time)."""
        return sum(f.size or 0 for f in self.files if f.action in ("add", "change"))

    def to_dict(self) -> dict:
        return {"repo_id": self.repo_id, "revision": self.revision, "repo_exists": self.repo_exists,
                "branch_exists": self.branch_exists, "parent_commit": self.parent_commit,
                "bytes_to_send": self.bytes_to_send, "files": [asdict(f) for f in self.files]}


@dataclass
class PushReport:
    """The outcome of :func:`push`.

    Attributes:
        plan: the plan the commit was built from.
        dry_run: True when nothing was written.
        validation: ``ValidationReport.to_dict()`` of the drafter (None if validation could not apply).
        forced: True when validation errors were overridden with ``force``.
        commit_oid: the new commit (None for a dry run or an unchanged release).
        commit_url: its URL.
        bytes_uploaded: bytes actually sent (regular files + LFS objects the Hub did not have); 0 for dry runs.
        remote_check: ``"ok"`` after a verified commit or an unchanged release, ``"skipped (dry run)"`` otherwise.
        notes: facts worth showing (e.g. ``--private`` ignored for an existing repo).
        pr_url: the pull request the commit opened (``create_pr``), else None.
    """

    plan: PushPlan
    dry_run: bool
    validation: dict | None = None
    forced: bool = False
    commit_oid: str | None = None
    commit_url: str | None = None
    bytes_uploaded: int = 0
    remote_check: str = "skipped (dry run)"
    notes: list[str] = field(default_factory=list)
    pr_url: str | None = None

    @property
    def committed(self) -> bool:
        return self.commit_oid is not None

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "dry_run": self.dry_run, "validation": self.validation,
                "forced": self.forced, "commit_oid": self.commit_oid, "commit_url": self.commit_url,
                "bytes_uploaded": self.bytes_uploaded, "remote_check": self.remote_check, "notes": self.notes,
                "pr_url": self.pr_url}


# ---- small helpers --------------------------------------------------------------------------------------------


def git_blob_sha1(path: str | Path) -> str:
    """The git object id of a file (``sha1("blob <size>\\0" + bytes)``): the Hub's ``oid`` of a regular file."""
    path = Path(path)
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def local_files(draft_dir: str | Path, left_out: dict[str, str] | None = None) -> dict[str, Path]:
    """The files a push would upload: every regular file under ``draft_dir``, by POSIX path relative to it.

    Skipped silently: :data:`SKIP_PARTS` anywhere in the path, ``*.tmp`` / ``*.lock`` / ``*.partial`` leftovers.
    Left out and recorded in ``left_out`` (``{path: why}``): dotfiles and dot-folders (``.env`` ...; ``.gitattributes``
    excepted), pickle files (``.bin`` / ``.pt`` / ``.pth`` / ``.pkl`` / ``.ckpt``: a release ships safetensors, and a
    pickle runs code when loaded) and training state (``training_state*``, ``optimizer*``, ...).

    Raises:
        CheckpointNotFoundError: ``draft_dir`` is not a folder.
        DsparkhubError: a file is a link that resolves outside ``draft_dir``.
    """
    root = Path(draft_dir)
    if not root.is_dir():
        raise CheckpointNotFoundError("drafter folder to push does not exist or is not a folder", path=root)
    real_root = root.resolve()
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_PARTS for part in rel.parts) or path.name.endswith((".tmp", ".lock", ".partial")):
            continue
        if not path.is_file():
            continue
        why = _left_out_reason(rel)
        if why:
            if left_out is not None:
                left_out[rel.as_posix()] = why
            continue
        real = path.resolve()
        if real_root not in real.parents:
            raise DsparkhubError(f"{rel.as_posix()} is a link that resolves outside the folder (to {real})",
                                 path=root, hint="copy the file into the folder instead of linking it")
        out[rel.as_posix()] = path
    return out


def _left_out_reason(rel: Path) -> str | None:
    if any(part.startswith(".") for part in rel.parts) and rel.as_posix() != ".gitattributes":
        return "dotfile: may hold local settings or secrets"
    if rel.name.startswith(TRAINING_STATE_PREFIXES):
        return "training state"
    if rel.suffix.lower() in PICKLE_SUFFIXES:
        return "pickle file: a release ships safetensors"
    return None


def _is_upload_failure(exc: RuntimeError) -> bool:
    """huggingface_hub wraps a failed LFS upload in ``RuntimeError("Error while uploading ...")`` (_commit_api.py)."""
    return isinstance(exc.__cause__, HUB_ERRORS) or str(exc).startswith("Error while uploading")


def _read_provenance(draft_dir: Path) -> dict | None:
    path = draft_dir / PROVENANCE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(f"{PROVENANCE_FILE} is not valid JSON: {str(exc)[:200]}", path=path) from None
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{PROVENANCE_FILE} must hold a JSON object", path=path)
    return data


def _run_validation(draft_dir: Path, target: str | None, endpoint: str | None = None, token: str | None = None):
    """``dsparkhub.validate.validate``; a Hub
    target is read from the push's own endpoint with its token, not from the default Hub."""
    if target is not None and not Path(target).exists():
        target = open_target(target, endpoint=endpoint, token=token)
    return run_validate(draft_dir, target)


def _commit_text(plan: PushPlan, files: dict[str, Path], hashes: dict[str, str], provenance: dict | None,
                 validation, forced: bool, fingerprint: str | None, redactor, message: str | None = None,
                 description: str | None = None) -> tuple[str, str]:
    added, changed, deleted = (len(plan.by_action(a)) for a in ("add", "change", "delete"))
    summary = message or f"dsparkhub push: {added} added, {changed} changed, {deleted} deleted"
    if forced:
        summary += " (FORCED past validation errors)"
    lines = ([description, ""] if description else []) + [f"Pushed with dsparkhub {__version__}.", ""]
    if fingerprint:
        lines.append(f"drafter fingerprint (sha256 of config + weights hashes): {fingerprint}")
    lines.append("files (sha256):")
    lines += [f"  {path}  {hashes[str(files[path])]}" for path in sorted(files)]
    if validation is not None:
        errors = list(getattr(validation, "errors", []))
        if errors:
            codes = ", ".join(sorted({e.code for e in errors}))
            lines += ["", f"validation: {len(errors)} error(s) [{codes}] overridden with --force"]
        else:
            lines += ["", f"validation: ok ({len(getattr(validation, 'warnings', []))} warning(s))"]
    if provenance is not None:
        # everything but the output file hashes, which the list above already gives
        keep = {k: v for k, v in provenance.items() if k != "files"}
        lines += ["", f"provenance ({PROVENANCE_FILE}):", json.dumps(keep, indent=1, sort_keys=True, default=str)]
    return redactor(summary), redactor("\n".join(lines))


# ---- planning ---------------------------------------------------------------------------------------------------


def _remote_state(api: HfApi, repo_id: str, revision: str, token: str | None):
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


def _same(local: Path, sha256: str, remote: RepoFile) -> bool:
    size = local.stat().st_size
    if remote.size != size:
        return False
    if remote.lfs is not None:
        return remote.lfs.sha256 == sha256
    return remote.blob_id == git_blob_sha1(local)


def _diff(files: dict[str, Path], hashes: dict[str, str], remote: dict[str, RepoFile],
          delete: set[str] = frozenset()) -> list[FilePlan]:
    """What the commit does per file; remote files absent locally are deleted when in ``delete`` (see
    :func:`_deletions`), else kept."""
    out = []
    for path, local in files.items():
        sha, size = hashes[str(local)], local.stat().st_size
        r = remote.get(path)
        if r is None:
            out.append(FilePlan(path, "add", size, None, sha, None))
        else:
            action = "unchanged" if _same(local, sha, r) else "change"
            out.append(FilePlan(path, action, size, r.size, sha, r.lfs is not None))
    for path, r in remote.items():
        if path not in files and path not in NEVER_DELETE:  # .gitattributes: the Hub's, never planned
            action = "delete" if path in delete else "keep"
            out.append(FilePlan(path, action, None, r.size, None, r.lfs is not None))
    return sorted(out, key=lambda f: f.path)


def _deletions(files: dict[str, Path], remote: dict[str, RepoFile], patterns: list[str] | None,
               left_out: set[str]) -> set[str]:
    """Remote paths a push deletes, as ``hf upload --delete PATTERN`` does (huggingface_hub
    ``_prepare_folder_deletions``: fnmatch over repo paths, ``*`` crossing ``/``; ``.gitattributes`` never): remote
    files the folder lacks that match a pattern. Files the folder holds but left out (a pickle, a dotfile) are never
    deleted on their account, and ``README.md`` only when a pattern is exactly ``README.md``: a card on the Hub may
    be written by hand."""
    if not patterns:
        return set()
    gone = [p for p in remote if p not in files and p not in left_out and p not in NEVER_DELETE]
    hits = set(filter_repo_objects(gone, allow_patterns=list(patterns)))
    if README in hits and README not in patterns:
        hits.discard(README)
    return hits


# ---- push -------------------------------------------------------------------------------------------------------


def push(draft_dir: str | Path, repo_id: str, *, revision: str | None = None, private: bool = False,
         dry_run: bool = False, force: bool = False, token: str | None = None, endpoint: str | None = None,
         target: str | None = None, validate: bool = True, expect_head: str | None = None,
         include: list[str] | None = None, exclude: list[str] | None = None, delete: list[str] | None = None,
         commit_message: str | None = None, commit_description: str | None = None,
         create_pr: bool = False) -> PushReport:
    """Push a drafter folder to a Hub repo as one commit, or show the plan (``dry_run``).

    Follows ``hf upload REPO FOLDER`` (huggingface_hub ``upload_folder``): ``include`` / ``exclude`` filter the
    local files (fnmatch, ``huggingface_hub.utils.filter_repo_objects``); files on the Hub that the folder lacks are
    kept unless they match a ``delete`` pattern; ``commit_message`` / ``commit_description`` / ``create_pr`` as
    there. On top: the drafter is validated (refused on errors unless ``force``); a ``README.md`` whose serve
    commands name a placeholder or a local path is refused; a ``README.md`` on the Hub that dsparkhub did not write
    is neither deleted nor replaced unless ``delete`` names ``README.md`` itself.

    Steps: read the remote head and tree; compare every local file by hash (sha256 for LFS files, git blob sha1 for
    regular files); create the repo / branch when missing; one ``create_commit`` (adds for new / changed files,
    :class:`CommitOperationDelete` for the deletions) with ``parent_commit`` = the head read while planning, so a
    concurrent change fails cleanly; read the tree of the new commit back and compare sizes and hashes. An
    unchanged release makes no commit. An interrupted push completes when run again: LFS objects already on the Hub
    are not sent again.

    Args:
        draft_dir: the converted drafter folder (``config.json``, ``model.safetensors``, provenance, card ...).
        repo_id: ``namespace/name``.
        revision: branch to push to (default ``main``); created from ``main`` when missing.
        private: create the repo private (ignored, with a note, when the repo exists).
        dry_run: plan only; sends GET / HEAD requests and nothing else.
        force: push even when validation finds errors (recorded in the commit message).
        token: Hub token; default ``HF_TOKEN`` or the huggingface_hub login. Never shown or stored.
        endpoint: Hub URL (default huggingface_hub's, i.e. ``HF_ENDPOINT`` or https://huggingface.co).
        target: the target to validate against (folder, Hub repo id); None lets ``validate`` check the drafter alone.
        validate: run validation at all (False only for callers that validated just before).
        expect_head: the remote head commit (full sha or a prefix of 7+ characters) a ``--dry-run`` showed; the
            push is refused when the branch has moved since, so what was reviewed is what gets pushed.
        include / exclude: fnmatch patterns over the folder's POSIX paths: push only matching / not matching files.
        delete: fnmatch patterns over repo paths: remote files the folder lacks that match are deleted
            (``.gitattributes`` never; ``README.md`` only when named exactly).
        commit_message / commit_description: the commit's summary (default: counts of the changes) and a text put
            before dsparkhub's own description (file hashes, validation, provenance).
        create_pr: open a pull request against ``main`` instead of committing to it (``report.pr_url``).

    Returns:
        :class:`PushReport`.

    Raises:
        HubError: invalid repo id; ``create_pr`` with a revision other than main; no token (not for dry runs);
            ``expect_head`` differs from the remote head; 401 / 403 / 404 / 412 (remote changed since the plan) /
            5xx / network errors, each with a hint and the huggingface_hub error as ``__cause__``; the remote tree
            after the commit differs from the local files.
        ValidationFailedError: validation found errors and ``force`` is False.
        ConversionRefusedError: the folder is in a training layout vLLM does not load (DeepSpec) and ``force`` is
            False.
        CardError: the folder's ``README.md`` serve commands name a placeholder or a local path; or the Hub's
            ``README.md`` was not written by dsparkhub and would be replaced or deleted without ``delete`` naming it.
        CheckpointNotFoundError: ``draft_dir`` is not a folder, or nothing is left to push after ``include`` /
            ``exclude``.
        CheckpointFormatError: ``dsparkhub_provenance.json`` is not a JSON object.
    """
    draft_dir = Path(draft_dir)
    check_repo_id(repo_id)
    if create_pr and revision not in (None, "main"):
        raise HubError(f"a pull request is opened against main; --revision {revision} cannot take one",
                       hint="drop --revision (the Hub creates refs/pr/N), or push to the branch without --create-pr")
    revision = revision or "main"
    left_out: dict[str, str] = {}
    files = local_files(draft_dir, left_out)
    if not files:
        raise CheckpointNotFoundError("the drafter folder is empty: nothing to push", path=draft_dir)
    if include or exclude:
        chosen = set(filter_repo_objects(list(files), allow_patterns=include or None, ignore_patterns=exclude or None))
        files = {p: f for p, f in files.items() if p in chosen}
        if not files:
            raise CheckpointNotFoundError(f"no file of the folder matches --include {include or []} / --exclude "
                                          f"{exclude or []}: nothing to push", path=draft_dir)
    if README in files:
        problems = serve_command_problems(files[README].read_text(encoding="utf-8", errors="replace"))
        if problems:
            raise CardError(f"{README}: its serve commands cannot be run by anyone else: {'; '.join(problems)}",
                            path=files[README],
                            hint=f"write the card again with the release's ids: `dsparkhub card {draft_dir} --results "
                                 f"RESULTS --repo-id {repo_id}` (and --base-model NS/NAME for a local target)")
    token = token or get_token()
    if not token and not dry_run:
        raise HubError("no Hugging Face token: pushing needs one with write access",
                       hint="set HF_TOKEN, pass --token or run `hf auth login` (or try --dry-run, which needs none "
                            "for public repos)")
    r = redactor(token)

    report_validation, forced, validation = None, False, None
    if validate:
        validation = _run_validation(draft_dir, target, endpoint, token)
        report_validation = validation.to_dict()
        if not validation.ok:
            if not force:
                raise validation_error(
                    validation, against=target or "vLLM's contract", refusing="refusing to push", path=draft_dir,
                    redact=r, hint="fix the drafter (see `dsparkhub validate`), or pass --force to push anyway "
                                   "(recorded in the commit message)")
            forced = True
        if getattr(validation, "layout", None) in TRAINING_LAYOUTS:
            if not force:
                raise ConversionRefusedError(
                    f"{draft_dir} is in the {validation.layout!r} training layout, which vLLM does not load",
                    path=draft_dir, hint="convert it first (`dsparkhub convert DRAFT --target TARGET --out OUT`) and "
                                         "push OUT, or pass --force to publish the training layout as is")
            forced = True
    provenance = _read_provenance(draft_dir)
    hashes = sha256_files(list(files.values()))

    api = HfApi(endpoint=endpoint, token=token)
    repo_exists, branch_exists, head, remote = _remote_state(api, repo_id, revision, token)
    if repo_exists and not branch_exists:
        # a new branch starts from main: plan against main's files
        _, main_exists, head_main, remote = _remote_state(api, repo_id, "main", token)
        head = head_main if main_exists else None
    if expect_head is not None and not (len(expect_head) >= 7 and (head or "").startswith(expect_head)):
        raise HubError(f"{repo_id}@{revision} has moved since the plan you reviewed: its head is "
                       f"{(head or 'absent')[:12]}, --expect-head says {expect_head[:12]}",
                       hint="run --dry-run again, review the new plan, and push with its head")
    kept = set(left_out)

    def plan_files(remote_now: dict[str, RepoFile], head_now: str | None) -> list[FilePlan]:
        _guard_readme(api, repo_id, head_now, files, remote_now, delete, token)
        return _diff(files, hashes, remote_now, _deletions(files, remote_now, delete, kept))

    plan = PushPlan(repo_id, revision, repo_exists, branch_exists, head, plan_files(remote, head))
    report = PushReport(plan, dry_run=dry_run, validation=report_validation, forced=forced)
    if left_out:
        report.notes.append("left out: " + ", ".join(f"{path} ({why})" for path, why in left_out.items()))
    kept_remote = [f.path for f in plan.by_action("keep")]
    if kept_remote:
        report.notes.append(f"kept on the Hub although not pushed from here: {', '.join(kept_remote)} (as `hf "
                            "upload`: pass --delete PATTERN to delete remote files the folder lacks)")
    if delete and README in remote and README not in files and README not in delete and any(
            f.path == README and f.action == "keep" for f in plan.files):
        report.notes.append(f"{README} on the Hub is kept: --delete deletes it only when it names {README} itself")
    if repo_exists and private:
        report.notes.append("the repo exists: --private does not change its visibility")
    if dry_run:
        if not token:
            report.notes.append("no token: a private repo would look absent to this dry run")
        if create_pr:
            report.notes.append(f"a pull request against main would be opened from {(head or 'the new repo')[:12]}")
        return report

    try:
        if not repo_exists:
            api.create_repo(repo_id, private=private, exist_ok=True)
            report.notes.append(f"created {'private' if private else 'public'} repo {repo_id}")
        if not branch_exists:
            if revision != "main":
                api.create_branch(repo_id, branch=revision, exist_ok=True)
                report.notes.append(f"created branch {revision}")
            # the new repo / branch has an initial commit: plan against it
            _, _, head, remote = _remote_state(api, repo_id, revision, token)
            plan.parent_commit, plan.files = head, plan_files(remote, head)
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"create {repo_id}@{revision}", repo_id, token) from exc

    if not plan.changes:
        report.remote_check = "ok"
        return report

    adds = []
    for f in plan.files:
        if f.action in ("add", "change"):
            op = CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(files[f.path]))
            op.upload_info.sha256 = bytes.fromhex(f.sha256)  # hashed once already, in parallel
            adds.append(op)
    ops = adds + [CommitOperationDelete(path_in_repo=f.path) for f in plan.by_action("delete")]
    already = _lfs_objects_present(api, repo_id, revision, adds, token)
    fingerprint = checkpoint_fingerprint(draft_dir) if (draft_dir / "config.json").exists() else None
    summary, description = _commit_text(plan, files, hashes, provenance, validation, forced, fingerprint, r,
                                        commit_message, commit_description)
    try:
        info = api.create_commit(repo_id, ops, commit_message=summary, commit_description=description,
                                 revision=revision, parent_commit=head, create_pr=create_pr)
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"commit to {repo_id}@{revision}", repo_id, token) from exc
    except RuntimeError as exc:
        if not _is_upload_failure(exc):
            raise
        cause = exc.__cause__ if isinstance(exc.__cause__, HUB_ERRORS) else exc
        raise hub_error(cause, f"upload to {repo_id}@{revision}", repo_id, token) from exc
    report.commit_oid, report.commit_url, report.pr_url = info.oid, info.commit_url, info.pr_url

    remote_after = _check_remote(api, repo_id, info.oid, files, hashes, token,
                                 {f.path for f in plan.by_action("keep")})
    report.bytes_uploaded = sum(
        f.size or 0 for f in plan.files
        if f.action in ("add", "change") and not (remote_after[f.path].lfs is not None and f.sha256 in already))
    report.remote_check = "ok"
    return report


def _guard_readme(api: HfApi, repo_id: str, head: str | None, files: dict[str, Path], remote: dict[str, RepoFile],
                  delete: list[str] | None, token: str | None) -> None:
    """Refuse to replace a ``README.md`` on the Hub that ``dsparkhub card`` did not write (it lacks
    :data:`dsparkhub.card.CARD_MARKER`) unless ``delete`` names ``README.md`` itself (deleting one is ruled out by
    :func:`_deletions`). Reads the remote README only when it would change (one GET, allowed in dry runs).

    Raises:
        CardError: the hand-written README would go.
    """
    ours, theirs = files.get(README), remote.get(README)
    # a README the folder lacks is deleted only when `delete` names it (see _deletions): nothing to guard then
    if ours is None or theirs is None or head is None or README in (delete or []):
        return
    if _same(ours, sha256_files([ours])[str(ours)], theirs):
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


def _lfs_objects_present(api: HfApi, repo_id: str, revision: str, adds: list[CommitOperationAdd],
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


def _check_remote(api: HfApi, repo_id: str, oid: str, files: dict[str, Path], hashes: dict[str, str],
                  token: str | None, kept: set[str] = frozenset()) -> dict[str, RepoFile]:
    """Read the tree of commit ``oid`` back and compare it with the local files (``kept``: files left out here but
    kept on the Hub, see :func:`_diff`).

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
        elif not _same(local, hashes[str(local)], remote):
            lfs = f", sha256 {remote.lfs.sha256}" if remote.lfs else f", git oid {remote.blob_id}"
            problems.append(f"{path}: Hub has {remote.size} bytes{lfs}; local has {local.stat().st_size} bytes, "
                            f"sha256 {hashes[str(local)]}")
    extra = sorted(set(tree) - set(files) - NEVER_DELETE - set(kept))
    problems += [f"{p}: on the Hub but not in the local folder" for p in extra]
    if problems:
        raise HubError(f"after commit {oid[:12]}, {repo_id} differs from the local folder: " + "; ".join(problems),
                       hint="run the push again; if it persists, compare with `hf download` and report it")
    return tree


