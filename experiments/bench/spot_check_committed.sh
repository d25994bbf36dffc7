set -e
cd /work/main
export KEYFORMER_DATA_DIR=/work/shared/data
P=".venv/bin/python -m keyformer.lab.spot_check"
$P --samples results/exp7_field/needle/samples.csv --point "budget=0.3,policy=keyformer" --out /work/runs/spot/exp7 -- +experiment=exp7_field +experiment/exp7_task=needle policy=keyformer budget=0.3 n_samples=10
$P --samples results/exp10_ruler/aware/samples.csv --point "task=niah_single_2,budget=0.5,policy=keyformer" --out /work/runs/spot/exp10k -- +experiment=exp10_ruler dataset.ruler_task=niah_single_2 generation.max_new_tokens=128 policy=keyformer budget=0.5 n_samples=5
$P --samples results/exp10_ruler/aware/samples.csv --point "task=niah_single_1,budget=0.5,policy=h2o" --out /work/runs/spot/exp10h -- +experiment=exp10_ruler dataset.ruler_task=niah_single_1 generation.max_new_tokens=128 policy=h2o budget=0.5 n_samples=5
