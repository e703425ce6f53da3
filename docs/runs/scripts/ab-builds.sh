#!/usr/bin/env bash
# A/B of two peak-memory builds (peak-memory-before.xz, peak-memory.xz) on the reference step:
# no budget (PAIRS alternating pairs of each configuration in CONFIGS, default bf16-lowout,
# device profile on) and bf16 under a budget of PyTorch's bf16_compile_amb20 peak (BPAIRS pairs,
# no profile), beside torch_gpt.py and torch_best.py in the same call. Every process has its own
# time limit.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory peak-memory-before
R=/tmp/lk; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
one torch_gpt 90 python3 torch_gpt.py --configs bf16_sdpa
one torch_best 200 python3 torch_best.py --configs bf16_sdpa_fusedadam,bf16_compile_amb20
COMMON="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4"
for c in ${CONFIGS:-bf16-lowout}; do for i in $(seq ${PAIRS:-3}); do for b in peak-memory-before peak-memory; do
  one $b-$c-$i 90 ./$b $COMMON --only $c --steps ${STEPS:-24} --profile-kernels
done; done; done
for i in $(seq ${BPAIRS:-2}); do for b in peak-memory-before peak-memory; do
  one $b-budget-$i 100 ./$b $COMMON --configs bf16-lowout-budget-1/3 --reference-peak 6779785728 --steps ${STEPS:-24}
done; done
tar czf $OUT/lk.tgz -C /tmp lk
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
for f in $R/*.out; do grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l); kp = d.get("kernel_profile")
    print(sys.argv[1], d.get("system"), d.get("config"), "peak", d.get("peak_allocated_bytes"), "res", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), "losses", (d.get("losses") or [None])[-1:], d.get("error", ""))
    if kp: print("    busy %.2f idle %.2f launches %d:" % (sum(c["ms"] for c in kp["classes"]), kp["idle_ms"], sum(c["launches"] for c in kp["classes"])), ", ".join("%s %.2f" % (c["name"], c["ms"]) for c in kp["classes"]))
' $(basename $f .out); done
cat $R/summary.txt
