#!/usr/bin/env bash
# What micro-batches cost burn-nn's models (`burn-nn-models`), beside PyTorch's anchors: the
# encoder plain, as 2 micro-batches without a budget, and at half its peak under the budget
# alone, as 2 micro-batches and with MicroBatching choosing; the Lstm plain and at a quarter of
# its peak (below its largest op) with MicroBatching choosing. Each its own process and limit;
# the budgeted runs log the plan's and the split's choices (RUST_LOG=frugal=debug).
# Staged in .gpu/: burn-nn-models.xz, lib.sh, torch_gpt.py, torch_best.py.
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
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/models/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'],
              'median %.2f, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
              'peak', d['peak_live'], 'steady', d['steady_peak_live'], 'budget', d['budget'],
              'reserved', d['allocator_peak_reserved'], 'recomputed', d['recomputed_bytes'],
              'op floor', d['plan_op_floor'], 'split', d['micro_batches'])
        print('    steps', [round(x) for x in d['step_ms']])
        for c in d['split_changes']: print('   ', c)
PY
cat $R/summary.txt
