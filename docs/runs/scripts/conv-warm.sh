#!/usr/bin/env bash
# The ResNet again with the kernels the cold processes compiled (no autotune cache): one kernel a
# conv pass, then Burn's autotune, each in its own process; outputs tarred into $OUT.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
R=/tmp/warm; mkdir -p $R
one resnet-one 90 ./burn-nn-models --model resnet --steps 14 --conv one-kernel
one resnet-autotune 200 ./burn-nn-models --model resnet --steps 14 --conv autotune
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
grep -ho "\"step_ms_median\": [0-9.]*" $R/torch_*.out
for f in $R/resnet*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first', d['first_step_ms'], 'compiled', d['first_step_compiled'], 'median', d['median_ms'], 'conv', d['conv_passes'], d['conv_fallbacks'], 'peak', d['peak_live'], 'reserved', d['allocator_peak_reserved'], 'losses', d['losses'][:3], d['losses'][-1])" $f; done
tar czf $OUT/warm.tgz -C /tmp warm
