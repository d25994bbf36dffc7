#!/usr/bin/env bash
# The prepared GPU run (issue 23): one call on a lent H200, under 8 minutes, no network.
#
#   bash scripts/gpu_bench.sh --stage     # here, once (PyPI reachable): the wheels the GPU image lacks -> .whl/
#   bash scripts/gpu_bench.sh             # on the GPU machine (carry .whl): writes into $OUT (default results/bench/gpu/run)
#   bash scripts/gpu_bench.sh --dry-run   # CPU, tiny shapes, the same steps and code path (CI runs it)
#
# Steps, each time-boxed so the whole run ends by DEADLINE_S (default 470 s):
# (1) on-device tests: the captured decode step == the eager one (tests/test_graphs.py, experiments/gpu_studies/test_static_full.py);
# (2) batch-1 latency at 4k (4096-token prompt, 64 new) at GPT-J-6B and Llama-3-8B shapes (random weights, bf16)
#     for full, window, H2O and Keyformer at 0.5, decode eager and CUDA-graph captured (keyformer-gpu-bench --graphs);
# (3) the captured full baseline (experiments.gpu_studies.static_full): full over a preallocated, masked cache with its
#     step captured too, against our full (eager) and Keyformer@0.5 (captured), 3 interleaved rounds, both shapes;
# (4) long generation at a fixed KV memory budget (experiments.gpu_studies.gpu_long): full at batch 4 vs each policy at
#     256 tokens at the largest batch that fits the same K/V bytes, GPT-J-6B shape, 512+1024, with the bytes model
#     and the captured full baseline at batch 4;
# (5) the policy contract tests on CUDA (tests/test_policy_contract.py -m on_device, 8 xdist workers), capped.
# Outputs (9 files, what the device tool brings back): log.txt, tests_graphs.txt, tests_on_device.txt,
# latency/gpu_bench.{json,txt}, static/static_full.{json,txt}, fixed/gpu_long.{json,txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=run
case "${1:-}" in
  "") ;;
  --dry-run) mode=dry ;;
  --stage) mode=stage ;;
  *) echo "gpu_bench.sh: unknown option '$1'; valid: --dry-run, --stage (or none)" >&2; exit 2 ;;
esac
# The GPU image (torch 2.11, transformers 5.17, huggingface_hub 1.33) lacks these; transformers 5.24 is the newest
# that accepts its huggingface_hub. Pure-Python sdists (antlr4, rouge-score, hqq) are built into wheels here.
WHEELS=(transformers==5.24.0 hydra-core==1.3.2 omegaconf==2.3.0 gguf==0.19.0 nltk==3.10.4 wonderwords==3.0.1)
SDISTS=(antlr4-python3-runtime==4.9.3 rouge-score==0.1.2)  # not hqq: transformers imports it when present, and it needs termcolor

if [[ $mode == stage ]]; then
  mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
  "${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps -w .whl "${SDISTS[@]}"
  ls -la .whl
  exit 0
fi

if [[ $mode == dry ]]; then
  out="${OUT:-$(mktemp -d)/gpu_bench_dry}"
  PY=${PYTHON:-.venv/bin/python}
  export KEYFORMER_COMPILE=0 KEYFORMER_TEST_DEVICE=cpu
  lat=(--tiny --lengths 16 --gen-cap 8)
  static=(--tiny --lengths 16 --gen-cap 8 --rounds 1)
  fixed=(--tiny --settings 32+16 --budgets 8 --full-batch 2 --max-batch 8)
else
  out="${OUT:-results/bench/gpu/run}"
  PY=${PYTHON:-python3}
  if compgen -G ".whl/*.whl" > /dev/null; then
    rm -rf /tmp/site  # a warm machine keeps an earlier call's packages there (an hqq there broke transformers)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export KEYFORMER_TEST_DEVICE=cuda
  lat=(--lengths 4096 --gen-cap 64)
  static=(--lengths 4096 --gen-cap 64 --rounds 3)
  fixed=(--settings 512+1024 --budgets 256 --full-batch 4 --max-batch 64)
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
deadline=${DEADLINE_S:-470}
mkdir -p "$out/latency" "$out/static" "$out/fixed"
log="$out/log.txt"
t0=$(date +%s)
{
  echo "gpu_bench.sh mode=$mode $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "dirty: $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) tracked files"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
} 2>&1 | tee "$log"

step() { echo "== $1 ($(( $(date +%s) - t0 )) s)" | tee -a "$log"; }
left() { echo $(( deadline - ($(date +%s) - t0) )); }
rc() { echo "exit $1" | tee -a "$log"; [[ $1 == 0 ]] || status=1; }
status=0
set +e  # a failing step is logged with its exit status; the next steps still run; the script exits 1 at the end

step "on-device tests: captured decode step == eager"
"$PY" -m pytest -p no:cacheprovider -m on_device tests/test_graphs.py experiments/gpu_studies/test_static_full.py -rs 2>&1 | tee "$out/tests_graphs.txt" | tail -3 | tee -a "$log"
rc "${PIPESTATUS[0]}"

step "batch-1 latency at 4k, eager vs captured: gptj llama3"
"$PY" -m keyformer.lab.bench.gpu "${lat[@]}" --models gptj llama3 --policies window h2o keyformer \
  --graphs --no-throughput --time-budget-s 110 --out "$out/latency" 2>&1 | grep -v '^\[transformers\]' | tee -a "$log"
rc "${PIPESTATUS[0]}"

step "the captured full baseline vs Keyformer, batch 1 at 4k: gptj llama3"
"$PY" -m experiments.gpu_studies.static_full "${static[@]}" --models gptj llama3 --policies keyformer --time-budget-s 90 \
  --out "$out/static" 2>&1 | grep -v '^\[transformers\]' | tee -a "$log"
rc "${PIPESTATUS[0]}"

step "long generation at a fixed KV memory budget, gptj"
"$PY" -m experiments.gpu_studies.gpu_long "${fixed[@]}" --model gptj --time-budget-s 120 --out "$out/fixed" 2>&1 \
  | grep -v '^\[transformers\]' | tee -a "$log"
rc "${PIPESTATUS[0]}"

cap=$(left); (( cap > 150 )) && cap=150
step "on-device tests: the policy contract on CUDA (capped at ${cap} s)"
if [[ $mode == dry ]]; then
  echo "dry run: the policy contract's on_device tests run on the GPU only" | tee "$out/tests_on_device.txt" | tee -a "$log"
elif (( cap < 20 )); then
  echo "skipped: ${cap} s left before the deadline" | tee "$out/tests_on_device.txt" | tee -a "$log"
else
  timeout "$cap" "$PY" -m pytest -p no:cacheprovider -m on_device tests/test_policy_contract.py -q -n 8 -rfE \
    2>&1 | tee "$out/tests_on_device.txt" | tail -3 | tee -a "$log"
  rc "${PIPESTATUS[0]}"
fi
step "done: $out (status $status)"
exit "$status"
