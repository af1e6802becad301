"""Push a drafter folder to the Hub in one commit: plan, commit, read back; an interrupted push resumes.

:func:`push` has ``hf upload`` semantics (``--include`` / ``--exclude``; remote files the folder lacks kept unless
``--delete PATTERN``; ``--create-pr``): plan (local files vs the remote tree, compared by hash: sha256 for LFS files,
git blob sha1 for regular ones), then one ``create_commit`` whose ``parent_commit`` is the remote head read while
planning, then a read-back of the remote tree. A dry run sends only GET / HEAD requests.

Every request goes through ``huggingface_hub.HfApi`` (2.4); errors become :class:`~dsparkhub.errors.HubError` with a
hint (:mod:`dsparkhub.hub.errors`). The token comes from the ``token`` argument, ``HF_TOKEN`` or the huggingface_hub
login, and is kept out of every message, commit text and report (:func:`dsparkhub.secrets.redact`). Which files go
is :mod:`dsparkhub.hub.files`; what is on the Hub, :mod:`dsparkhub.hub.remote`.

What is pushed is trusted only as far as the bytes go: the pass that hashes every file also counts NaN / Inf in the
weights, and the card, results files and calibration sidecar must name the fingerprint those hashes give
(:mod:`dsparkhub.hub.trust`); either refusal is overridden only by ``force``, which the commit message records.

Does not: validate (``dsparkhub.validate``, called by :func:`_run_validation`, which reuses a matching
``validation.json``), write cards (``dsparkhub.card``),
print (``dsparkhub.cli``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token
from huggingface_hub.hf_api import RepoFile

from dsparkhub import __version__
from dsparkhub.errors import (
    CardError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConversionRefusedError,
    HubError,
)
from dsparkhub.convert import PROVENANCE_FILE
from dsparkhub.hub.errors import HUB_ERRORS, hub_error, is_upload_failure, redactor
from dsparkhub.hub.files import NEVER_DELETE, README, deletions, local_files, missing_image_links, select_files
from dsparkhub.hub.remote import check_remote, guard_readme, lfs_objects_present, remote_state, same_file
from dsparkhub.hub.trust import check_bytes
from dsparkhub.io.hashing import hash_and_scan
from dsparkhub.repo_ids import check_repo_id
from dsparkhub.validate.report import validation_error
from dsparkhub.validate.record import VALIDATION_FILE


def _training_output(layout: str | None) -> bool:
    """Whether drafters of ``layout`` are a trainer's own output, read by dsparkhub but not loaded by vLLM (the
    recipe's ``training_output``; an unknown name: False)."""
    from dsparkhub.layouts.recipes import load_recipes

    found = [r for r in load_recipes() if r.name == layout]
    return bool(found and found[0].typed.training_output)


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
        forced: True when ``force`` overrode a refusal (validation, training layout, NaN / Inf, fingerprints).
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


# ---- provenance, validation, commit text ---------------------------------------------------------------------


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


def _run_validation(draft_dir: Path, target: str | None, endpoint: str | None = None, token: str | None = None, *,
                    record=None, seen: dict | None = None):
    """The drafter's validation (``dsparkhub.validate``, imported here so that reading the Hub does not import the
    checkers); a Hub target is read from the push's own endpoint with its token, not from the default Hub. The
    settings-independent pass comes from ``record`` or the folder's ``validation.json`` when its key matches
    (:func:`dsparkhub.validate.record.validate_reusing`); ``seen`` gets ``"record"`` (the one used, or None) and
    ``"stale"`` (why a record there was not used, or None)."""
    from dsparkhub.target import open_target
    from dsparkhub.validate.record import validate_reusing

    if target is not None and not Path(target).exists():
        target = open_target(target, endpoint=endpoint, token=token)
    why: list[str] = []
    report, used = validate_reusing(draft_dir, target, record=record, note=why.append)
    if seen is not None:
        seen.update(record=used, stale=why[0] if why else None)
    return report


def _validation_gate(draft_dir: Path, target: str | None, endpoint: str | None, token: str | None, force: bool,
                     r, record=None, seen: dict | None = None) -> tuple[object, dict, bool]:
    """Validate the drafter before a push: ``(ValidationReport, its to_dict(), forced)`` (``record`` / ``seen``: see
    :func:`_run_validation`).

    Raises:
        ValidationFailedError: validation found errors and ``force`` is False (``r`` redacts the message).
        ConversionRefusedError: the folder is in a training layout (DeepSpec) and ``force`` is False.
    """
    forced = False
    validation = _run_validation(draft_dir, target, endpoint, token, record=record, seen=seen)
    report_validation = validation.to_dict()
    if not validation.ok:
        if not force:
            raise validation_error(
                validation, against=target or "vLLM's contract", refusing="refusing to push", path=draft_dir,
                redact=r, hint="fix the drafter (see `dsparkhub validate`), or pass --force to push anyway "
                               "(recorded in the commit message)")
        forced = True
    if _training_output(getattr(validation, "layout", None)):
        if not force:
            raise ConversionRefusedError(
                f"{draft_dir} is in the {validation.layout!r} training layout, which vLLM does not load",
                path=draft_dir, hint="convert it first (`dsparkhub convert DRAFT --target TARGET --out OUT`) and "
                                     "push OUT, or pass --force to publish the training layout as is")
        forced = True
    return validation, report_validation, forced


