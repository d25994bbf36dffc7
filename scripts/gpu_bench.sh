#!/usr/bin/env bash
# The prepared GPU run (issue 23): one call on a lent H200, under 8 minutes, no network.
#
#   bash scripts/gpu_bench.sh --stage     # here, once (PyPI reachable): the wheels the GPU image lacks -> .whl/
#   bash scripts/gpu_bench.sh             # on the GPU machine (carry .whl): writes into $OUT (default results/bench/gpu/run)
#   bash scripts/gpu_bench.sh --dry-run   # CPU, tiny shapes, the same steps and code path (CI runs it)
#
# Steps: (1) on-device tests: the captured decode step == the eager one (tests/test_graphs.py), then every
# on_device test (capped); (2) batch-1 latency at GPT-J-6B and Llama-3-8B shapes (random weights, bf16) for full,
# window, H2O and Keyformer at 0.5, decode eager and CUDA-graph captured (keyformer-gpu-bench --graphs);
# (3) throughput at the largest batch that fits the device memory, full vs each policy, GPT-J-6B shape.
# Outputs (7 files, what the device tool brings back): log.txt, tests_graphs.txt, tests_on_device.txt,
# latency/gpu_bench.{json,txt}, throughput/gpu_bench.{json,txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=run
case "${1:-}" in
  "") ;;
  --dry-run) mode=dry ;;
  --stage) mode=stage ;;
  *) echo "gpu_bench.sh: unknown option '$1'; valid: --dry-run, --stage (or none)" >&2; exit 2 ;;
esac
TRANSFORMERS_VERSION=5.24.0  # the GPU image has an older transformers; the project needs >= 5.20

if [[ $mode == stage ]]; then
  mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "transformers==$TRANSFORMERS_VERSION"
  ls -la .whl
  exit 0
fi

if [[ $mode == dry ]]; then
  out="${OUT:-$(mktemp -d)/gpu_bench_dry}"
  PY=${PYTHON:-.venv/bin/python}
  export KEYFORMER_COMPILE=0 KEYFORMER_TEST_DEVICE=cpu
  tiny=(--tiny --lengths 16 --gen-cap 8)
  lat_models=(gptj llama3)
  tests_cap=60
else
  out="${OUT:-results/bench/gpu/run}"
  PY=${PYTHON:-python3}
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export KEYFORMER_TEST_DEVICE=cuda
  tiny=(--lengths 2048 --gen-cap 64)
  lat_models=(gptj llama3)
  tests_cap=150
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
mkdir -p "$out/latency" "$out/throughput"
log="$out/log.txt"
t0=$(date +%s)
{
  echo "gpu_bench.sh mode=$mode $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
} 2>&1 | tee "$log"

step() { echo "== $1 ($(( $(date +%s) - t0 )) s)" | tee -a "$log"; }

step "on-device tests: captured decode step == eager"
set +e
"$PY" -m pytest -p no:cacheprovider -m on_device tests/test_graphs.py -rs 2>&1 | tee "$out/tests_graphs.txt" | tail -3 | tee -a "$log"
step "on-device tests: all (capped at ${tests_cap} s)"
if [[ $mode == dry ]]; then
  echo "dry run: the full on_device suite runs on the GPU only" | tee "$out/tests_on_device.txt" | tee -a "$log"
else
  timeout "$tests_cap" "$PY" -m pytest -p no:cacheprovider -m on_device -x 2>&1 | tee "$out/tests_on_device.txt" \
    | tail -3 | tee -a "$log"
fi
set -e

step "batch-1 latency, eager vs captured: ${lat_models[*]}"
"$PY" -m keyformer.lab.bench.gpu "${tiny[@]}" --models "${lat_models[@]}" --policies window h2o keyformer \
  --graphs --no-throughput --time-budget-s 200 --out "$out/latency" 2>&1 | grep -v '^\[transformers\]' | tee -a "$log"

step "throughput at the largest batch that fits, gptj"
if [[ $mode == dry ]]; then thr=(--max-batch 2); else thr=(--max-batch 64); fi
"$PY" -m keyformer.lab.bench.gpu "${tiny[@]}" --models gptj --policies window h2o keyformer "${thr[@]}" \
  --time-budget-s 120 --out "$out/throughput" 2>&1 | grep -v '^\[transformers\]' | tee -a "$log"
step "done: $out"
