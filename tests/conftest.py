"""Shared fixtures: no network, a private HF home, and the embedded example built once per machine (cached)."""

from __future__ import annotations

import os

import pytest


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


@pytest.fixture(scope="session")
def example():
    """The embedded, really trained example (target + DeepSpec DSpark run + z-lab DFlash drafter).

    Built once and cached under ``DSPARKHUB_CACHE`` (default ``~/.cache/dsparkhub``); see ``dsparkhub.example``.
    """
    from dsparkhub.example import build_example

    return build_example()
