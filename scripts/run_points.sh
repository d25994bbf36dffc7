#!/usr/bin/env bash
# Round-robin runner for long CPU studies: WORKERS single-threaded workers share the points of one or more
# queue files, STEP records at a time (stop_after), always the unfinished point with the fewest finished
# records first, so every point holds about the same first records wherever the run stops (paired
# comparisons exist at any moment). Queue files run in order: a worker takes a point of the second file
# only when every point of the first is finished or taken. Each call resumes its point's folder (a lock per
# point; a failed point is skipped and its log kept); rerun the script to continue.
#   bash scripts/run_points.sh experiments/queues/exp5.txt experiments/queues/exp8_authors.txt
# A queue line: `<output folder, relative to ROOT> <records> <run.py overrides...>`; `#` starts a comment.
# ROOT: where the folders go (default: this checkout). Run it from a frozen checkout (git worktree) when
# the code you work on keeps changing: a point's folder only resumes with the code that started it.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="${ROOT:-$HERE}"
PY="${PY:-$HERE/.venv/bin/python}"
STEP="${STEP:-16}" WORKERS="${WORKERS:-2}"
export HF_HUB_OFFLINE=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$HERE/../shared/data}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
[ $# -ge 1 ] || { echo "usage: $0 QUEUE_FILE [QUEUE_FILE ...]" >&2; exit 2; }
for q in "$@"; do [ -f "$q" ] || { echo "no such queue file: $q" >&2; exit 2; }; done
LOCKS="$ROOT/multirun/.locks"
mkdir -p "$LOCKS"
rm -rf "$LOCKS"/* 2>/dev/null
cd "$HERE"

done_n() { local f="$ROOT/$1/predictions.jsonl"; if [ -f "$f" ]; then grep -c '^{.*}$' "$f" || true; else echo 0; fi; }
key_of() { echo "${1//\//__}"; }

# the first queue's unfinished, unlocked, never-failed point with the fewest finished records; empty if none
pick() {
  local q line dir n rest best="" bestn k
  for q in "$@"; do
    bestn=999999999
    while read -r dir n rest; do
      [ -z "$dir" ] || [ "${dir:0:1}" = "#" ] && continue
      k=$(key_of "$dir"); local d; d=$(done_n "$dir")
      [ "$d" -ge "$n" ] || [ -e "$LOCKS/failed_$k" ] || [ -d "$LOCKS/$k" ] && continue
      [ "$d" -lt "$bestn" ] && { best="$dir $n $rest"; bestn=$d; }
    done < "$q"
    [ -n "$best" ] && { echo "$best"; return; }
  done
}

worker() {
  local w=$1; shift
  local p dir n rest k
  while :; do
    p=$(pick "$@"); [ -z "$p" ] && { sleep 5; p=$(pick "$@"); [ -z "$p" ] && break; }
    read -r dir n rest <<<"$p"; k=$(key_of "$dir")
    mkdir "$LOCKS/$k" 2>/dev/null || continue   # the other worker took it first
    mkdir -p "$(dirname "$ROOT/$dir")"
    echo "[worker $w $(date +%H:%M:%S)] $dir: $(done_n "$dir")/$n done" >&2
    # shellcheck disable=SC2086
    "$PY" run.py $rest stop_after="$STEP" output_dir="'$ROOT/$dir'" progress=false >> "$ROOT/$dir.log" 2>&1 \
      || { echo "failed: $dir (see $ROOT/$dir.log)" >&2; touch "$LOCKS/failed_$k"; }
    rmdir "$LOCKS/$k"
  done
}

for w in $(seq 1 "$WORKERS"); do worker "$w" "$@" & sleep 2; done
wait
echo "run_points: nothing left to run in $*" >&2
