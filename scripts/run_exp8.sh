#!/usr/bin/env bash
# Experiment 8 round-robin (issue 11): every point advances STEP articles per round (stop_after), so at any
# moment all arms hold the same first articles and the paired, pooled estimate is available whenever the
# study stops. Each call resumes its point's folder; rerun the script to continue. Same folders and configs
# as `python run.py -m +experiment=exp8_powered` (+ `_extras`).
#   KEYFORMER_DATA_DIR=../shared/data bash scripts/run_exp8.sh
# ROOT: where multirun/ is (default: this checkout). Run it from a frozen checkout (git worktree) when the
# code you run from keeps changing: a point's folder only resumes with the code that started it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="${ROOT:-$HERE}"
PY="${PY:-$HERE/.venv/bin/python}"
STEP="${STEP:-64}"
N="${N:-560}"
export HF_HUB_OFFLINE=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$HERE/../shared/data}"
cd "$HERE"
points=()
for b in 0.3 0.2 0.5; do for a in h2o keyformer_s0 keyformer_s1; do points+=("exp8_powered $b $a"); done; done
points+=("exp8_powered_extras 0.3 keyformer_ns4" "exp8_powered_extras 0.3 h2o_recent05")
done_n() { local f="$1/predictions.jsonl"; if [ -f "$f" ]; then grep -c '^{.*}$' "$f" || true; else echo 0; fi; }
declare -A failed=()
round=0
while :; do
  round=$((round + 1)); left=0; core_left=0
  for p in "${points[@]:0:9}"; do read -r exp b a <<<"$p"; [ "$(done_n "$ROOT/multirun/exp8_powered/budget=$b,$a")" -lt "$N" ] && core_left=1; done
  for p in "${points[@]}"; do
    read -r exp b a <<<"$p"
    dir="$ROOT/multirun/exp8_powered/budget=$b,$a"
    n=$(done_n "$dir")
    [ "$n" -ge "$N" ] && continue
    [ -n "${failed[$p]:-}" ] && continue  # a point that failed once is left for a human (see its log)
    # the core arms first: the extras start only when the nine core points are complete
    if [ "$exp" = exp8_powered_extras ] && [ "$core_left" = 1 ]; then continue; fi
    left=1
    echo "[round $round] $exp budget=$b $a: $n done" >&2
    "$PY" run.py +experiment="$exp" budget="$b" +experiment/exp8_arm="$a" stop_after="$STEP" \
      output_dir="'$dir'" progress=false >> "$ROOT/multirun/exp8_powered/log_${b}_${a}.txt" 2>&1 \
      || { echo "failed: $p (see its log)" >&2; failed[$p]=1; }
  done
  [ "$left" = 0 ] && break
done
echo "exp8: nothing left to run (${#failed[@]} failed points)" >&2
