"""Shared fixtures: no network, a private HF home, and the embedded example built once per machine (cached)."""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Set before any test module imports huggingface_hub: it reads these into module constants at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="dsparkhub-tests-hf-home-"))


@pytest.fixture(autouse=True)
def _offline_hf(tmp_path_factory, monkeypatch):
    """Point huggingface_hub at a private, empty home and forbid the network for every test."""
    home = tmp_path_factory.getbasetemp() / "hf_home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def require(module: str):
    """Import ``module`` for a test module; skip when it is missing locally, FAIL in CI (``CI=true``), where every
    test must run (a stale skip would hide the test)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{module} is not importable in CI ({exc}); scripts/setup.sh --test installs it",
                        pytrace=False)
        pytest.skip(f"{module} is not installed ({exc})", allow_module_level=True)


_real_connect = socket.socket.connect


def _loopback_only_connect(sock, address):
    """Unit tests talk only to servers they start on this machine (the local Hub, fake vLLM servers)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local:
            raise OSError(f"test tried to reach {host}:{address[1]}; tests may only connect to loopback servers")
    return _real_connect(sock, address)


@pytest.fixture(autouse=True)
def _socket_guard(monkeypatch):
    """Refuse every non-loopback connection from the test process (child processes are not affected)."""
    monkeypatch.setattr(socket.socket, "connect", _loopback_only_connect)


@pytest.fixture(scope="session")
def example():
    """The embedded, really trained example (target + DeepSpec DSpark run + z-lab DFlash drafter).

    The shipped build laid out under ``DSPARKHUB_CACHE`` (default ``~/.cache/dsparkhub``); see ``dsparkhub.example``.
    """
    from dsparkhub.example import build_example

    return build_example()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Qwen3 target and a DeepSpec DSpark step folder for it, built once per test module:
    ``(target folder, step folder)``."""
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    root = tmp_path_factory.mktemp("models")
    target = make_qwen3_target(root / "target")
    run = make_deepspec_drafter(root / "run", target)
    return target, run / "step_100"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny random target (vocab 64, hidden 32, 3 layers, EOS 0) with two drafters for it, built once per test
    module (the reference engine and batching tests): ``(root, target model)``, where ``root / "target"`` is the
    target folder, ``root / "dspark_run"`` a DSpark drafter (layers 0, 1; block 4) and ``root / "dflash"`` a DFlash
    drafter (layers 1, 2; block 5)."""
    from dsparkhub.example.layouts import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("tiny")
    model = make_tiny_target(root / "target", vocab_size=64, hidden_size=32, num_hidden_layers=3, eos_token_id=0)
    make_tiny_drafter(root / "dspark_run", model, kind="dspark", target_layer_ids=[0, 1], block_size=4)
    make_tiny_drafter(root / "dflash", model, kind="dflash", target_layer_ids=[1, 2], block_size=5)
    return root, model


class FakeHTTPServer:
    """A stand-in HTTP server on 127.0.0.1 (an ephemeral port, served from a daemon thread) for the server backends'
    tests (``from conftest import FakeHTTPServer``).

    Subclasses answer through :meth:`get` (``path`` -> ``(status, body, content type)``) and :meth:`post` (``path``,
    the parsed JSON body -> the same); every POST body is kept in ``requests`` first. ``url`` is
    ``http://127.0.0.1:PORT``; :meth:`close` stops the server.
    """

    def __init__(self):
        self.requests: list = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: str | bytes, ctype: str):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(*server.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                self._send(*server.post(self.path, body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def get(self, path: str) -> tuple[int, str | bytes, str]:
        return 404, "{}", "application/json"

    def post(self, path: str, body) -> tuple[int, str | bytes, str]:
        return 404, "{}", "application/json"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def vllm034_check(draft, target) -> tuple[int, dict]:
    """``dsparkhub vllm-check DRAFT --target TARGET --json`` run under vLLM 0.34.0 from ``.venv-vllm034`` (its CPU
    platform refuses the engine stage without triton-cpu): (exit code, report). Skips where the venv is missing
    locally, FAILS in CI (``scripts/setup.sh --test`` builds it); fails when no JSON report was printed."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    python = root / ".venv-vllm034" / "bin" / "python"
    if not python.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(".venv-vllm034 is missing in CI; scripts/setup.sh --test builds it", pytrace=False)
        pytest.skip(".venv-vllm034 is missing: build it with `bash scripts/setup_vllm034.sh`")
    env = dict(os.environ, PYTHONPATH=str(root), VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    env.pop("VLLM_TARGET_DEVICE", None)
    proc = subprocess.run([str(python), "-c", "from dsparkhub.cli import main; main()", "vllm-check", str(draft),
                           "--target", str(target), "--json"], capture_output=True, text=True, env=env, timeout=900)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"vllm-check under vLLM 0.34 printed no report (exit {proc.returncode}):\n{proc.stdout}\n"
                    f"{proc.stderr[-3000:]}")
