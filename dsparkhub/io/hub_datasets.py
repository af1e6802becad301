"""Fetch a prompt file from a Hub dataset repo (``--datasets hub:owner/name[:path/in/repo.jsonl]``).

The networked half of :mod:`dsparkhub.prompts` (which parses the spec and reads the file): a file already in
the HF cache is read from it without a request; otherwise one probe of the endpoint decides first whether the Hub is
reachable, so an offline machine fails in seconds instead of after huggingface_hub's retries with backoff (~40 s).
huggingface_hub is imported on first use.
"""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import DsparkhubError

OFFLINE_HINT = ("this machine cannot reach the Hub (or HF_HUB_OFFLINE=1 is set); download the JSONL file on a "
                "machine with internet and pass its path instead")


def fetch_dataset_jsonl(repo: str, filename: str | None, *, error: type[DsparkhubError] = DsparkhubError
                        ) -> tuple[Path, str]:
    """Download ``filename`` (default: the repo's single ``*.jsonl`` file) from the Hub dataset repo ``repo``;
    returns (local path in the HF cache, file name in the repo).

    Args:
        repo: ``owner/name`` of a dataset repo.
        filename: path in the repo, or None / ``""`` for its only JSONL file.
        error: the error class raised (the caller's: ``dsparkhub.prompts.files.PromptFileError``).

    Raises:
        error: no network / offline mode and nothing cached, the repo holds no or several JSONL files, or the file
            does not exist (huggingface_hub's own error is chained).
    """
    import httpx2
    from huggingface_hub import hf_hub_download, list_repo_files
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError)

    if filename:  # downloaded before: the HF cache answers without a request, online or not
        try:
            return Path(hf_hub_download(repo, filename, repo_type="dataset", local_files_only=True)), filename
        except LocalEntryNotFoundError:
            pass
    unreachable = hub_unreachable()
    if unreachable:  # one probe instead of huggingface_hub's retries with backoff (~40 s) on every request
        raise error(f"cannot fetch hub:{repo}:{filename or '<jsonl>'}: {unreachable}", hint=OFFLINE_HINT)
    try:
        if not filename:
            files = [f for f in list_repo_files(repo, repo_type="dataset") if f.endswith(".jsonl")]
            if len(files) != 1:
                raise error(f"hub dataset {repo} holds {len(files)} JSONL files "
                            f"({', '.join(files[:10]) or 'none'}); name one as hub:{repo}:FILE")
            filename = files[0]
        local = hf_hub_download(repo, filename, repo_type="dataset")
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as exc:
        raise error(f"cannot fetch hub:{repo}:{filename or '<jsonl>'}: {exc}", hint=OFFLINE_HINT) from exc
    except (RepositoryNotFoundError, EntryNotFoundError) as exc:
        raise error(f"hub:{repo}:{filename}: not found on the Hub ({type(exc).__name__})",
                    hint="check the dataset repo id and file path (repo_type=dataset)") from exc
    except (HfHubHTTPError, httpx2.TransportError) as exc:  # TransportError: no route, DNS, timeouts
        raise error(f"cannot fetch hub:{repo}:{filename or '<jsonl>'}: {exc}", hint=OFFLINE_HINT) from exc
    return Path(local), filename


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hub cannot be reached now (offline mode, or one HEAD of the endpoint failing at the transport level
    within ``timeout_s``), or None when it answered (any HTTP status)."""
    import httpx2
    from huggingface_hub import constants, get_session, is_offline_mode

    if is_offline_mode():
        return "huggingface_hub offline mode is on (HF_HUB_OFFLINE=1) and the file is not in the HF cache"
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s, follow_redirects=False)
    except httpx2.TransportError as exc:
        return f"the Hub at {constants.ENDPOINT} did not answer ({type(exc).__name__}: {exc})"
    return None
