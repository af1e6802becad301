"""Hub repo ids: the one rule dsparkhub applies to ``namespace/name`` everywhere (push, targets, cards).

The rule is huggingface_hub's :func:`huggingface_hub.utils.validate_repo_id` (1-96 characters of ``[A-Za-z0-9._-]``
per part, not starting or ending with ``.`` / ``-``, no ``--`` / ``..``, not ending in ``.git``) plus one rule of
ours: the namespace is required (``tiny`` alone names no repo anyone else can find).

No network, no state; huggingface_hub is imported on first use (it is not needed to import dsparkhub).
"""

from __future__ import annotations

from dsparkhub.errors import HubError


def is_repo_id(value: object, *, revision: bool = False) -> bool:
    """True when ``value`` is a string ``namespace/name`` the Hub accepts (see the module docstring).

    ``revision``: also accept ``namespace/name@REVISION`` (a branch, tag or commit: ``[A-Za-z0-9_./-]+``).
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(value, str):
        return False
    if revision and "@" in value:
        value, _, rev = value.partition("@")
        if not rev or not all(c.isascii() and (c.isalnum() or c in "_./-") for c in rev):
            return False
    if value.count("/") != 1:  # ours: a namespace is required
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is ``namespace/name`` as the Hub accepts it.

    Raises:
        HubError: anything else (missing namespace, extra ``/``, ``--`` / ``..``, bad characters, > 96 chars).
    """
    if not is_repo_id(repo_id):
        raise HubError(f"invalid Hub repo id {repo_id!r}: expected NAMESPACE/NAME",
                       hint="use your user or organisation name, a slash and the repo name, e.g. "
                            "alice/qwen3-8b-dspark (letters, digits, '.', '_', '-'; no '--' or '..')")
    return repo_id
