#!/usr/bin/env bash
# The allocator's headroom over the budget on frugal-cuda: the reference step under budgets with
# the default growth limit (the budget plus frugal::memory::RESERVE_HEADROOM) and with tighter
# ones (--growth-limit), alternating in ROUNDS rounds, every process with its own time limit;
# PyTorch's bf16_compile_amb20 once in the same call. Rows: bf16 at amb20's memory
# (2,259,928,576 B = 1/3 of 6,779,785,728), f32 at 1/3 and 1/4 of 8,096,366,596 B. ROWS picks
# them (default "bf16 f32"); PLAIN=0 leaves out PyTorch and the runs without a budget.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory
R=/tmp/headroom; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
BF16="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24"
F32="--device frugal-cuda --fused-attention --warmup 6 --steps 20 --reference-peak 8096366596"
if [ "${PLAIN:-1}" = 1 ]; then
  one torch-amb20 120 python3 torch_best.py --configs bf16_compile_amb20 --steps 24
  one bf16-plain 60 ./peak-memory $BF16 --only bf16-lowout
  one f32-plain 90 ./peak-memory $F32 --only plain
fi
ROWS=${ROWS:-bf16 f32}
for i in $(seq ${ROUNDS:-3}); do
  [[ $ROWS == *bf16* ]] && {
  one bf16-amb20-default-$i 60 ./peak-memory $BF16 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728
  one bf16-amb20-1.10-$i 60 ./peak-memory $BF16 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728 --growth-limit 2485921433
  one bf16-amb20-2.36GB-$i 60 ./peak-memory $BF16 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728 --growth-limit 2360000000
  }
  [[ $ROWS == *f32* ]] && {
  one f32-quarter-default-$i 90 ./peak-memory $F32 --configs budget-1/4
  one f32-quarter-1.10-$i 90 ./peak-memory $F32 --configs budget-1/4 --growth-limit 2226500813
  one f32-third-default-$i 90 ./peak-memory $F32 --configs budget-1/3
  one f32-third-1.10-$i 90 ./peak-memory $F32 --configs budget-1/3 --growth-limit 2968667751
  }
done
tar czf $OUT/headroom.tgz -C /tmp headroom
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l); a = d.get("allocator") or {}
    print(sys.argv[1], d.get("config"), "budget", d.get("budget_bytes"), "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "segs", d.get("plan_segments", ""), "misses", a.get("misses"), (d.get("losses") or [None])[-1:], d.get("error", ""))
' $(basename $f .out); done
cat $R/summary.txt
