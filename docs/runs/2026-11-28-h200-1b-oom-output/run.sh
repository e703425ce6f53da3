#!/usr/bin/env bash
# The 1.2 B GPT with no memory flags on frugal-cuda, capped at an H100's 79 GiB: its whole
# output, counted. Fresh machine, no kernel cache.
set -u
cd "$(dirname "$0")"
gunzip -kf gpt.gz && chmod +x gpt
export FRUGAL_CUDA_KERNEL_CACHE=$PWD/kcache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
timeout ${LIMIT:-520} ./gpt --device frugal-cuda --model 1b --memory-cap 79GiB --steps ${STEPS:-3} --out /tmp/b > $OUT/gpt-1b.txt 2>&1
echo "exit $? in $(( $(date +%s) - t0 )) s" | tee -a $OUT/summary.txt
echo "lines $(wc -l < $OUT/gpt-1b.txt), bytes $(wc -c < $OUT/gpt-1b.txt)" | tee -a $OUT/summary.txt
cat $OUT/gpt-1b.txt | cut -c1-300 | tail -60
cp /tmp/b/steps.json $OUT/ 2>/dev/null
