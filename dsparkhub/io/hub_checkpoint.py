"""A Hub checkpoint's ``config.json``, index and safetensors headers (never the weights): the Hub reading client
that ``dsparkhub.target`` opens a Hub target with.

Reads only (GET / HEAD and HTTP range reads), every one through ``huggingface_hub.HfApi``; errors are mapped by
:func:`dsparkhub.io.hub_errors.hub_error`. Safetensors headers come from ``HfApi.get_safetensors_metadata``, then go
through dsparkhub's own header checks (:func:`dsparkhub.io.header.parse_header_bytes`). A leaf beside the local
checkpoint reader: it knows nothing of pushes (``dsparkhub.hub``), targets or drafters.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from huggingface_hub import HfApi, constants, get_token, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, SafetensorsParsingError
from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

from dsparkhub.errors import CheckpointFormatError, CheckpointNotFoundError
from dsparkhub.io.checkpoint import INDEX_NAME, Checkpoint
from dsparkhub.io.header import TensorInfo, parse_header_bytes
from dsparkhub.io.hub_errors import HUB_ERRORS, hub_error
from dsparkhub.repo_ids import check_repo_id


def remote_checkpoint_headers(repo_id: str, revision: str | None = None, token: str | None = None,
                              endpoint: str | None = None, *, cache_dir: str | Path | None = None
                              ) -> tuple[dict, dict[str, tuple[str, tuple[int, ...], str]], dict | None]:
    """Read a Hub checkpoint's config and safetensors headers without downloading weights.

    ``config.json`` and ``model.safetensors.index.json`` are fetched with ``hf_hub_download``; the shards' headers
    with ``HfApi.get_safetensors_metadata`` (HTTP range reads of each shard's first bytes; a repo with neither
    ``model.safetensors`` nor the index: ``parse_safetensors_file_metadata`` per top-level ``*.safetensors``). Every
    read is pinned to the commit ``revision`` resolves to.

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


def _shard_metadata(api: HfApi, repo_id: str, sha: str, names: set[str]):
    """``(shards, {shard: SafetensorsFileMetadata})`` of the commit ``sha``: ``get_safetensors_metadata`` for a
    ``model.safetensors`` or an index (its shards in index order), else each top-level ``*.safetensors``.

    huggingface_hub draws a progress bar over the shards; it is silenced here (dsparkhub prints nothing while
    reading headers) unless ``HF_HUB_DISABLE_PROGRESS_BARS=0`` asks for bars.
    """
    if "model.safetensors" in names or INDEX_NAME in names:
        with ExitStack() as stack:
            if constants.HF_HUB_DISABLE_PROGRESS_BARS is not False and not are_progress_bars_disabled():
                stack.enter_context(disable_progress_bars())
            meta = api.get_safetensors_metadata(repo_id, revision=sha)
        return list(dict.fromkeys(meta.weight_map.values())), meta.files_metadata
    shards = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
    if not shards:
        return [], {}
    with ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
        parsed = list(pool.map(lambda f: api.parse_safetensors_file_metadata(repo_id, f, revision=sha), shards))
    return shards, dict(zip(shards, parsed, strict=True))


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
        if "model.safetensors" not in names and INDEX_NAME in names:
            index = _download_json(repo_id, INDEX_NAME, sha, token, endpoint, cache_dir)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointFormatError(f"{INDEX_NAME}: `weight_map` must map tensor names to shard file names",
                                            path=f"{where}/{INDEX_NAME}")
        shards, parsed = _shard_metadata(api, repo_id, sha, names)
        if not shards:
            raise CheckpointNotFoundError("no model.safetensors, index or *.safetensors at the top of the Hub repo",
                                          path=where)
    except HUB_ERRORS as exc:
        raise hub_error(exc, f"read the headers of {repo_id}", repo_id, token, reading=True) from exc
    except EntryNotFoundError as exc:
        raise CheckpointNotFoundError(f"a file named by the repo is missing: {exc}", path=where) from exc
    except SafetensorsParsingError as exc:
        raise CheckpointFormatError(f"malformed safetensors header: {exc}", path=where) from exc
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict] = {}
    for fname in shards:
        meta = parsed[fname]
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
