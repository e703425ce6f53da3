#!/usr/bin/env bash
# cb31275's opt-in raise: burn-nn's encoder plain, then at 1/3 of its plain peak with the
# default growth limit and with `--miss-time-share 0.05`, each its own process, with
# --profile-kernels; PyTorch's anchors first. Staged as for growth-limit-families.sh.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
anchors 90 120
R=$OUT/runs; mkdir -p $R
one encoder-plain 90 ./burn-nn-models --model encoder --steps 24 --profile-kernels
peak=$(python3 -c "import json; print(json.loads(open('$R/encoder-plain.out').readline())['peak_live'])")
one encoder-0.333-default 90 ./burn-nn-models --model encoder --steps 24 --budget-of $peak --fraction 0.333 --profile-kernels
one encoder-0.333-share 90 ./burn-nn-models --model encoder --steps 24 --budget-of $peak --fraction 0.333 --profile-kernels --miss-time-share 0.05
for f in $R/*.out; do python3 -c "
import json, sys
d = json.loads(open(sys.argv[1]).readline())
m = [s['misses'] for s in d['driver_per_step']]
print(sys.argv[1].split('/')[-1], 'median %.2f ms' % d['median_ms'], 'reserved', d['allocator_peak_reserved'], 'misses', m)
" $f; done
(cd $OUT && tar czf results.tgz anchors runs && rm -rf anchors runs)
