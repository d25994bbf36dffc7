#!/usr/bin/env bash
# Reproduce results/bench/: the CPU benchmark (default conf/bench.yaml) and the kvpress side-by-side.
# Extra arguments go to `python -m keyformer.bench` (Hydra overrides). Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/bench
mkdir -p "$out/kvpress"
{
  echo "started $(date -Is) on $(nproc) cores; git $(git rev-parse --short HEAD)"
  echo "uptime before: $(uptime)"
} > "$out/run_log.txt"
.venv/bin/python -m keyformer.bench "$@" 2> >(grep -v '^USDT' >&2) | tee "$out/bench_stdout.txt"
echo "uptime after bench: $(uptime)" >> "$out/run_log.txt"
[ -x .venv-kvpress/bin/python ] || bash scripts/setup_kvpress_venv.sh
.venv/bin/python scripts/bench_kvpress.py 2>&1 | grep -v -e '^USDT' -e 'Loading weights' | tee "$out/kvpress/stdout.txt"
echo "uptime after kvpress: $(uptime); finished $(date -Is)" >> "$out/run_log.txt"
cat "$out/run_log.txt"
