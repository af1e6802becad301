"""The test suite's own guards: the socket guard refuses non-loopback addresses, markers are strict."""

from __future__ import annotations

import socket

import pytest


def test_socket_guard_refuses_a_public_address():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(OSError, match="only connect to loopback"):
            s.connect(("192.0.2.1", 443))  # TEST-NET-1: never routed
    finally:
        s.close()


def test_socket_guard_lets_loopback_through():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        c.connect(srv.getsockname())
    finally:
        c.close()
        srv.close()


def test_markers_are_strict(pytestconfig):
    assert "--strict-markers" in pytestconfig.getini("addopts")


def test_vllm_check_fails_in_ci_and_skips_locally_without_vllm(monkeypatch):
    """conftest.vllm_check goes through require(): without vLLM a CI run FAILS (pytest.importorskip, which the
    conformance files used before, skipped silently), a local run skips."""
    import sys

    from conftest import vllm_check

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="vllm is not importable in CI"):
        vllm_check("draft", "target")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="vllm is not installed"):
        vllm_check("draft", "target")
