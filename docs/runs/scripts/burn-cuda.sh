#!/usr/bin/env bash
# gpt at the reference size on burn-cuda (Burn's CUDA backend with fusion, no kernel cache: its
# first process compiles) and on frugal-cuda, each in its own process with its own time limit,
# beside PyTorch's fp32_math and torch_best.py.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -d ../target/frugal-cuda-kernels ] || tar xzf cubecl-cache.tgz -C ../target
gunzip -kf gpt.gz && chmod +x gpt
R=/tmp/bc; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
one() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt; }
one torch_gpt 60 python3 torch_gpt.py --configs fp32_math
one torch_best 100 python3 torch_best.py --configs bf16_sdpa_fusedadam,bf16_compile_amb20
one cuda ${LIMIT:-360} ./gpt --device cuda --model reference --steps ${STEPS:-8} --out /tmp/g-cuda
one frugal-cuda 60 ./gpt --device frugal-cuda --model reference --steps ${STEPS:-8} --out /tmp/g-frugal-cuda
cp /tmp/g-cuda/steps.json $R/cuda-steps.json 2>/dev/null
cp /tmp/g-frugal-cuda/steps.json $R/frugal-cuda-steps.json 2>/dev/null
tar czf $OUT/bc.tgz -C /tmp bc
for f in $R/*.out; do echo "== $f"; grep -E "^step [0-9]+/|Live tensor|^\{|loss" $f | cut -c1-220 | tail -12; done
cat $R/summary.txt
