#!/usr/bin/env bash
# How far over the budget a selection may be taken (the plan's SELECTION_OVERSHOOT), on
# burn-nn's models: a build of `burn-nn-models` that reads it from FRUGAL_SELECTION_OVERSHOOT
# (burn-nn-models-exp.xz), each value in OVERSHOOTS (default "0.05 0.10 0.15") at FRACTIONS
# (default "0.5 0.333") of each model's plain peak (PEAKS: model=bytes, measured by
# families.sh), every process with its own limit; results straight to $OUT/overshoot.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins burn-nn-models-exp
R=$OUT/overshoot; rm -rf $R; mkdir -p $R
for pair in ${PEAKS:-encoder=5447274628 resnet=2739073860}; do
  m=${pair%=*}; peak=${pair#*=}
  for f in ${FRACTIONS:-0.5 0.333}; do for o in ${OVERSHOOTS:-0.05 0.10 0.15}; do
    FRUGAL_SELECTION_OVERSHOOT=$o RUST_LOG=frugal=debug one $m-$f-o$o ${LIMIT:-90} \
      ./burn-nn-models-exp --model $m --steps ${STEPS:-16} --budget-of $peak --fraction $f
  done; done
done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/overshoot/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'second half %.2f ms' % d['late_median_ms'], 'peak', d['peak_live'],
              'steady', d.get('steady_peak_live'), 'budget', d['budget'], 'reserved', d['allocator_peak_reserved'],
              'recomputed', d['recomputed_bytes'], 'offloaded', d.get('offloaded_bytes'), 'later', d.get('later_compiled'))
PY
grep -h "estimated peak" $R/*.err | cut -c40-330 | sort | uniq -c | sort -rn | head -12
cat $R/summary.txt
