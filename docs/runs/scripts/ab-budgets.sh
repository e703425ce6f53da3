#!/usr/bin/env bash
# A/B of two peak-memory builds (peak-memory-before.xz, peak-memory.xz) under budgets,
# alternating before/after in PAIRS pairs, every process with its own time limit: bf16 at
# PyTorch's bf16_compile_amb20 memory (2,259,928,576 B) and f32 at 1/4 of 8,096,366,596 B
# (ROWS, default "bf16 f32").
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory peak-memory-before
R=/tmp/abb; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
BF16="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728"
F32="--device frugal-cuda --fused-attention --warmup 6 --steps 20 --reference-peak 8096366596 --configs budget-1/4"
for i in $(seq ${PAIRS:-4}); do for b in peak-memory-before peak-memory; do
  [[ ${ROWS:-bf16 f32} == *bf16* ]] && one $b-bf16-$i 60 ./$b $BF16
  [[ ${ROWS:-bf16 f32} == *f32* ]] && one $b-f32-$i 90 ./$b $F32
done; done
tar czf $OUT/abb.tgz -C /tmp abb
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l)
    print(sys.argv[1], "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "segs", d.get("plan_segments"), "rounds", d.get("room_rounds"), d.get("budget_rounds"), "search ms", round((d.get("search_nanos") or 0)/1e6, 1), (d.get("losses") or [None])[-1:], d.get("error", ""))
' $(basename $f .out); done
cat $R/summary.txt
