#!/usr/bin/env bash
# The CPU long-generation table (issue 23; docs/performance.md): keyformer-bench --long, one setting after the
# other at the same KV memory budget (full's cache at batch 4 for 512+4096), into results/bench/long/<setting>/.
# Resumable: rerun the same script and each setting continues from its journal.jsonl (finished measurements are
# skipped). Run it on a quiet machine from a clean checkout (a git worktree: the journal refuses other code, while
# commits that change only results or docs resume it), with its own python:
#   git worktree add ../wt_long HEAD && cd ../wt_long && PY=/path/to/.venv/bin/python bash scripts/run_bench_long.sh
# Extra arguments go to every keyformer-bench --long call (e.g. --rounds 3). OUT_ROOT moves the outputs.
# Budgets 256, 512 and 1024 tokens: the bench's default 0.5 is 256 tokens of a 512-token prompt and 1024 of a
# 2048-token one, the same budget in tokens as an absolute one in every setting here (it would time them twice).
# Memory guard (keyformer/lab/rss_guard.py): each setting's process tree is stopped past MAX_RSS_GIB of RSS
# (default: half of the physical memory; one run once reached 23 GiB on a 24 GB host), the script then stops
# (finished measurements stay journaled: rerun to resume); every RSS sample goes to <setting>.rss.tsv and the peak
# to run_log.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
export HF_HUB_OFFLINE=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$(pwd)/../shared/data}"
root="${OUT_ROOT:-results/bench/long}"
log="$root/run_log.txt"
mkdir -p "$root"
echo "started $(date -Is) on $(nproc) cores; git $(git rev-parse --short HEAD); uptime: $(uptime)" >> "$log"
for s in 512+2048 512+4096 2048+2048; do
  beams=0; [ "$s" = 512+2048 ] && beams=4
  out="$root/${s/+/_}"
  "$PY" -m keyformer.lab.rss_guard ${MAX_RSS_GIB:+--max-gib "$MAX_RSS_GIB"} --every 10 --log "$log" \
    --trace "$out.rss.tsv" -- "$PY" -m keyformer.lab.bench.long --settings "$s" --memory-ref 512+4096 --rounds 2 --beams "$beams" \
    --budgets 256,512,1024 \
    --out "$out" "$@" 2> >(grep -v -e '^USDT' -e 'Loading weights' >&2) | tee -a "$out.stdout.txt"
  rc=${PIPESTATUS[0]}
  echo "$s finished rc $rc $(date -Is); uptime: $(uptime)" >> "$log"
  [ "$rc" = 3 ] && { echo "stopped by the memory guard (run_log.txt): rerun to resume" >&2; exit 3; }
done
