#!/usr/bin/env bash
# 6eb1fa3: burn-nn's TransformerEncoder plain and at 1/2, 1/3 of its peak (ab-encoder.sh's
# encoder part), PyTorch beside.
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins burn-nn-models
R=/tmp/enc; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
one encoder-plain 120 ./burn-nn-models --model encoder --steps 16
peak=$(python3 -c "import json; print(json.loads(open('$R/encoder-plain.out').readline())['peak_live'])")
for f in 0.5 0.333; do
  RUST_LOG=frugal=debug one encoder-$f 120 ./burn-nn-models --model encoder --steps 16 --budget-of $peak --fraction $f
done
tar czf $OUT/enc.tgz -C /tmp enc
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob('/tmp/enc/encoder-*.out')):
    d = json.loads(open(f).readline())
    print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'], 'median %.2f, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
          'peak', d['peak_live'], 'budget', d['budget'], 'reserved', d['allocator_peak_reserved'], 'recomputed', d['recomputed_bytes'], 'later', d['later_compiled'])
PY
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out
cat $R/summary.txt
