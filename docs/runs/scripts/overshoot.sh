#!/usr/bin/env bash
# A/B of the plan's selection overshoot (FRUGAL_EXPERIMENT_OVERSHOOT, a build-time experiment):
# bf16 with low outputs under PyTorch's bf16_compile_amb20 memory, and the f32 budgets 1/3, 1/4.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -d ../target/frugal-cuda-kernels ] || tar xzf cubecl-cache.tgz -C ../target
gunzip -kf peak-memory.gz && chmod +x peak-memory
R=/tmp/ov; rm -rf $R; mkdir -p $R
one() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt; }
one torch_best 200 python3 torch_best.py --configs bf16_sdpa_fusedadam,bf16_compile_amb20
BF="--device frugal-cuda --configs bf16-lowout-budget-1/3 --reference-peak 6779785728 --steps 24 --warmup 4 --fused-attention --optimizer adamw-fused"
for i in 1 2; do for ov in 0.2 0.05; do
  FRUGAL_EXPERIMENT_OVERSHOOT=$ov one bf16-fused-$ov-$i 150 ./peak-memory $BF --loss fused
done; done
for ov in 0.2 0.05; do FRUGAL_EXPERIMENT_OVERSHOOT=$ov one bf16-written-$ov 150 ./peak-memory $BF --loss written-out; done
F32="--device frugal-cuda --configs plain,budget-1/3,budget-1/4 --reference-peak 7781793796 --steps 10 --warmup 4"
for ov in 0.2 0.05; do FRUGAL_EXPERIMENT_OVERSHOOT=$ov one f32-fused-$ov 240 ./peak-memory $F32 --loss fused; done
one f32-written-0.2 240 ./peak-memory $F32 --loss written-out
tar czf $OUT/ov.tgz -C /tmp ov
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l); n = max(1, len(d.get("losses") or [1]))
    print(sys.argv[1], d.get("config"), "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "sel", d.get("plan_selected_bytes"), "segs", d.get("plan_segments"), "recomp/step", (d.get("recomputed_bytes") or 0)//n, "offl/step", (d.get("offloaded_bytes") or 0)//n, d.get("error", ""))
' $(basename $f .out); done
cat $R/summary.txt
