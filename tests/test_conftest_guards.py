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
