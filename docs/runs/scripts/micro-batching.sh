#!/usr/bin/env bash
# burn-nn's model families under budgets, each budget twice: the plain loop (budget alone) and
# the loop built on GradientAccumulation that asks MicroBatching for its split
# (`--micro-batching`). The plain run without a budget first, its peak giving the budgets; each
# configuration its own process and limit; PyTorch's anchors first unless SKIP_TORCH.
# MODELS (default "encoder lstm"), FRACTIONS (default "0.5 0.333 0.25"), STEPS (default 20),
# LIMIT (seconds per budgeted process, default 120), ONLY_MB (skip the budget-alone runs).
# Staged in .gpu/: burn-nn-models.xz, lib.sh, summary.py, torch_gpt.py, torch_best.py, cubecl-cache.tgz
# if a call left one; the kernel and autotune caches are written back to $OUT/cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -z "${SKIP_TORCH:-}" ] && anchors 90 120
R=$OUT/models; mkdir -p $R
for m in ${MODELS:-encoder lstm}; do
  one $m-plain ${LIMIT:-120} ./burn-nn-models --model $m --steps ${STEPS:-20}
  peak=$(python3 -c "import json; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])" 2>/dev/null)
  [ -z "$peak" ] && continue
  for f in ${FRACTIONS-0.5 0.333 0.25}; do
    [ -z "${ONLY_MB:-}" ] && one $m-$f ${LIMIT:-120} ./burn-nn-models --model $m --steps ${STEPS:-20} \
      --budget-of $peak --fraction $f
    one $m-$f-mb ${LIMIT:-120} ./burn-nn-models --model $m --steps ${STEPS:-20} \
      --budget-of $peak --fraction $f --micro-batching
  done
done
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 summary.py $R
cat $R/summary.txt
