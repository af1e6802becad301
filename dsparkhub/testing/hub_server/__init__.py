"""A local Hugging Face Hub for tests: the HTTP protocol huggingface_hub 2.4 speaks, nothing more.

``LocalHub`` is a threaded stdlib HTTP server on ``127.0.0.1`` (random port) that answers the requests
``huggingface_hub.HfApi(endpoint=hub.url)`` makes for ``create_repo``, ``create_branch``, ``create_commit`` (the classic
preupload -> LFS batch -> PUT -> verify -> NDJSON commit path, used when ``HF_HUB_DISABLE_XET=1`` or ``hf_xet`` is
absent), ``repo_info`` / ``model_info``, ``list_repo_refs``, ``list_repo_tree``, ``get_paths_info``, ``whoami``,
``hf_hub_download`` / ``snapshot_download`` (``/resolve/`` HEAD and GET with the ETag / X-Repo-Commit / X-Linked-Etag /
X-Linked-Size headers) and ``get_safetensors_metadata`` (HTTP ``Range`` reads). Wire formats follow
huggingface_hub 2.4.0 ``_commit_api.py``, ``lfs.py``, ``hf_api.py`` and ``file_download.py``.

Storage: file bytes live on disk under ``root`` — LFS objects keyed by sha256 (``lfs/<sha256>``), regular files keyed
by their git blob sha1 (``git/<sha1>``); repositories, commits (oid, parent, tree) and branches live in memory.

For tests it records every request (:class:`HubRequest`: method, path, whether it is a write) and injects faults
(:meth:`LocalHub.inject`): an HTTP status (5xx / 401 / 403 ...), a dropped connection (for a PUT: after reading part
of the body, i.e. mid-upload), or a callable run before the request is served (to change the repo between a client's
plan and its commit). Faults are count-limited.

Pull requests: a commit with ``create_pr=1`` opens ``refs/pr/N`` from its parent commit (the branch is left alone) and
answers ``pullRequestUrl`` (``.../discussions/N``) as the Hub does; there is no discussion API.

Deliberately not implemented: xet storage, multipart LFS uploads, discussions / PR merging, tags, datasets and spaces,
pagination (one page), gated repos. Unknown routes answer 404 with a JSON error naming the route, so gaps show up
loudly.

Modules: :mod:`~dsparkhub.testing.hub_server.store` (wire-level records: entries, commits, repos, requests, faults),
:mod:`~dsparkhub.testing.hub_server.hub` (:class:`LocalHub`: lifecycle, request log, faults, server-side helpers,
storage), :mod:`~dsparkhub.testing.hub_server.handler` (HTTP plumbing, tokens and access, routing),
:mod:`~dsparkhub.testing.hub_server.repos` (repo info, refs, tree, paths-info, branches, repo creation, ``/resolve/``)
and :mod:`~dsparkhub.testing.hub_server.uploads` (preupload, LFS batch / PUT / verify, NDJSON commits).
"""
