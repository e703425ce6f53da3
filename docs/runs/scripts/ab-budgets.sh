#!/usr/bin/env bash
# A/B of two peak-memory builds (peak-memory-before.xz, peak-memory.xz) under budgets,
# alternating before/after in PAIRS pairs, every process with its own time limit: bf16 at
# PyTorch's bf16_compile_amb20 memory (2,259,928,576 B) and f32 at 1/4 of 8,096,366,596 B
# (ROWS, default "bf16 f32"; `bf16p`, `f32p`: the same two without a budget); PyTorch beside
# unless SKIP_TORCH.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory peak-memory-before
R=/tmp/abb; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
  one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
BF16="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728"
F32="--device frugal-cuda --fused-attention --warmup 6 --steps 20 --reference-peak 8096366596 --configs budget-1/4"
BF16P="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24 --configs bf16-lowout"
F32P="--device frugal-cuda --fused-attention --warmup 6 --steps 20 --configs frugal"
for i in $(seq ${PAIRS:-4}); do for b in peak-memory-before peak-memory; do
  for row in ${ROWS:-bf16 f32}; do
    case $row in
      bf16) one $b-bf16-$i 60 ./$b $BF16 ;;
      f32) one $b-f32-$i 90 ./$b $F32 ;;
      bf16p) one $b-bf16p-$i 60 ./$b $BF16P ;;
      f32p) one $b-f32p-$i 90 ./$b $F32P ;;
    esac
  done
done; done
tar czf $OUT/abb.tgz -C /tmp abb
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l)
    print(sys.argv[1], "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "segs", d.get("plan_segments"), "rounds", d.get("room_rounds"), d.get("budget_rounds"), "search ms", round((d.get("search_nanos") or 0)/1e6, 1), (d.get("losses") or [None])[-1:], d.get("error", ""))
' $(basename $f .out); done
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out 2>/dev/null
cat $R/summary.txt
