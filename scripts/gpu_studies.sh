#!/usr/bin/env bash
# On a lent GPU machine (torch preinstalled, no network; packages as wheels, SmolLM2's GGUF and the data files
# staged by the caller, see experiments/gpu_studies.md): the studies too slow for 2 CPU cores, on CUDA in fp32.
#   bash scripts/gpu_studies.sh tests   # the device-aware tests on CUDA (tiny models), into $OUT/tests.txt
#   bash scripts/gpu_studies.sh run     # experiment 7 (all tasks) and experiment 8's authors' subset
# `run` starts 8 in-process queue runners (keyformer.lab.queue) that share the GPU; each works through
# a chain of queue files with that queue's batch size, takes no new point after BUDGET_S seconds and is
# killed at HARD_S (a point in flight keeps its finished records and resumes). Results: multirun/exp7_field/
# (the CPU queue folders) and multirun/exp8_authors_h200/, packed with the worker logs into $OUT/results.tgz
# every 15 s and at the end. Timings in these runs are contended (several workers per GPU): not benchmarks.
# First run (results/gpu_studies/): 8 workers, authors' beam at batch 16 (64 rows of 1920 tokens, a 44 GB
# process) filled the 140 GB and 5 points failed with CUDA OOM; since then each worker empties its CUDA cache
# after a point and beam runs at batch 8.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_out}" PY="${PY:-python3}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 KEYFORMER_DATA_DIR="${KEYFORMER_DATA_DIR:-$PWD/../shared/data}"

if [ "${1:-}" = tests ]; then
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
  } > "$OUT/env.txt" 2>&1
  KEYFORMER_TEST_DEVICE=cuda timeout "${TESTS_S:-150}" $PY -m pytest -m on_device -q -p no:cacheprovider \
    tests/test_policy_contract.py > "$OUT/tests.txt" 2>&1
  echo "tests exit $?" >> "$OUT/tests.txt"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 tests|run" >&2; exit 2; }
T0=$(date +%s)
UNTIL=$((T0 + ${BUDGET_S:-420})) HARD=$((T0 + ${HARD_S:-500}))
LOGS=multirun/gpu_logs Q=multirun/gpu_queues
mkdir -p "$LOGS" "$Q"
$PY -c 'from keyformer.run.loading import ensure_smollm2; print(ensure_smollm2())' > "$LOGS/convert.txt" 2>&1 \
  || { cp "$LOGS/convert.txt" "$OUT/"; exit 1; }
for t in cnndm needle leval_sqa multi_news; do cp "experiments/exp7_field/queues/exp7_$t.txt" "$Q/"; done
sed 's#multirun/exp8_authors/#multirun/exp8_authors_h200/#' experiments/exp8_powered/queues/exp8_authors.txt > "$Q/authors.txt"
grep -v 'generation=beam' "$Q/authors.txt" > "$Q/authors_greedy.txt"
grep -v 'generation=greedy' "$Q/authors.txt" > "$Q/authors_beam.txt"
declare -A BS=([exp7_cnndm]=50 [exp7_needle]=15 [exp7_leval_sqa]=32 [exp7_multi_news]=32 [authors_greedy]=32
               [authors_beam]=8)

chain() {  # chain NAME QUEUE...: each queue in turn, with its batch size, until UNTIL
  local name=$1 q; shift
  for q in "$@"; do
    [ "$(date +%s)" -lt "$UNTIL" ] || break
    timeout $((HARD - $(date +%s))) $PY -m keyformer.lab.queue "$Q/$q.txt" --until "$UNTIL" --name "$name" \
      --set device=cuda dtype=float32 "batch_size=${BS[$q]}" >> "$LOGS/$name.txt" 2>&1
  done
}
pack() { tar czf "$OUT/.results.tgz" multirun/exp7_field multirun/exp8_authors_h200 "$LOGS" multirun/.locks_queue \
           2>/dev/null; mv -f "$OUT/.results.tgz" "$OUT/results.tgz"; }

E7="exp7_cnndm exp7_multi_news exp7_leval_sqa exp7_needle"
chain w1 $E7 & chain w2 exp7_multi_news exp7_cnndm exp7_needle exp7_leval_sqa &
chain w3 exp7_needle exp7_leval_sqa exp7_cnndm exp7_multi_news & chain w4 exp7_leval_sqa exp7_multi_news $E7 &
chain w5 exp7_cnndm exp7_needle $E7 & chain w6 authors_greedy authors_beam $E7 &
chain w7 authors_beam authors_greedy $E7 & chain w8 authors_beam authors_greedy $E7 &
while [ -n "$(jobs -r)" ]; do sleep 15; pack; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader \
  >> "$LOGS/nvidia_smi.txt"; done
wait
pack
echo "gpu_studies run: $(( $(date +%s) - T0 )) s" | tee -a "$LOGS/summary.txt"
