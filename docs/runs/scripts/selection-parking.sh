#!/usr/bin/env bash
# Two builds side by side (OLD: burn-nn-models-old and gpt-old; NEW: burn-nn-models and gpt),
# each configuration its own process and limit, the builds alternating: burn-nn's
# TransformerEncoder plain and at FRACTIONS of its plain peak, and the gpt example at the
# reference size (fused attention, f32) plain and at the budgets of GPT_BUDGETS. The plan's
# debug log is on in budgeted runs. PyTorch's anchors first unless SKIP_TORCH. PARTS (default
# "encoder gpt") picks the models, so that one call carries only one model's two binaries.
# Staged in .gpu/: burn-nn-models{,-old}.xz and/or gpt{,-old}.xz, lib.sh, summary.py,
# torch_gpt.py, torch_best.py.
set -u
cd "$(dirname "$0")"
. ./lib.sh
for f in burn-nn-models burn-nn-models-old gpt gpt-old; do [ -f $f ] || [ ! -f $f.xz ] || unxz_bins $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -z "${SKIP_TORCH:-}" ] && anchors 90 120
if [[ " ${PARTS:-encoder gpt} " == *" encoder "* ]]; then
R=$OUT/models; mkdir -p $R
one encoder-plain 60 ./burn-nn-models --model encoder --steps ${STEPS:-20}
peak=$(python3 -c "import json; print(json.loads(open('$R/encoder-plain.out').readline())['peak_live'])")
for f in ${FRACTIONS-0.5 0.333}; do
  for b in old new; do
    bin=./burn-nn-models; [ $b = old ] && bin=./burn-nn-models-old
    RUST_LOG=info,frugal::engine=debug one encoder-$f-$b 60 $bin --model encoder \
      --steps ${STEPS:-20} --budget-of $peak --fraction $f
  done
done
python3 summary.py $R
cat $R/summary.txt
fi
[[ " ${PARTS:-encoder gpt} " == *" gpt "* ]] || exit 0
G=$OUT/gpt; mkdir -p $G
REF="--layers 12 --d-model 768 --heads 12 --seq 512 --batch 8 --steps ${GPT_STEPS:-16}"
R=$G one gpt-plain 90 ./gpt --device frugal-cuda $REF --out $G/gpt-plain
for budget in ${GPT_BUDGETS-2698788865 2024091649}; do
  for b in old new; do
    bin=./gpt; [ $b = old ] && bin=./gpt-old
    RUST_LOG=info,frugal::engine::plan=debug R=$G one gpt-$budget-$b 90 $bin --device frugal-cuda \
      $REF --budget $budget --out $G/gpt-$budget-$b
  done
done
for d in $G/gpt-*/; do
  python3 - $d/steps.json <<'PY'
import json, statistics, sys
try: l = json.load(open(sys.argv[1]))
except Exception: print(sys.argv[1], 'no steps.json'); sys.exit()
ms = [round(s['step_ms'], 1) for s in l]
print(sys.argv[1].split('/')[-2], 'median of steps 6- %.2f ms' % statistics.median(ms[6:]),
      'peak', max(s['peak_bytes'] for s in l), 'ms', ms)
PY
done
cat $G/summary.txt
# The memory snapshots are large; the step logs and the plan's log are what this measures.
find $G \( -name 'memory.json' -o -name 'memory_viz.pickle' -o -name '*.png' \) -delete
