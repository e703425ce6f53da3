#!/usr/bin/env bash
# The ResNet with one kernel a convolution pass, before and after strided data gradients went
# through a unit-stride pass on the spread gradient: first processes with empty caches, each in
# its own folder and home directory (BIN=burn-nn-models-before is the earlier build); CubeCL's
# autotune log of the new build's first step; PyTorch beside. Outputs in $OUT/spread-conv.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
BIN=burn-nn-models-before bash cold-models.sh "resnet-one-before:100::--model resnet --steps 14 --conv one-kernel"
bash cold-models.sh "resnet-one-after:100::--model resnet --steps 14 --conv one-kernel"
bash autotune-log.sh "resnet-one-after-log:90:--model resnet --steps 2 --conv one-kernel"
. ./lib.sh 2>/dev/null
anchors 60 90
grep -h "first step:" $OUT/cold/*.err
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'compiled', d['first_step_compiled'], 'threads %.1f s' % d['first_step_compile_s'], 'waited %.1f s' % d['first_step_wait_s'], 'later', d['later_compiled'], 'median %.2f' % d['median_ms'], 'losses', d['losses'])" $f; done
cd $OUT/autotune && grep "^Autotune\[" *.log | sed 's/.*name \([a-z_0-9]*\).*/\1/' | awk '/^matmul/{m++} /conv_transpose/{c++} /^fused/{f++} !/^matmul|conv_transpose|^fused/{r++} END{print "trials: matmul", m, "conv_transpose", c, "fused", f, "other", r}'
tar czf $FINAL/spread-conv.tgz -C /tmp o
