"""One HTTP request to a running inference server (``vllm serve``, SGLang), with the errors dsparkhub reports.

Owns only the request and its error mapping; what to send and how to read the answer stay with each backend
(``dsparkhub.verify.vllm.server.VllmServerBackend``, ``sglang_backend.SglangServerBackend``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from dsparkhub.errors import EngineUnavailableError, VerifyError

__all__ = ["server_request"]


def server_request(url: str, payload: dict | None, *, timeout_s: float, server: str, http_hint: str,
                   start_hint: str) -> bytes:
    """GET ``url`` (``payload`` None) or POST ``payload`` as JSON, and return the response body.

    Args:
        url: the full endpoint URL.
        payload: JSON body, or None for a GET.
        timeout_s: socket timeout in seconds.
        server: the server's name in messages (``"vLLM"``, ``"SGLang"``).
        http_hint: the hint of an HTTP error answer.
        start_hint: what to do when nothing answers (after "What to do: ").

    Raises:
        VerifyError: the server answered with an HTTP error (its body, cut at 2,000 characters, is quoted).
        EngineUnavailableError: nothing answers at ``url`` (refused, timed out, dropped).
    """
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:2000]
        raise VerifyError(f"{server} server {url} answered HTTP {exc.code}: {body}", hint=http_hint) from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise EngineUnavailableError(
            f"Cannot reach the {server} server at {url}: {exc}. Why: no server is listening there, or it is "
            f"still loading. What to do: {start_hint}") from exc
