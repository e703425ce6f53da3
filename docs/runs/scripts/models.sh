#!/usr/bin/env bash
# burn-nn models (`burn-nn-models`) on frugal-cuda: for each model a plain run, then the
# budgets FRACTIONS of its peak, each in its own process with its own time limit. Each model
# starts from empty caches of its own (kernel cache, CubeCL's autotune cache, home directory),
# so its plain run is a first process on a fresh machine; its budget runs reuse them.
# MODELS (default "encoder resnet lstm"), FRACTIONS (default "0.5 0.333"; empty: plain only),
# STEPS (default 12), LIMIT (seconds per process, default 240). Staged in .gpu/:
# burn-nn-models.gz.
set -u
cd "$(dirname "$0")"
gunzip -kf burn-nn-models.gz && chmod +x burn-nn-models
B=$(pwd)/burn-nn-models
R=/tmp/models; rm -rf $R /tmp/m-*; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
one() { # model tag args...
  local dir=/tmp/m-$1 tag=$2; shift 2
  mkdir -p $dir/home && local t0=$(date +%s)
  (cd $dir && env HOME=$dir/home FRUGAL_CUDA_KERNEL_CACHE=$dir/kernels timeout ${LIMIT:-240} $B "$@" \
    --steps ${STEPS:-12} > $R/$tag.out 2> $R/$tag.err)
  echo "$tag: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
}
for m in ${MODELS:-encoder resnet lstm}; do
  one $m $m-plain --model $m
  peak=$(python3 -c "import json,sys; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])" 2>/dev/null)
  [ -z "$peak" ] && continue
  for f in ${FRACTIONS-0.5 0.333}; do one $m $m-$f --model $m --budget-of $peak --fraction $f; done
done
tar czf $OUT/models-${TAG:-a}.tgz -C /tmp models
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob('/tmp/models/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'], 'compiled', d['first_step_compiled'],
              'in %.1f s' % (d['first_step_compile_s'] or 0), 'later', d['later_compiled'],
              'median %.2f ms, second half %.2f ms' % (d['median_ms'], d['late_median_ms']), 'peak', d['peak_live'], 'steady', d['steady_peak_live'],
              'budget', d['budget'], 'reserved', d['allocator_peak_reserved'],
              'recomputed', d['recomputed_bytes'], 'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
PY
cat $R/summary.txt
