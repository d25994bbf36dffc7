#!/usr/bin/env bash
# Create .venv-kvpress (git-ignored) with kvpress from PyPI and its own transformers (< 5.3).
# kvpress is never vendored; torch is pinned to the main venv's build (CPU here).
# Usage: bash scripts/setup_kvpress_venv.sh [kvpress version, default 0.5.5]
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-0.5.5}"
PY="${PYTHON:-python3}"
if [ ! -x .venv-kvpress/bin/python ]; then
  "$PY" -m venv .venv-kvpress
fi
.venv-kvpress/bin/pip install --quiet --upgrade pip
# CPU torch first, the same build as the main venv, so kvpress does not pull a CUDA build (TORCH overrides).
TORCH="${TORCH:-$(.venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' 2>/dev/null || echo 'torch>=2.3.1,<3')}"
.venv-kvpress/bin/pip install --quiet "$TORCH"
.venv-kvpress/bin/pip install --quiet "kvpress==${VERSION}"
.venv-kvpress/bin/python - <<'PY'
import kvpress, torch, transformers
from importlib.metadata import version
print(f"kvpress {version('kvpress')}  transformers {transformers.__version__}  torch {torch.__version__}")
PY
