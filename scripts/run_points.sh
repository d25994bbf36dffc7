#!/usr/bin/env bash
# Round-robin runner for long CPU studies: WORKERS single-threaded copies of keyformer-queue (keyformer/lab/queue.py) (the scheduler)
# share the points of one or more queue files, STEP records a call (stop_after), always the unfinished point with
# the fewest finished rounds of STEP records first (ties in queue order), so every point holds about the same first
# records wherever the run stops
# (paired comparisons exist at any moment). Queue files run in order and are re-read at each pick. A failed
# point is skipped (its traceback in multirun/.locks_queue/failed_*); rerun the script to continue.
#   bash scripts/run_points.sh experiments/exp5_ablations/queues/exp5.txt experiments/exp8_powered/queues/exp8_authors.txt
# A queue line: `<output folder, relative to ROOT> <records> <run.py overrides...>`; `#` starts a comment.
# <records> is passed as n_samples=<records> (unless the line sets n_samples), so a finished point is complete.
# ROOT: where the folders go (default: this checkout). Run a frozen checkout's copy of this script (git
# worktree) when the code you work on keeps changing: a point's folder only resumes with the code that started
# it. The workers run in the script's own checkout, whatever the caller's folder (queue paths are resolved first).
# On 2 cores two 1-thread workers beat one 2-thread process and do not collapse when something else runs.
# Each worker compiles Keyformer's noise kernels (torch.compile, CPU) into its own inductor cache,
# $TORCHINDUCTOR_CACHE_DIR/worker_<w> (default /tmp/torchinductor_$USER/worker_<w>): workers compiling into
# one shared cache corrupted it ("invalid ELF header"), and a worker whose compiled kernel fails runs the
# noise eager, whose log can differ in the last bit (metrics.json's noise_kernel records it). Two copies
# of this script running at once need different TORCHINDUCTOR_CACHE_DIRs.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="$(cd "${ROOT:-$HERE}" && pwd)" || { echo "no such ROOT folder: ${ROOT:-}" >&2; exit 2; }
PY="${PY:-$HERE/.venv/bin/python}"
STEP="${STEP:-16}" WORKERS="${WORKERS:-2}"
export HF_HUB_OFFLINE=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$HERE/../shared/data}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
[ $# -ge 1 ] || { echo "usage: $0 QUEUE_FILE [QUEUE_FILE ...]" >&2; exit 2; }
QUEUES=()
for q in "$@"; do
  [ -f "$q" ] || { echo "no such queue file: $q" >&2; exit 2; }
  QUEUES+=("$(cd "$(dirname "$q")" && pwd)/$(basename "$q")")
done
# `python -m` imports from the current folder first: run from this checkout so its code runs, not the caller's
# (paths the caller may have given relative to its folder are made absolute first)
[ -d "$KEYFORMER_DATA_DIR" ] && KEYFORMER_DATA_DIR="$(cd "$KEYFORMER_DATA_DIR" && pwd)"
case "$PY" in /*) ;; */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
cd "$HERE"
set -- "${QUEUES[@]}"
"$PY" -m keyformer.lab.queue "$@" --root "$ROOT" --clear-locks --until 0 >/dev/null  # stale locks of a killed run
INDUCTOR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_${USER:-$(id -un)}}"
for w in $(seq 1 "$WORKERS"); do
  TORCHINDUCTOR_CACHE_DIR="$INDUCTOR/worker_$w" \
    "$PY" -m keyformer.lab.queue "$@" --root "$ROOT" --step "$STEP" --name "worker $w" &
  sleep 2
done
wait
echo "run_points: nothing left to run in $*" >&2
