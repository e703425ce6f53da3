#!/usr/bin/env bash
# The step plan's decisions, step by step, for burn-nn's models under budgets: the plain run
# first (its peak gives the budgets), then each fraction with the plan's debug log on
# (RUST_LOG=info,frugal::engine=debug), each configuration its own process and limit;
# PyTorch's anchors first unless SKIP_TORCH.
# MODELS (default "encoder"), FRACTIONS (default "0.5 0.333"), STEPS (default 20), LIMIT
# (seconds per process, default 120), FLAGS (added to every budgeted run).
# Staged in .gpu/: burn-nn-models.xz, lib.sh, torch_gpt.py, torch_best.py.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -z "${SKIP_TORCH:-}" ] && anchors 90 120
R=$OUT/models; mkdir -p $R
for m in ${MODELS:-encoder}; do
  one $m-plain ${LIMIT:-120} ./burn-nn-models --model $m --steps ${STEPS:-20}
  peak=$(python3 -c "import json; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])" 2>/dev/null)
  [ -z "$peak" ] && continue
  for f in ${FRACTIONS-0.5 0.333}; do
    RUST_LOG=info,frugal::engine=debug one $m-$f ${LIMIT:-120} ./burn-nn-models --model $m \
      --steps ${STEPS:-20} --budget-of $peak --fraction $f ${FLAGS:-}
  done
done
python3 summary.py $R
cat $R/summary.txt
