#!/usr/bin/env bash
# Alternating processes of PyTorch at its best and Frugal's bf16 step in one call: PAIRS rounds
# of torch_best.py bf16_sdpa_fusedadam, peak-memory bf16-lowout, torch_best.py
# bf16_compile_amb20, peak-memory bf16-lowout-budget-1/3 at amb20's memory (a budget of
# 2,259,928,576 B). Every process has its own time limit; STEPS steps, 4 of them warm-up.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory
R=/tmp/pairs; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
S=${STEPS:-44}
COMMON="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps $S"
for i in $(seq ${PAIRS:-4}); do
  one torch-eager-$i 90 python3 torch_best.py --configs bf16_sdpa_fusedadam --steps $S
  one frugal-plain-$i 60 ./peak-memory $COMMON --only bf16-lowout
  one torch-amb20-$i 120 python3 torch_best.py --configs bf16_compile_amb20 --steps $S
  one frugal-budget-$i 60 ./peak-memory $COMMON --configs bf16-lowout-budget-1/3 --reference-peak 6779785728
done
tar czf $OUT/pairs.tgz -C /tmp pairs
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l)
    print(sys.argv[1], d.get("config"), "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "segs", d.get("plan_segments", ""), (d.get("losses") or [None])[-1:], d.get("error", ""))
' $(basename $f .out); done
cat $R/summary.txt
