#!/usr/bin/env bash
# Three peak-memory builds (peak-memory-a.xz, -b.xz, -c.xz) on the bf16 step at PyTorch's
# bf16_compile_amb20 memory (2,259,928,576 B), ROUNDS rounds, the order rotated each round so
# that no build always runs first; every process with its own time limit.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins peak-memory-a peak-memory-b peak-memory-c
R=/tmp/abc; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
A="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728"
for i in $(seq ${ROUNDS:-9}); do
  case $((i % 3)) in 0) order="a b c" ;; 1) order="b c a" ;; 2) order="c a b" ;; esac
  for x in $order; do one $x-$i 60 ./peak-memory-$x $A; done
done
tar czf $OUT/abc.tgz -C /tmp abc
python3 - <<'PY'
import json, glob, os, statistics
rows = {}
for f in sorted(glob.glob('/tmp/abc/*.out')):
    for l in open(f):
        if l.startswith('{'):
            d = json.loads(l); x = os.path.basename(f).split('-')[0]
            rows.setdefault(x, []).append(d['step_ms_median'])
for x, v in sorted(rows.items()):
    print(x, 'median of medians %.2f' % statistics.median(v), ' '.join('%.2f' % t for t in v))
PY
