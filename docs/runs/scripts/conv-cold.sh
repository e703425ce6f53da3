#!/usr/bin/env bash
# Cold ResNet first processes (one kernel a conv pass, then Burn's autotune), PyTorch beside,
# then the caches the two processes wrote gathered into $OUT/cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
bash cold-models.sh "resnet-one:150::--model resnet --steps 14 --conv one-kernel" \
  "resnet-autotune:200::--model resnet --steps 14 --conv autotune"
R=$OUT/anchors; mkdir -p $R
. ./lib.sh 2>/dev/null
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out
mkdir -p /tmp/cache/frugal-cuda-kernels /tmp/cache/autotune
for t in resnet-one resnet-autotune; do
  cp -rn /tmp/c-$t/kernels/. /tmp/cache/frugal-cuda-kernels/ 2>/dev/null
  cp -rn /tmp/c-$t/target/autotune/. /tmp/cache/autotune/ 2>/dev/null
done
(cd /tmp/cache && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels)
ls -la $OUT
