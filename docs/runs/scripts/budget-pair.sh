#!/usr/bin/env bash
# The bf16 step with low outputs under a budget of PyTorch's bf16_compile_amb20 peak (a third of
# --reference-peak), fused loss against written out, beside torch_best.py in the same call.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -d ../target/frugal-cuda-kernels ] || tar xzf cubecl-cache.tgz -C ../target
gunzip -kf peak-memory.gz && chmod +x peak-memory
R=/tmp/bp; rm -rf $R; mkdir -p $R
one() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt; }
[ -z "${SKIP_TORCH:-}" ] && one torch_best 200 python3 torch_best.py --configs bf16_sdpa_fusedadam,bf16_compile_amb20
for loss in ${LOSSES:-fused written-out fused written-out}; do
  n=1; while [ -e $R/pm-$loss-$n.out ]; do n=$((n+1)); done
  one pm-$loss-$n ${LIMIT:-150} ./peak-memory --device frugal-cuda --configs bf16-lowout-budget-1/3 --reference-peak ${REF:-6779785728} --steps ${STEPS:-24} --warmup 4 ${PROFILE---profile-kernels} --fused-attention --optimizer adamw-fused --loss $loss ${EXTRA:-}
done
tar czf $OUT/bp-${TAG:-a}.tgz -C /tmp bp
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
for f in $R/*.out; do echo "== $f"; grep '^{' $f | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l); kp = d.get("kernel_profile")
    print(d.get("system"), d.get("config"), "peak", d.get("peak_allocated_bytes"), "reserved", d.get("peak_reserved_bytes"), "ms", round(d.get("step_ms_median") or 0, 2), d.get("budget_bytes", ""), d.get("error", ""))
    if kp: print("    busy %.2f idle %.2f launches %d:" % (sum(c["ms"] for c in kp["classes"]), kp["idle_ms"], sum(c["launches"] for c in kp["classes"])), ", ".join("%s %.2f" % (c["name"], c["ms"]) for c in kp["classes"]))
'; done
cat $R/summary.txt
