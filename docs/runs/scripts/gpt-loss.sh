#!/usr/bin/env bash
# gpt at the reference size with --loss fused (the default) and written-out, on burn-cuda and
# frugal-cuda, each in its own process, beside PyTorch's fp32_math.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -d ../target/frugal-cuda-kernels ] || tar xzf cubecl-cache.tgz -C ../target
gunzip -kf gpt.gz && chmod +x gpt
R=/tmp/gl; rm -rf $R; mkdir -p $R
one() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt; }
one torch_gpt 100 python3 torch_gpt.py --configs fp32_math
for dev in cuda frugal-cuda; do for loss in fused written-out; do
  one $dev-$loss 150 ./gpt --device $dev --model reference --steps 10 --loss $loss --out /tmp/g-$dev-$loss
done; done
tar czf $OUT/gl.tgz -C /tmp gl
for f in $R/*.out; do echo "== $f"; grep -E "^step 10/|^step 1/|Live tensor|^\{" $f | cut -c1-200; done
cat $R/summary.txt
