#!/usr/bin/env bash
# The micro-batch split under --budget auto at 1.2 B parameters (issue 53, goal 1): gpt with
# the split chosen from the budget's costs (RUNS has `split`), the same with
# --keep-micro-batch (`keep`), and --fit's probes (`fit`); each in its own process with its
# own limit (`acc2`, `acc4`: --accumulate 2 or 4 under the budget, kept); PyTorch beside
# unless SKIP_TORCH. CAP (default 79GiB) caps frugal-cuda's pool
# as an 80 GB GPU would (CAP=none: the whole GPU). BIN names the staged binary (default gpt:
# gpt.xz). Everything lands in $OUT/split-$TAG.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
BIN=${BIN:-gpt}
unxz_bins $BIN
R=/tmp/split; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
  one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
# The reference model in f32 at 1/4 of its peak (8,096,366,596 B, `peak-memory`): `ref`,
# `ref-keep`.
for run in ${RUNS:-split}; do
  model="--model 1b"; cap="--memory-cap ${CAP:-79GiB}"
  [ "${CAP:-}" = none ] && cap=""
  case $run in
    split) flags="--budget auto" ;;
    keep) flags="--budget auto --keep-micro-batch" ;;
    fit) flags="--budget auto --fit" ;;
    acc2) flags="--budget auto --accumulate 2 --keep-micro-batch" ;;
    acc4) flags="--budget auto --accumulate 4 --keep-micro-batch" ;;
    ref) model="--model reference"; cap=""; flags="--budget 2024091649" ;;
    ref-keep) model="--model reference"; cap=""; flags="--budget 2024091649 --keep-micro-batch" ;;
  esac
  rm -rf /tmp/o-$run
  one $run ${LIMIT:-420} ./$BIN --device frugal-cuda $model $cap $flags \
    --steps ${STEPS:-10} --save-minutes 0 --out /tmp/o-$run
  cp /tmp/o-$run/steps.json $R/steps-$run.json 2>/dev/null
done
tar czf $OUT/split-${TAG:-a}.tgz -C /tmp split
for f in $R/*.out; do echo "== $f"; grep -v "^|" $f | cut -c1-220 | head -40; done
tail -3 $R/torch_*.out 2>/dev/null
cat $R/summary.txt
