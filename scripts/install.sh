#!/usr/bin/env bash
# Install exatrain and everything its tests need into the current Python environment.
# torch: an already importable build (CUDA, ROCm or CPU) is kept as it is; only when none is
# importable is the CPU build pinned at 2.13.0 installed (an unpinned torch pulls a multi-GB
# CUDA build). The `train` extra's range accepts whatever build is already there.
set -euo pipefail
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[all,dev]"
