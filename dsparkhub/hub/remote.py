"""Read a Hub checkpoint's config and safetensors headers without its weights, and map huggingface_hub's errors.

The networked half of reading a target: :func:`remote_checkpoint` gives a header-only
:class:`~dsparkhub.io.checkpoint.Checkpoint` (HTTP range reads, huggingface_hub ``parse_safetensors_file_metadata``).
:func:`hub_error` turns huggingface_hub / ``httpx2`` errors into :class:`~dsparkhub.errors.HubError` with a hint (the
original stays as ``__cause__``); :func:`dsparkhub.hub.push.push` uses the same mapping. Imports nothing of
dsparkhub above ``io`` so that ``dsparkhub.target`` can use it (no import cycle).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, get_token, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError, HubError
from dsparkhub.io.checkpoint import INDEX_NAME, Checkpoint, TensorInfo, parse_header_bytes
from dsparkhub.secrets import redact

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is ``namespace/name`` as the Hub accepts it.

    Raises:
        HubError: anything else (missing namespace, extra ``/``, ``--`` / ``..``, bad characters, > 96 chars).
    """
    if (not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id
            or repo_id.endswith((".", "-")) or "/." in repo_id or "/-" in repo_id or ".git/" in repo_id + "/"):
        raise HubError(f"invalid Hub repo id {repo_id!r}: expected NAMESPACE/NAME",
                       hint="use your user or organisation name, a slash and the repo name, e.g. "
                            "alice/qwen3-8b-dspark (letters, digits, '.', '_', '-'; no '--' or '..')")
    return repo_id


def redactor(token: str | None):
    """A function that hides ``token`` (and anything :func:`dsparkhub.secrets.redact` knows) in a text."""
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


HUB_ERRORS = (HfHubHTTPError, httpx2.TransportError, OfflineModeIsEnabled, LocalTokenNotFoundError)


# ---- remote headers ---------------------------------------------------------------------------------------------


def remote_checkpoint_headers(repo_id: str, revision: str | None = None, token: str | None = None,
                              endpoint: str | None = None, *, cache_dir: str | Path | None = None
                              ) -> tuple[dict, dict[str, tuple[str, tuple[int, ...], str]], dict | None]:
    """Read a Hub checkpoint's config and safetensors headers without downloading weights.

    ``config.json`` and ``model.safetensors.index.json`` are fetched with ``hf_hub_download``; each shard's header
    with two HTTP range requests (huggingface_hub ``parse_safetensors_file_metadata``, the building block of
    ``get_safetensors_metadata``). Every read is pinned to the commit ``revision`` resolves to.

    Args:
        repo_id: ``namespace/name``.
        revision: branch, tag or commit (default ``main``).
        token: Hub token (default ``HF_TOKEN`` / login); needed for private repos.
        endpoint: Hub URL.
        cache_dir: huggingface_hub cache for the two JSON files (default: the HF cache).

    Returns:
        ``(config, tensors, index)``: the parsed ``config.json``; ``{tensor name: (dtype code, shape, file)}``, e.g.
        ``{"model.embed_tokens.weight": ("BF16", (V, H), "model-00001-of-00004.safetensors")}``; the parsed index or
        None for a single ``model.safetensors``.

    Raises:
        HubError: repo / revision not found, 401 / 403, network error (hint included).
        CheckpointNotFoundError: no ``config.json``, or neither ``model.safetensors`` nor the index (nor any
            ``*.safetensors``) at the top level of the repo.
        CheckpointFormatError: malformed JSON or safetensors header.
    """
    _, config, tensors, index, _ = _remote_read(repo_id, revision, token, endpoint, cache_dir)
    return config, {n: (t.dtype, t.shape, t.file) for n, t in tensors.items()}, index


