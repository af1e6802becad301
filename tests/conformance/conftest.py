"""Fixtures of the conformance suite: the upstream-made drafters (``fixtures/``) and the toy target they were
made against (rebuilt with the same seed as ``generators/make_fixtures.py`` used)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsparkhub.testing.factories import make_qwen3_target

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def toy_target(tmp_path_factory) -> Path:
    """The toy Qwen3 verifier the fixtures were generated against (hidden 32, 4 layers, vocab 128)."""
    return make_qwen3_target(tmp_path_factory.mktemp("target") / "toy-qwen3-target")


@pytest.fixture
def fixture_copy(tmp_path):
    """``fixture_copy(name)``: a private copy of an upstream-made fixture (tests may edit it)."""
    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(FIXTURES / name, dest)
        return dest
    return copy


def need_sglang() -> None:
    """Skip a test that runs ``.venv-sglang`` when it is missing here; fail it in CI (``CI=true``)."""
    import os

    from dsparkhub.verify.sglang.checks import find_sglang_python

    if find_sglang_python() is None:
        reason = ".venv-sglang is missing: build it with `bash scripts/setup_sglang.sh`"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the SGLang checks, but {reason}")
        pytest.skip(reason)
