"""Shared fixtures: no network, a private HF home, and the embedded example built once per machine (cached)."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def example():
    """The embedded, really trained example (target + DeepSpec DSpark run + z-lab DFlash drafter).

    Built once and cached under ``DSPARKHUB_CACHE`` (default ``~/.cache/dsparkhub``); see ``dsparkhub.example``.
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
