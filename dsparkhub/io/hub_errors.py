"""huggingface_hub / transport errors -> :class:`~dsparkhub.errors.HubError` with a hint, the token kept out.

huggingface_hub 2.4 raises typed errors (``HfHubHTTPError`` and subclasses, ``httpx2`` transport errors,
``OfflineModeIsEnabled``, ``LocalTokenNotFoundError``); :func:`hub_error` turns one into a ``HubError`` whose message
names the action, the repo and the HTTP status, with one hint on what to do (the original is kept as ``__cause__`` by
the caller's ``raise ... from exc``). Every message goes through :func:`redactor` (:func:`dsparkhub.secrets.redact`
plus the token in use).
"""

from __future__ import annotations

import httpx2
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from dsparkhub.errors import HubError
from dsparkhub.secrets import redact

#: the errors a Hub request may raise that :func:`hub_error` maps
HUB_ERRORS = (HfHubHTTPError, httpx2.TransportError, OfflineModeIsEnabled, LocalTokenNotFoundError)


def redactor(token: str | None):
    """A function ``text -> text`` that removes every known token (:func:`dsparkhub.secrets.redact`) and ``token``."""
    def _r(text: str) -> str:
        text = redact(text)
        return text.replace(token, "***") if token and len(token) >= 4 else text

    return _r


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def hub_error(exc: BaseException, action: str, repo_id: str, token: str | None, *, reading: bool = False
              ) -> HubError:
    """Map a huggingface_hub / transport error to a HubError with a hint (the original stays as ``__cause__``).
    ``reading``: the failed call only read (a target's headers), so the push wording is left out."""
    r = redactor(token)
    detail = r(" ".join(str(exc).split()))[:600]
    status = _status(exc)
    ns = repo_id.split("/")[0]
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(f"cannot {action}: huggingface_hub offline mode is on", hint="unset HF_HUB_OFFLINE")
    if isinstance(exc, LocalTokenNotFoundError):
        return HubError(f"cannot {action}: no Hugging Face token found",
                        hint="set HF_TOKEN or run `hf auth login` (a token with write access)")
    if status == 401:
        return HubError(f"cannot {action}: the Hub refused the token (HTTP 401). {detail}",
                        hint="the token is missing, expired or invalid; set HF_TOKEN or run `hf auth login`")
    if status == 403:
        return HubError(f"cannot {action}: the token may not write to {repo_id!r} (HTTP 403). {detail}",
                        hint=f"use a token with write access to the namespace {ns!r} (fine-grained tokens need "
                             "'write' on it)")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"cannot {action}: revision not found in {repo_id!r}. {detail}",
                        hint="check --revision; push creates a missing branch from main")
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return HubError(f"cannot {action}: {repo_id!r} was not found, or this token cannot see it (HTTP "
                        f"{status}). {detail}", hint="check the repo id and that the token can read it")
    if status == 412:
        return HubError(f"cannot {action}: {repo_id!r} changed on the Hub after the push was planned (HTTP 412, "
                        f"parent commit mismatch); nothing was committed. {detail}",
                        hint="run the push again: it re-plans against the new remote state")
    if status is not None and status >= 500:
        return HubError(f"cannot {action}: Hub server error (HTTP {status}); nothing was committed. {detail}",
                        hint="retry later; LFS objects already uploaded are kept and not sent again")
    if isinstance(exc, (httpx2.TransportError, RuntimeError)):
        if reading:
            return HubError(f"cannot {action}: network error talking to the Hub ({detail})",
                            hint="check the connection (or --endpoint / HF_ENDPOINT); a local folder is read when "
                                 "it exists")
        return HubError(f"cannot {action}: network error talking to the Hub ({detail}); nothing was committed",
                        hint="check the connection / --endpoint and run the push again; it resumes (LFS objects "
                             "already uploaded are skipped)")
    return HubError(f"cannot {action}: {detail}", hint="see the Hub's message above")


def is_upload_failure(exc: RuntimeError) -> bool:
    """huggingface_hub wraps a failed LFS upload in ``RuntimeError("Error while uploading ...")`` (_commit_api.py)."""
    return isinstance(exc.__cause__, HUB_ERRORS) or str(exc).startswith("Error while uploading")
