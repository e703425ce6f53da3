#!/usr/bin/env bash
# What micro-batches cost burn-nn's models (`burn-nn-models`), beside PyTorch's anchors: the
# encoder plain, as 2 micro-batches without a budget, and at half its peak under the budget
# alone, as 2 micro-batches and with MicroBatching choosing; the Lstm plain and at a quarter of
# its peak (below its largest op) with MicroBatching choosing. Each its own process and limit;
# the budgeted runs log the plan's and the split's choices (RUST_LOG=frugal=debug).
# Staged in .gpu/: burn-nn-models.xz, lib.sh, summary.py, torch_gpt.py, torch_best.py.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
anchors 90 120
R=$OUT/models; mkdir -p $R
peak() { python3 -c "import json; print(json.loads(open('$R/$1-plain.out').readline())['peak_live'])"; }
B="./burn-nn-models --steps ${STEPS:-20}"
one encoder-plain 60 $B --model encoder
one encoder-mb2 60 $B --model encoder --micro-batches 2
p=$(peak encoder)
export RUST_LOG=frugal=debug
one encoder-0.5 60 $B --model encoder --budget-of $p --fraction 0.5
one encoder-0.5-mb2 60 $B --model encoder --budget-of $p --fraction 0.5 --micro-batches 2
one encoder-0.5-mb 60 $B --model encoder --budget-of $p --fraction 0.5 --micro-batching
unset RUST_LOG
one lstm-plain 60 $B --model lstm
p=$(peak lstm)
RUST_LOG=frugal=debug one lstm-0.25-mb ${LSTM_LIMIT:-150} $B --model lstm --budget-of $p --fraction 0.25 --micro-batching
python3 summary.py $R
cat $R/summary.txt
