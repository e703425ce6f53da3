#!/usr/bin/env bash
# First processes with empty caches, each in its own folder and home directory, under NVRTC's
# default options (-lineinfo) and its fast-compile levels (FRUGAL_CUDA_NVRTC_OPTIONS): the
# ResNet with one kernel a convolution pass, and the GPT (also without -lineinfo); CubeCL's
# autotune log for one ResNet first step; PyTorch beside. Outputs in $OUT/nvrtc-options.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
bash autotune-log.sh "resnet-one-log:90:--model resnet --steps 2 --conv one-kernel"
O=FRUGAL_CUDA_NVRTC_OPTIONS
bash cold-models.sh \
  "resnet-one:100::--model resnet --steps 12 --conv one-kernel" \
  "resnet-one-ofc-mid:100:$O=--Ofast-compile=mid:--model resnet --steps 12 --conv one-kernel" \
  "resnet-one-ofc-max:100:$O=--Ofast-compile=max:--model resnet --steps 12 --conv one-kernel"
bash cold.sh "gpt:60::" "gpt-noline:60:$O=:" "gpt-ofc-mid:60:$O=--Ofast-compile=mid:" \
  "gpt-ofc-max:60:$O=--Ofast-compile=max:"
. ./lib.sh 2>/dev/null
anchors 60 90
grep -h "first step:" $OUT/cold/*.err
for f in $OUT/cold-gpt*-steps.json; do python3 -c "
import json,sys,statistics; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'first %.0f ms' % d[0]['step_ms'], 'median of steps 6+ %.2f ms' % statistics.median(x['step_ms'] for x in d[6:]), 'loss', d[-1]['loss'])" $f; done
grep -h "^kernels:" $OUT/cold-gpt*.out
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'compiled', d['first_step_compiled'], 'threads %.1f s' % d['first_step_compile_s'], 'waited %.1f s' % d['first_step_wait_s'], 'median %.2f' % d['median_ms'], 'losses', d['losses'][:2])" $f; done
cd $OUT/autotune && for f in *.log; do echo "== $f $(wc -l < $f) lines"; grep -o "Tuning [A-Za-z_]*\|key=[A-Za-z]*" $f | sort | uniq -c | sort -rn | head; done
tar czf $FINAL/nvrtc-options.tgz -C /tmp o
