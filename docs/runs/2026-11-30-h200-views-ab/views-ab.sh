#!/usr/bin/env bash
# A/B of the segments' simulation counting views as buffers (base) or exactly
# (FRUGAL_PLAN_EXACT_VIEWS=1, an A/B build's switch), in one build, each configuration in its
# own process with its own limit; PyTorch beside unless SKIP_TORCH. MODELS (default "lstm
# encoder") at FRACTIONS of their plain peak through burn-nn-models; GPT rows (ROWS: f32, the
# reference step at 1/4 of 8,096,366,596 B; bf16, bf16 with low outputs at 1/3 of 6,779,785,728
# B) through peak-memory. Staged in .gpu/: burn-nn-models.xz, peak-memory.xz, torch_gpt.py,
# torch_best.py, cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
R=$OUT/ab; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
  one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
for m in ${MODELS-lstm encoder}; do
  [ -f burn-nn-models ] || unxz_bins burn-nn-models
  one $m-plain 90 ./burn-nn-models --model $m --steps ${STEPS:-16}
  peak=$(python3 -c "import json; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])" 2>/dev/null)
  [ -z "$peak" ] && continue
  for f in ${FRACTIONS-0.5 0.333}; do for v in base exact; do
    e=0; [ $v = exact ] && e=1
    FRUGAL_PLAN_EXACT_VIEWS=$e RUST_LOG=frugal=debug one $m-$f-$v 100 ./burn-nn-models --model $m \
      --steps ${STEPS:-16} --budget-of $peak --fraction $f
  done; done
done
BF16="--device frugal-cuda --fused-attention --optimizer adamw-fused --loss fused --warmup 4 --steps 24 --configs bf16-lowout-budget-1/3 --reference-peak 6779785728"
F32="--device frugal-cuda --fused-attention --warmup 6 --steps 20 --reference-peak 8096366596 --configs budget-1/4"
for row in ${ROWS-}; do
  [ -f peak-memory ] || unxz_bins peak-memory
  for v in base exact; do
    e=0; [ $v = exact ] && e=1
    case $row in
      f32) FRUGAL_PLAN_EXACT_VIEWS=$e one gpt-f32-$v 90 ./peak-memory $F32 ;;
      bf16) FRUGAL_PLAN_EXACT_VIEWS=$e one gpt-bf16-$v 60 ./peak-memory $BF16 ;;
    esac
  done
done
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/ab/*.out')):
    if 'torch' in f: continue
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        if 'median_ms' in d:
            print(os.path.basename(f)[:-4], 'median %.2f, second half %.2f ms' % (d['median_ms'], d['late_median_ms']),
                  'peak', d['peak_live'], 'budget', d['budget'], 'reserved', d['allocator_peak_reserved'],
                  'recomputed', d['recomputed_bytes'], 'later compiled', d.get('later_compiled'),
                  'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
        else:
            print(os.path.basename(f)[:-4], 'ms', round(d.get('step_ms_median') or 0, 2), 'peak', d.get('peak_allocated_bytes'),
                  'res', d.get('peak_reserved_bytes'), 'segs', d.get('plan_segments'), 'rounds', d.get('room_rounds'),
                  d.get('budget_rounds'), (d.get('losses') or [None])[-1:], d.get('error', ''))
PY
grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out
for f in $R/*-base.err $R/*-exact.err; do echo "== $(basename $f)"; grep -h "estimated peak\|held at most\|evicted" $f | cut -c1-260 | sort | uniq -c | head -8; done
cat $R/summary.txt
