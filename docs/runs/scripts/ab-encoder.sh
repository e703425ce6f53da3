#!/usr/bin/env bash
# The capped 1.2 B split with two builds in one call (`gpt-a`, `gpt-b`: e.g. before and after a
# change to the step plan), then burn-nn's TransformerEncoder (`burn-nn-models`, the build of
# `gpt-b`) plain and at FRACTIONS of its peak, each in its own process with its own limit, the
# kernel cache carried (lib.sh); PyTorch beside unless SKIP_TORCH. RUST_LOG for the budgeted
# encoder runs: frugal=debug (the step plan's choices). Staged in .gpu/: gpt-a.xz, gpt-b.xz,
# burn-nn-models.xz. Everything lands in $OUT/ab-encoder-$TAG.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt-a gpt-b burn-nn-models
R=/tmp/ab-encoder; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
  one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
for build in ${BUILDS:-a b}; do
  rm -rf /tmp/o-$build
  one split-$build ${LIMIT:-200} ./gpt-$build --device frugal-cuda --model 1b \
    --memory-cap ${CAP:-79GiB} --budget auto --steps ${STEPS:-8} --save-minutes 0 --out /tmp/o-$build
  cp /tmp/o-$build/steps.json $R/steps-split-$build.json 2>/dev/null
done
one encoder-plain 120 ./burn-nn-models --model encoder --steps ${ENCODER_STEPS:-16}
peak=$(python3 -c "import json; print(json.loads(open('$R/encoder-plain.out').readline())['peak_live'])")
for f in ${FRACTIONS-0.5 0.333}; do
  RUST_LOG=${ENCODER_LOG:-frugal=debug} one encoder-$f 120 ./burn-nn-models --model encoder \
    --steps ${ENCODER_STEPS:-16} --budget-of $peak --fraction $f
done
tar czf $OUT/ab-encoder-${TAG:-a}.tgz -C /tmp ab-encoder
for f in $R/split-*.out; do echo "== $f"; grep -v "^|" $f | cut -c1-220 | tail -12; done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob('/tmp/ab-encoder/encoder-*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'],
              'median %.2f ms, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
              'peak', d['peak_live'], 'steady', d['steady_peak_live'], 'budget', d['budget'],
              'reserved', d['allocator_peak_reserved'], 'recomputed', d['recomputed_bytes'],
              'later compiled', d['later_compiled'])
PY
grep -h "selection\|segments of about\|recomputed (" $R/encoder-0*.err 2>/dev/null | cut -c1-300 | sort | uniq -c | head -12
tail -3 $R/torch_*.out 2>/dev/null
cat $R/summary.txt
