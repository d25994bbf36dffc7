#!/usr/bin/env bash
# On a CUDA machine: the device-aware tests on the GPU (KEYFORMER_TEST_DEVICE=cuda pytest -m on_device: the
# core semantics, full == transformers, physical == mask, padded batch == alone, ... re-checked on CUDA in
# fp32 with TF32 off), then the GPU benchmark and profile. Writes into $OUT (default results/bench/gpu).
# Extra arguments go to keyformer-gpu-bench, e.g. --time-budget-s 300 --gen-cap 512.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results/bench/gpu}"
mkdir -p "$out"
KEYFORMER_TEST_DEVICE=cuda .venv/bin/python -m pytest -m on_device -p no:cacheprovider 2>&1 | tee "$out/tests.txt"
.venv/bin/keyformer-gpu-bench --out "$out" "$@"
.venv/bin/keyformer-gpu-profile 2>&1 | tee "$out/gpu_profile.txt"
