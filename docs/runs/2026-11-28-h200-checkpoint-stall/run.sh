#!/usr/bin/env bash
# Memory taken mid-run (--take-memory STEP:LEAVE) at the reference size, burn-cuda and
# frugal-cuda, timed checkpoints every few seconds; then the checkpoints' stall; PyTorch beside.
set -u
cd "$(dirname "$0")"
gunzip -kf gpt.gz && chmod +x gpt
export FRUGAL_CUDA_KERNEL_CACHE=$PWD/kcache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
one() { # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout $limit "$@" > $OUT/$name.txt 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s, $(wc -l < $OUT/$name.txt) lines" | tee -a $OUT/summary.txt
}
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
TAKE=${TAKE:-60:2GiB}
for dev in frugal-cuda cuda; do
  rm -rf /tmp/$dev
  limit=300; [ $dev = frugal-cuda ] && limit=150
  one take-$dev $limit ./gpt --device $dev --model reference --steps 90 --save-minutes 0.05 --take-memory $TAKE --out /tmp/$dev
  cp /tmp/$dev/steps.json $OUT/steps-take-$dev.json 2>/dev/null
  ls /tmp/$dev/checkpoints > $OUT/checkpoints-$dev.txt 2>&1
done
# The checkpoints' stall: the same run with saves every 10 s and with none.
for save in 0 0.1667; do
  rm -rf /tmp/s$save
  one stall-frugal-cuda-$save 200 ./gpt --device frugal-cuda --model reference --steps 500 --save-minutes $save --out /tmp/s$save
  cp /tmp/s$save/steps.json $OUT/steps-stall-$save.json 2>/dev/null
done
for f in $OUT/take-*.txt $OUT/stall-*.txt; do echo "== $f"; cut -c1-240 $f | tail -25; done
cat $OUT/summary.txt
