#!/usr/bin/env bash
# Reproduce results/bench/: the CPU benchmark (default conf/bench.yaml) and the kvpress side-by-side.
# Extra arguments go to `keyformer-bench` (Hydra overrides). Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/bench
mkdir -p "$out/kvpress"
{
  echo "started $(date -Is) on $(nproc) cores; git $(git rev-parse --short HEAD)"
  echo "uptime before: $(uptime)"
} > "$out/run_log.txt"
.venv/bin/keyformer-bench "$@" 2> >(grep -v '^USDT' >&2) | tee "$out/bench_stdout.txt"
echo "uptime after bench: $(uptime)" >> "$out/run_log.txt"
[ -x .venv-kvpress/bin/python ] || bash scripts/setup_kvpress_venv.sh
.venv/bin/keyformer-bench-kvpress 2>&1 | grep -v -e '^USDT' -e 'Loading weights' | tee "$out/kvpress/stdout.txt"
echo "uptime after kvpress: $(uptime); finished $(date -Is)" >> "$out/run_log.txt"
cat "$out/run_log.txt"
