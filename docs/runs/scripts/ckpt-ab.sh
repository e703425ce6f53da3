#!/usr/bin/env bash
# A timed checkpoint's read of the training state into host memory, two gpt builds (BINS,
# default "gpt-before gpt"), each configuration its own process; PyTorch beside. DEVICE
# (default frugal-cuda) picks the runtime, MODELS (default "ref 1b") the models.
# Everything lands in $OUT/ckpt-ab.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
BINS=${BINS:-gpt-before gpt}
unxz_bins $BINS
R=/tmp/ckpt-ab; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
DEVICE=${DEVICE:-frugal-cuda}
for model in ${MODELS:-ref 1b}; do
  for bin in $BINS; do
    rm -rf /tmp/o
    case $model in
      ref) one ref-$bin ${LIMIT:-120} ./$bin --device $DEVICE --model reference --steps 300 \
        --save-minutes ${SAVE_MINUTES:-0.1} --out /tmp/o ;;
      1b) one 1b-$bin ${LIMIT:-150} ./$bin --device $DEVICE --model 1b --accumulate 4 --steps 5 \
        --save-minutes 0.25 --out /tmp/o ;;
    esac
  done
done
tar czf $OUT/ckpt-ab.tgz -C /tmp ckpt-ab
grep -H "checkpoints during\|first step" $R/*.out | cut -c1-220
tail -qn1 $R/torch_*.out | cut -c1-200; cat $R/summary.txt