def remote_checkpoint(repo_id: str, revision: str | None = None, *, token: str | None = None,
                      endpoint: str | None = None, cache_dir: str | Path | None = None) -> Checkpoint:
    """A Hub checkpoint as a header-only :class:`~dsparkhub.io.checkpoint.Checkpoint` (``remote=True``).

    Same reads and errors as :func:`remote_checkpoint_headers`. ``path`` is ``hub:REPO@COMMIT``; each
    :class:`TensorInfo`'s ``start`` is the tensor's offset inside the shard's data section (the header length is not
    transferred) and ``nbytes`` its size; tensor data cannot be read (``Checkpoint.file_path`` raises).
    """
    sha, config, tensors, index, metadata = _remote_read(repo_id, revision, token, endpoint, cache_dir)
    files = list(dict.fromkeys(t.file for t in tensors.values()))
    return Checkpoint(f"hub:{repo_id}@{sha}", config, tensors, files, index, metadata, remote=True)


def _download_json(repo_id: str, filename: str, sha: str, token, endpoint, cache_dir) -> dict:
    path = hf_hub_download(repo_id, filename, revision=sha, token=token, endpoint=endpoint, cache_dir=cache_dir)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(f"{filename} is not valid JSON: {str(exc)[:200]}",
                                    path=f"hub:{repo_id}@{sha}/{filename}") from None
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{filename} must hold a JSON object", path=f"hub:{repo_id}@{sha}/{filename}")
    return data


def _remote_read(repo_id, revision, token, endpoint, cache_dir):
    check_repo_id(repo_id)
    token = token or get_token()
    api = HfApi(endpoint=endpoint, token=token)
    where = f"hub:{repo_id}@{revision or 'main'}"
    try:
        info = api.model_info(repo_id, revision=revision)
        sha = info.sha
        names = {s.rfilename for s in info.siblings or []}
        if "config.json" not in names:
            raise CheckpointNotFoundError("config.json not found in the Hub repo", path=where)
        config = _download_json(repo_id, "config.json", sha, token, endpoint, cache_dir)
        index = None
        if "model.safetensors" in names:
            shards = ["model.safetensors"]
        elif INDEX_NAME in names:
            index = _download_json(repo_id, INDEX_NAME, sha, token, endpoint, cache_dir)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointFormatError(f"{INDEX_NAME}: `weight_map` must map tensor names to shard file names",
                                            path=f"{where}/{INDEX_NAME}")
            shards = list(dict.fromkeys(weight_map.values()))
        else:
            shards = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
        if not shards:
            raise CheckpointNotFoundError("no model.safetensors, index or *.safetensors at the top of the Hub repo",
                                          path=where)
        with ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
            parsed = list(pool.map(lambda f: api.parse_safetensors_file_metadata(repo_id, f, revision=sha), shards))
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"read the headers of {repo_id}", repo_id, token, reading=True) from exc
    except EntryNotFoundError as exc:
        raise CheckpointNotFoundError(f"a file named by the repo is missing: {exc}", path=where) from exc
    except SafetensorsParsingError as exc:
        raise CheckpointFormatError(f"malformed safetensors header: {exc}", path=where) from exc
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict] = {}
    for fname, meta in zip(shards, parsed, strict=True):
        # re-run dsparkhub's own header checks (dtype codes, offsets vs shapes, overlaps) on what the Hub sent
        header = {n: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
                  for n, t in meta.tensors.items()}
        header["__metadata__"] = meta.metadata or {}
        shard_tensors, metadata[fname] = parse_header_bytes(json.dumps(header).encode(), file=fname, data_size=None)
        for name, t in shard_tensors.items():
            if name in tensors:
                raise CheckpointFormatError(f"tensor {name!r} appears in both {tensors[name].file!r} and {fname!r}",
                                            path=where)
            begin = meta.tensors[name].data_offsets[0]
            tensors[name] = TensorInfo(name, t.dtype, t.shape, fname, begin, t.nbytes)
    if index is not None:
        wrong = [n for n, f in index["weight_map"].items() if n not in tensors or tensors[n].file != f]
        if wrong:
            raise CheckpointFormatError(f"{INDEX_NAME} maps {len(wrong)} tensor(s) to shards that do not hold them, "
                                        f"e.g. {wrong[0]!r}", path=f"{where}/{INDEX_NAME}")
    return sha, config, tensors, index, metadata
