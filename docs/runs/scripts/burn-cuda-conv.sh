#!/usr/bin/env bash
# The ResNet with one kernel a convolution pass on burn-cuda (Burn's CUDA runtime, fused), a
# first process with empty caches, beside the same on frugal-cuda; PyTorch beside. Outputs in
# $OUT/burn-cuda-conv.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
bash cold-models.sh \
  "resnet-one-burn-cuda:150::--model resnet --steps 10 --conv one-kernel --device cuda" \
  "resnet-one-frugal-cuda:100::--model resnet --steps 10 --conv one-kernel"
. ./lib.sh 2>/dev/null
anchors 60 90
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'steps', [round(x) for x in d['step_ms']], 'median %.2f' % d['median_ms'], 'losses', d['losses'][-2:], 'passes', d['conv_passes'], 'fallbacks', d['conv_fallbacks'])" $f; done
tar czf $FINAL/burn-cuda-conv.tgz -C /tmp o
