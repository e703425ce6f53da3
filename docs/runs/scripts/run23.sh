#!/usr/bin/env bash
# The check of issue 23 (2026-11-25), item 2 (frugal-cuda's compiled kernels on disk): the gpt
# example at the reference size on frugal-cuda, one process after another on one machine:
# "first" with an empty kernel cache, "second" with what the first stored, "second-nojit" the
# same with the driver's own PTX JIT cache off, "off" with our cache off. CubeCL's autotune
# cache from earlier calls is in place for all of them. The first step's time of each.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
gunzip -kf gpt.gz && chmod +x gpt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
REF="--layers 12 --d-model 768 --heads 12 --seq 512 --batch 8 --no-recover --steps 3"
rm -rf /tmp/kernels
run() {
  name=$1; shift
  t0=$(date +%s.%N)
  env "$@" timeout 200 ./gpt --device frugal-cuda --out /tmp/$name $REF > /tmp/$name.txt 2>&1
  code=$?
  t1=$(date +%s.%N)
  python3 - /tmp/$name "$name" "$code" "$t0" "$t1" <<'PY'
import json, sys
d, name, code, t0, t1 = sys.argv[1:]
wall = float(t1) - float(t0)
try:
    steps = json.load(open(d + "/steps.json"))
    print("%-12s exit %s, process %.1f s, step ms: %s, loss %s" % (name, code, wall, [round(s["step_ms"], 1) for s in steps], [round(s["loss"], 4) for s in steps]))
except Exception as e:
    print(name, "exit", code, "failed:", repr(e))
PY
  cat /tmp/$name.txt >> $OUT/runs.txt
}
run first FRUGAL_CUDA_KERNEL_CACHE=/tmp/kernels
echo "kernel cache: $(ls /tmp/kernels | wc -l) files, $(du -sh /tmp/kernels | cut -f1)"
run second FRUGAL_CUDA_KERNEL_CACHE=/tmp/kernels
run second-nojit FRUGAL_CUDA_KERNEL_CACHE=/tmp/kernels CUDA_CACHE_DISABLE=1
run off FRUGAL_CUDA_KERNEL_CACHE=off
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
