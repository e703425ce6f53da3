#!/usr/bin/env bash
# Where a first ResNet process's compilation time goes: `burn-nn-models --model resnet` from
# empty caches for LOG_LIMIT seconds (default 60) with CubeCL's compilation log on, then
# nvrtc-bench.py compiles the logged sources again with NVRTC option variants. Staged in
# .gpu/: burn-nn-models.xz, nvrtc-bench.py.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins burn-nn-models
R=$OUT/nvrtc; rm -rf $R; mkdir -p $R /tmp/nv/home
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
B=$(pwd)/burn-nn-models
(cd /tmp/nv && HOME=/tmp/nv/home FRUGAL_CUDA_KERNEL_CACHE=/tmp/nv/kernels CUBECL_DEBUG_LOG=/tmp/nv/cubecl.log \
  one resnet-log ${LOG_LIMIT:-60} $B --model resnet --steps 2)
grep -c START_KERNEL_COMPILATION /tmp/nv/cubecl.log | sed 's/^/kernels logged: /' | tee -a $R/summary.txt
ls /tmp/nv/kernels | wc -l | sed 's/^/kernel cache entries: /' | tee -a $R/summary.txt
one bench ${BENCH_LIMIT:-400} python3 nvrtc-bench.py /tmp/nv/cubecl.log --limit ${KERNELS:-40}
grep -o '\[Compiling kernel\][^"]*\|name: .*' /tmp/nv/cubecl.log | sort | uniq -c | sort -rn | head -30 > $R/names.txt
xz -T4 -c /tmp/nv/cubecl.log > $R/cubecl.log.xz
cat $R/bench.out $R/summary.txt
