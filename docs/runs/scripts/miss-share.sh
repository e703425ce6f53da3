#!/usr/bin/env bash
# The growth limit raised where misses cost time (frugal-cuda's MISS_TIME_SHARE): burn-nn's
# encoder and Lstm plain and at 1/2 and 1/3 of their plain peaks (`growth-limit-families.sh`,
# the encoder also with `--growth-limit none`), then the gpt example at the reference size
# plain, at 1/3 and at 1/4 (as in `trial-split.sh`); PyTorch's anchors first. Each run its own
# process and limit. Staged in .gpu/: burn-nn-models.xz, gpt.xz, lib.sh,
# growth-limit-families.sh, torch_gpt.py, torch_best.py, cubecl-cache.tgz. Everything comes
# back as $OUT/results.tgz and $OUT/cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
MODEL=encoder LIMITS="default none" bash growth-limit-families.sh 2>&1 | tail -9
SKIP_TORCH=1 MODEL=lstm LIMITS="default" bash growth-limit-families.sh 2>&1 | tail -4
R=$OUT/gpt; mkdir -p $R
export RUST_LOG="error,gpt=info"
ref="--model reference --steps ${STEPS_REF:-24}"
for run in ref ref3 ref4; do
  case $run in
    ref) flags="$ref" ;;
    ref3) flags="$ref --budget 2698788865" ;;
    ref4) flags="$ref --budget 2024091649" ;;
  esac
  rm -rf /tmp/o-$run
  one $run 50 ./gpt --device frugal-cuda $flags --save-minutes 0 --out /tmp/o-$run
  cp /tmp/o-$run/steps.json $R/steps-$run.json 2>/dev/null
done
for f in $R/steps-*.json; do python3 -c "
import json, sys, statistics
s = json.load(open(sys.argv[1]))
print(sys.argv[1].split('/')[-1], 'median of steps 4 on %.2f ms' % statistics.median(x['step_ms'] for x in s[3:]),
      'peak', max(x['peak_bytes'] for x in s))
" $f; done
grep -h "peak reserved" $R/*.out
cat $R/summary.txt
(cd $OUT && tar czf results.tgz anchors runs gpt && rm -rf anchors runs gpt)