def _commit_text(plan: PushPlan, files: dict[str, Path], hashes: dict[str, str], provenance: dict | None,
                 validation, forced: list[str], fingerprint: str | None, redactor, message: str | None = None,
                 description: str | None = None) -> tuple[str, str]:
    added, changed, deleted = (len(plan.by_action(a)) for a in ("add", "change", "delete"))
    summary = message or f"dsparkhub push: {added} added, {changed} changed, {deleted} deleted"
    if forced:
        summary += f" (FORCED past {' and '.join(forced)})"
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


def _diff(files: dict[str, Path], hashes: dict[str, str], remote: dict[str, RepoFile],
          delete: set[str] = frozenset()) -> list[FilePlan]:
    """What the commit does per file; remote files absent locally are deleted when in ``delete`` (see
    :func:`dsparkhub.hub.files.deletions`), else kept."""
    out = []
    for path, local in files.items():
        sha, size = hashes[str(local)], local.stat().st_size
        r = remote.get(path)
        if r is None:
            out.append(FilePlan(path, "add", size, None, sha, None))
        else:
            action = "unchanged" if same_file(local, sha, r) else "change"
            out.append(FilePlan(path, action, size, r.size, sha, r.lfs is not None))
    for path, r in remote.items():
        if path not in files and path not in NEVER_DELETE:  # .gitattributes: the Hub's, never planned
            action = "delete" if path in delete else "keep"
            out.append(FilePlan(path, action, None, r.size, None, r.lfs is not None))
    return sorted(out, key=lambda f: f.path)


# ---- push -------------------------------------------------------------------------------------------------------


def _check_card_images(readme: Path, in_folder: set[str]) -> None:
    """Refuse a card that links images the drafter folder lacks (the Hub would show them broken).

    Raises:
        CardError: naming every missing link, in order.
    """
    missing = missing_image_links(readme.read_text(encoding="utf-8", errors="replace"), in_folder)
    if missing:
        raise CardError(f"{README} links {len(missing)} image(s) the folder lacks: {', '.join(missing)}", path=readme,
                        hint="write the card again with `dsparkhub card` (it writes its plots beside it), add the "
                             "files, or remove the links")


