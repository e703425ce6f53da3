#!/usr/bin/env bash
# burn-nn's model families (`burn-nn-models`: encoder, resnet, lstm) plain and at FRACTIONS of
# their plain peak, each in its own process with its own limit, the kernel and autotune caches
# shared (lib.sh) and written back to $OUT/cubecl-cache.tgz; PyTorch beside unless SKIP_TORCH.
# MODELS (default "encoder lstm"), FRACTIONS (default "0.5 0.333"), STEPS (default 16), LIMIT
# (seconds per budgeted process, default 120; plain runs get PLAIN_LIMIT, default LIMIT).
# DEVICE: burn-nn-models' --device (default frugal-cuda; when given, the outputs are named
# DEVICE-MODEL-...). EXTRA: more flags for every burn-nn-models run (e.g. `--conv autotune`),
# TAG: a suffix for their outputs' names. RUST_LOG for the budgeted runs: frugal=debug (the step plan's choices).
# Staged in .gpu/:
# burn-nn-models.xz, torch_gpt.py, torch_best.py, cubecl-cache.tgz if a call left one.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
# Results go straight to $OUT, so a call cut short still returns what ran.
R=$OUT/families; mkdir -p $R
dev="--device ${DEVICE:-frugal-cuda}"; pre=${DEVICE:+$DEVICE-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
  one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
for m in ${MODELS:-encoder lstm}; do
  one $pre$m-plain${TAG:-} ${PLAIN_LIMIT:-${LIMIT:-120}} ./burn-nn-models $dev --model $m --steps ${STEPS:-16} ${EXTRA:-}
  peak=$(python3 -c "import json; print(json.loads(open('$R/$pre$m-plain${TAG:-}.out').readline())['peak_live'])" 2>/dev/null)
  [ -z "$peak" ] && continue
  for f in ${FRACTIONS-0.5 0.333}; do
    RUST_LOG=frugal=debug one $pre$m-$f${TAG:-} ${LIMIT:-120} ./burn-nn-models $dev --model $m --steps ${STEPS:-16} \
      --budget-of $peak --fraction $f ${EXTRA:-}
  done
done
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/families/*.out')):
    if 'torch' in f: continue
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'first %.0f ms' % d['first_step_ms'], 'compiled', d.get('first_step_compiled'),
              'later', d.get('later_compiled'), 'median %.2f, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
              'peak', d['peak_live'], 'steady', d.get('steady_peak_live'), 'budget', d['budget'],
              'reserved', d['allocator_peak_reserved'], 'recomputed', d['recomputed_bytes'],
              'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
PY
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out
grep -h "selection\|segments" $R/*.err | cut -c1-200 | sort | uniq -c | sort -rn | head -12
cat $R/summary.txt
