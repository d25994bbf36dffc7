#!/usr/bin/env bash
# Experiment 8 round-robin (issue 11): points advance STEP articles at a time (stop_after), always the point
# with the fewest finished articles first, so all arms hold about the same first articles and the paired,
# pooled estimate exists wherever the study stops. WORKERS single-threaded workers share the points (a lock
# per point); on 2 cores two 1-thread processes beat one 2-thread process and do not collapse when something
# else runs. Each call resumes its point's folder; rerun the script to continue. Same folders and configs as
# `python run.py -m +experiment=exp8_powered` (+ `_extras`); the extras start when the nine core points are done.
#   KEYFORMER_DATA_DIR=../shared/data bash scripts/run_exp8.sh
# ROOT: where multirun/ is (default: this checkout). Run it from a frozen checkout (git worktree) when the
# code you run from keeps changing: a point's folder only resumes with the code that started it.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="${ROOT:-$HERE}"
PY="${PY:-$HERE/.venv/bin/python}"
STEP="${STEP:-64}" N="${N:-560}" WORKERS="${WORKERS:-2}"
export HF_HUB_OFFLINE=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$HERE/../shared/data}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
OUT="$ROOT/multirun/exp8_powered"
LOCKS="$OUT/.locks"
mkdir -p "$LOCKS"
rm -rf "$LOCKS"/* "$OUT"/.failed_* 2>/dev/null
cd "$HERE"
CORE=() EXTRA=()
for b in 0.3 0.2 0.5; do for a in h2o keyformer_s0 keyformer_s1; do CORE+=("exp8_powered $b $a"); done; done
EXTRA=("exp8_powered_extras 0.3 keyformer_ns4" "exp8_powered_extras 0.3 h2o_recent05")
done_n() { local f="$OUT/budget=$1,$2/predictions.jsonl"; if [ -f "$f" ]; then grep -c '^{.*}$' "$f" || true; else echo 0; fi; }

# the unfinished, unlocked, never-failed point with the fewest finished articles (core first); empty if none
pick() {
  local best="" bestn=999999 p exp b a n key
  local pool=("${CORE[@]}")
  for p in "${CORE[@]}"; do read -r exp b a <<<"$p"; [ "$(done_n "$b" "$a")" -lt "$N" ] && { pool=("${CORE[@]}"); break; }; pool=("${EXTRA[@]}"); done
  for p in "${pool[@]}"; do
    read -r exp b a <<<"$p"; key="${b}_$a"
    n=$(done_n "$b" "$a")
    [ "$n" -ge "$N" ] || [ -e "$OUT/.failed_$key" ] || [ -d "$LOCKS/$key" ] && continue
    [ "$n" -lt "$bestn" ] && { best="$p"; bestn=$n; }
  done
  echo "$best"
}

worker() {
  local w=$1 p exp b a key
  while :; do
    p=$(pick); [ -z "$p" ] && { sleep 5; p=$(pick); [ -z "$p" ] && break; }
    read -r exp b a <<<"$p"; key="${b}_$a"
    mkdir "$LOCKS/$key" 2>/dev/null || continue   # the other worker took it first
    echo "[worker $w $(date +%H:%M:%S)] $exp budget=$b $a: $(done_n "$b" "$a") done" >&2
    "$PY" run.py +experiment="$exp" budget="$b" +experiment/exp8_arm="$a" stop_after="$STEP" \
      output_dir="'$OUT/budget=$b,$a'" progress=false >> "$OUT/log_${b}_${a}.txt" 2>&1 \
      || { echo "failed: $p (see $OUT/log_${b}_${a}.txt)" >&2; touch "$OUT/.failed_$key"; }
    rmdir "$LOCKS/$key"
  done
}

for w in $(seq 1 "$WORKERS"); do worker "$w" & sleep 2; done
wait
echo "exp8: nothing left to run" >&2
