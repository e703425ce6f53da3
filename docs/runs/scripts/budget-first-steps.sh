#!/usr/bin/env bash
# The ResNet with one kernel a convolution pass under budgets of 1/2 and 1/3 of its plain peak
# (2,739,073,860 B live): first processes with empty caches, each in its own folder and home
# directory, with what every step compiled; PyTorch beside. Outputs in $OUT/budget-first.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
P=2739073860
bash cold-models.sh \
  "resnet-one-half:120::--model resnet --steps 12 --conv one-kernel --budget-of $P --fraction 0.5" \
  "resnet-one-third:120::--model resnet --steps 12 --conv one-kernel --budget-of $P --fraction 0.3333"
. ./lib.sh 2>/dev/null
anchors 60 90
grep -h "first step:" $OUT/cold/*.err
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'compiled', d['first_step_compiled'], 'waited %.1f s' % d['first_step_wait_s'], 'later', d['later_compiled'], 'steps', [round(x) for x in d['step_ms']], 'median %.2f' % d['median_ms'], 'peak live', d['peak_live'], 'budget', d['budget'])" $f; done
tar czf $FINAL/budget-first.tgz -C /tmp o
