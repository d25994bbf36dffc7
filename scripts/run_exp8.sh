#!/usr/bin/env bash
# Experiment 8 as it ran (issue 11): the nine core points round-robin, 64 articles a step, then the extra arms at
# 0.3; the same folders as `python run.py -m +experiment=exp8_powered` (+ `_extras`). See scripts/run_points.sh.
#   KEYFORMER_DATA_DIR=../shared/data bash scripts/run_exp8.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEP="${STEP:-64}" exec bash "$HERE/scripts/run_points.sh" "$HERE/experiments/exp8_powered/queues/exp8_powered.txt" \
  "$HERE/experiments/exp8_powered/queues/exp8_extras.txt"
