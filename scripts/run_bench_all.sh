#!/usr/bin/env bash
# Reproduce results/bench/: the CPU benchmark (default conf/bench/default.yaml) and the kvpress side-by-side.
# Extra arguments go to `keyformer-bench` (Hydra overrides). Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/bench
mkdir -p "$out/kvpress"
# The logs go to a temporary folder until the benchmark has read the tree's state: writing a tracked file of
# results/bench/ first would make bench.json's commit "-dirty" even on a clean checkout.
tmp="$(mktemp -d)"
{
  echo "started $(date -Is) on $(nproc) cores; git $(git rev-parse --short HEAD) ($(git status --porcelain | wc -l) changed files)"
  echo "uptime before: $(uptime)"
} > "$tmp/run_log.txt"
.venv/bin/keyformer-bench "$@" 2> >(grep -v '^USDT' >&2) | tee "$tmp/bench_stdout.txt"
echo "uptime after bench: $(uptime)" >> "$tmp/run_log.txt"
mv "$tmp/run_log.txt" "$tmp/bench_stdout.txt" "$out/" && rmdir "$tmp"
[ -x .venv-kvpress/bin/python ] || bash scripts/setup_kvpress_venv.sh
.venv/bin/python -m experiments.crosscheck_kvpress.kvpress_compare 2>&1 | grep -v -e '^USDT' -e 'Loading weights' | tee "$out/kvpress/stdout.txt"
echo "uptime after kvpress: $(uptime); finished $(date -Is)" >> "$out/run_log.txt"
cat "$out/run_log.txt"
