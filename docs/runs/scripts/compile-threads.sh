#!/usr/bin/env bash
# First processes with kernels compiled on one thread (FRUGAL_CUDA_COMPILE_THREADS=1, as before)
# and on the pool (the default), each configuration in its own folder and home directory with
# empty caches; then PyTorch; every output tarred into $OUT/cold-threads.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
bash cold.sh "gpt-seq:90:FRUGAL_CUDA_COMPILE_THREADS=1:" "gpt-par:90::" \
  "gpt-bf16-seq:90:FRUGAL_CUDA_COMPILE_THREADS=1:--precision bf16 --low-outputs" \
  "gpt-bf16-par:90::--precision bf16 --low-outputs"
bash cold-models.sh \
  "resnet-one-seq:120:FRUGAL_CUDA_COMPILE_THREADS=1:--model resnet --steps 14 --conv one-kernel" \
  "resnet-one-par:120::--model resnet --steps 14 --conv one-kernel" \
  "encoder-seq:60:FRUGAL_CUDA_COMPILE_THREADS=1:--model encoder --steps 8" \
  "encoder-par:60::--model encoder --steps 8" \
  "resnet-auto-par:170::--model resnet --steps 14"
R=$OUT/anchors; mkdir -p $R
. ./lib.sh 2>/dev/null
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out
for t in gpt-seq gpt-par gpt-bf16-seq gpt-bf16-par; do
  python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
s=d if isinstance(d,list) else d.get('steps',d)
print(sys.argv[2], [round(x.get('step_ms',0)) for x in s][:4], 'losses', [x.get('loss') for x in s][:3], s[-1].get('loss'))" $OUT/cold-$t-steps.json $t 2>&1 | tail -1
  grep -h "first step\|kernels" $OUT/cold-$t.out | tail -2
done
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'compiled', d['first_step_compiled'], 'in %.1f' % d['first_step_compile_s'], 'later', d['later_compiled'], 'median %.2f' % d['median_ms'], 'losses', d['losses'][:2], d['losses'][-1])" $f; done
tar czf $FINAL/cold-threads.tgz -C /tmp o