def push(draft_dir: str | Path, repo_id: str, *, revision: str | None = None, private: bool = False,
         dry_run: bool = False, force: bool = False, token: str | None = None, endpoint: str | None = None,
         target: str | None = None, validate: bool = True, expect_head: str | None = None,
         include: list[str] | None = None, exclude: list[str] | None = None, delete: list[str] | None = None,
         commit_message: str | None = None, commit_description: str | None = None,
         create_pr: bool = False, validation_record=None,
         on_plan: Callable[[PushReport], None] | None = None) -> PushReport:
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
        force: push even when validation finds errors, the weights hold NaN / Inf, or the card / results name
            another drafter fingerprint (each recorded in the commit message and ``report.notes``).
        token: Hub token; default ``HF_TOKEN`` or the huggingface_hub login. Never shown or stored.
        endpoint: Hub URL (default huggingface_hub's, i.e. ``HF_ENDPOINT`` or https://huggingface.co).
        target: the target to validate against (folder, Hub repo id); None lets ``validate`` check the drafter alone.
        validate: run validation at all (False only for callers that validated just before; the folder's
            ``validation.json`` is then pushed as it is).
        validation_record: the drafter's :class:`~dsparkhub.validate.record.ValidationRecord` when one was just
            made (the quickstart hands on convert's); otherwise the folder's ``validation.json`` is used when its key
            matches the drafter and ``target``. A ``validation.json`` that does not match (stale, another target,
            malformed) is left out of the upload with a note, and the drafter is validated here.
        expect_head: the remote head commit (full sha or a prefix of 7+ characters) a ``--dry-run`` showed; the
            push is refused when the branch has moved since, so what was reviewed is what gets pushed.
        include / exclude: fnmatch patterns over the folder's POSIX paths: push only matching / not matching files.
        delete: fnmatch patterns over repo paths: remote files the folder lacks that match are deleted
            (``.gitattributes`` never; ``README.md`` only when named exactly).
        commit_message / commit_description: the commit's summary (default: counts of the changes) and a text put
            before dsparkhub's own description (file hashes, validation, provenance).
        create_pr: open a pull request against ``main`` instead of committing to it (``report.pr_url``).
        on_plan: called with the report once the plan is final, before anything is uploaded (not on dry runs, whose
            report is the plan), so a caller can show what is about to be sent.

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
        CardError: the folder's ``README.md`` serve commands name a placeholder or a local path, or it links an
            image the folder lacks (:func:`_check_card_images`); or the Hub's
            ``README.md`` was not written by dsparkhub and would be replaced or deleted without ``delete`` naming it.
        CheckpointNotFoundError: ``draft_dir`` is not a folder, or nothing is left to push after ``include`` /
            ``exclude``.
        CheckpointFormatError: ``dsparkhub_provenance.json`` is not a JSON object, a safetensors header is
            malformed, or (no ``force``) the weights hold NaN / Inf (:func:`dsparkhub.hub.trust.check_bytes`).
        ResultsError: (no ``force``) the card, a results file or ``dspark_sts.json`` names another drafter
            fingerprint than the weights hash to.
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
    in_folder = set(files)
    files = select_files(files, include, exclude, draft_dir)
    if README in files:
        _check_card_images(files[README], in_folder)
        # imported only for a folder with a card: dsparkhub.card.render costs ~0.25 s of imports (calibrate,
        # verify.results.schema), a third of an unchanged re-run of a small README-less release
        from dsparkhub.card.render import serve_command_problems

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

    seen: dict = {}
    validation, report_validation, forced = _validation_gate(draft_dir, target, endpoint, token, force, r,
                                                             validation_record, seen) if validate \
        else (None, None, False)
    if seen.get("stale") and VALIDATION_FILE in files:  # never publish a record that does not describe this upload
        del files[VALIDATION_FILE]
        left_out[VALIDATION_FILE] = r(seen["stale"].replace(f"{VALIDATION_FILE} ignored: ", "stale record: "))
    provenance = _read_provenance(draft_dir)
    # one read of every byte: sha256 (the plan, the fingerprint) and the NaN / Inf count of the weights
    hashes, nonfinite = hash_and_scan(list(files.values()))
    fingerprint, overridden = check_bytes(draft_dir, files, hashes, nonfinite, force=force)
    forced_past = (["validation errors"] if forced else []) + overridden

    api = HfApi(endpoint=endpoint, token=token)
    repo_exists, branch_exists, head, remote = remote_state(api, repo_id, revision, token)
    if repo_exists and not branch_exists:
        # a new branch starts from main: plan against main's files
        _, main_exists, head_main, remote = remote_state(api, repo_id, "main", token)
        head = head_main if main_exists else None
    if expect_head is not None and not (len(expect_head) >= 7 and (head or "").startswith(expect_head)):
        raise HubError(f"{repo_id}@{revision} has moved since the plan you reviewed: its head is "
                       f"{(head or 'absent')[:12]}, --expect-head says {expect_head[:12]}",
                       hint="run --dry-run again, review the new plan, and push with its head")
    kept = set(left_out)

    def plan_files(remote_now: dict[str, RepoFile], head_now: str | None) -> list[FilePlan]:
        guard_readme(api, repo_id, head_now, files, remote_now, delete, token)
        return _diff(files, hashes, remote_now, deletions(files, remote_now, delete, kept))

    plan = PushPlan(repo_id, revision, repo_exists, branch_exists, head, plan_files(remote, head))
    report = PushReport(plan, dry_run=dry_run, validation=report_validation, forced=bool(forced_past))
    if overridden:
        report.notes.append(f"--force: pushed past {' and '.join(overridden)}")
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
            _, _, head, remote = remote_state(api, repo_id, revision, token)
            plan.parent_commit, plan.files = head, plan_files(remote, head)
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"create {repo_id}@{revision}", repo_id, token) from exc

    if on_plan is not None:
        on_plan(report)
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
    already = lfs_objects_present(api, repo_id, revision, adds, token)
    summary, description = _commit_text(plan, files, hashes, provenance, validation, forced_past, fingerprint, r,
                                        commit_message, commit_description)
    try:
        info = api.create_commit(repo_id, ops, commit_message=summary, commit_description=description,
                                 revision=revision, parent_commit=head, create_pr=create_pr)
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"commit to {repo_id}@{revision}", repo_id, token) from exc
    except RuntimeError as exc:
        if not is_upload_failure(exc):
            raise
        cause = exc.__cause__ if isinstance(exc.__cause__, HUB_ERRORS) else exc
        raise hub_error(cause, f"upload to {repo_id}@{revision}", repo_id, token) from exc
    report.commit_oid, report.commit_url, report.pr_url = info.oid, info.commit_url, info.pr_url

    remote_after = check_remote(api, repo_id, info.oid, files, hashes, token,
                                 {f.path for f in plan.by_action("keep")})
    report.bytes_uploaded = sum(
        f.size or 0 for f in plan.files
        if f.action in ("add", "change") and not (remote_after[f.path].lfs is not None and f.sha256 in already))
    report.remote_check = "ok"
    return report
