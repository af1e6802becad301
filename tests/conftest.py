"""Shared fixtures: no network, a private HF home, and the embedded example built once per machine (cached)."""

from __future__ import annotations

import importlib
import ipaddress
import os
import socket
import tempfile

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
