#!/usr/bin/env bash
# The growth limit raised where misses after which the device had no work left take more than
# 5% of a settled step (Frugal's budget marks each planned step for frugal-cuda, saying which
# are settled; frugal-cuda judges the settled ones). PyTorch's anchors, then for each of PARTS
# (default "encoder lstm gpt"; also resnet): one of burn-nn's models plain and at fractions of
# its plain peak, with the rule (FRACTION:default) and without it (FRACTION:off, that is
# --miss-time-share off; ENCODER_RUNS, LSTM_RUNS and RESNET_RUNS choose), and the gpt example
# at the reference size plain, at 1/3 and at 1/4 (GPT_RUNS chooses; ref3g and ref4g set the
# growth limit at the budget plus 1/16). Each run its own process and limit. Staged
# in .gpu/: burn-nn-models.xz, gpt.xz, lib.sh, this script, torch_gpt.py, torch_best.py,
# cubecl-cache.tgz (if a call left one). Everything comes back as $OUT/results.tgz and
# $OUT/cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] || { mkdir -p /tmp/empty/frugal-cuda-kernels && tar czf cubecl-cache.tgz -C /tmp/empty frugal-cuda-kernels; }
. ./lib.sh
# Whatever ran comes back in one file, even when the call's time runs out.
pack() { (cd $OUT && [ -d runs ] && tar czf results.tgz anchors runs && rm -rf anchors runs); }
trap pack EXIT TERM
unxz_bins burn-nn-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
anchors 90 150
R=$OUT/runs; mkdir -p $R
steps=${STEPS:-24}
family() { local m=$1 plain_limit=$2 limit=$3; shift 3
  one $m-plain $plain_limit ./burn-nn-models --model $m --steps $steps --profile-kernels
  local peak=$(python3 -c "import json; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])")
  # Each run FRACTION:SHARE[:GROWTH]: --miss-time-share SHARE unless `default`, and
  # --growth-limit GROWTH if given.
  for run in "$@"; do
    local f share growth flag= name=$m-${run//:/-}
    IFS=: read -r f share growth <<< "$run"
    [ $share = default ] || flag="--miss-time-share $share"
    [ -z "$growth" ] || flag="$flag --growth-limit $growth"
    one $name $limit ./burn-nn-models --model $m --steps $steps --budget-of $peak \
      --fraction $f --profile-kernels $flag
  done
}
for part in ${PARTS:-encoder lstm gpt}; do
  case $part in
    encoder) family encoder 150 120 ${ENCODER_RUNS:-0.333:default 0.333:off 0.5:default 0.5:off} ;;
    lstm) family lstm 120 120 ${LSTM_RUNS:-0.5:default 0.333:default 0.333:off} ;;
    resnet) family resnet ${RESNET_PLAIN_LIMIT:-150} ${RESNET_LIMIT:-120} ${RESNET_RUNS:-0.5:default 0.333:default 0.333:off} ;;
    gpt)
      unxz_bins gpt
      export RUST_LOG="error,gpt=info"
      ref="--model reference --steps ${STEPS_REF:-24}"
      # ref3g and ref4g: the growth limit at the budget plus 1/16 (not the default 1/8).
      for run in ${GPT_RUNS:-ref ref3 ref4}; do
        case $run in
          ref) flags="$ref" ;;
          ref3) flags="$ref --budget 2698788865" ;;
          ref4) flags="$ref --budget 2024091649" ;;
          ref3g) flags="$ref --budget 2698788865 --growth-limit 2867463169" ;;
          ref4g) flags="$ref --budget 2024091649 --growth-limit 2150597377" ;;
        esac
        rm -rf /tmp/o-$run
        one gpt-$run 90 ./gpt --device frugal-cuda $flags --save-minutes 0 --out /tmp/o-$run
        cp /tmp/o-$run/steps.json $R/steps-$run.json 2>/dev/null
      done ;;
  esac
done
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 - <<'PY'
import json, glob, os, statistics
for f in sorted(glob.glob(os.environ['OUT'] + '/runs/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        kp = d.get('kernel_profile') or {}
        steady = (d.get('driver_per_step') or [])[3:]
        mean = lambda k: sum(s[k] for s in steady) / max(len(steady), 1)
        a = d.get('allocator') or {}
        print(os.path.basename(f)[:-4], 'median %.2f late %.2f first %.0f ms' % (d['median_ms'], d['late_median_ms'], d['first_step_ms']),
              'idle %.2f ms' % kp.get('idle_ms', 0),
              'misses %.1f (host %.2f ms, device idle after them %.2f ms) a step' % (mean('misses'), mean('miss_cleanup_ms') + mean('miss_grow_ms'), mean('miss_idle_ms') if steady and 'miss_idle_ms' in steady[0] else -1),
              'last steps misses', [s['misses'] for s in (d.get('driver_per_step') or [])[-3:]],
              'budget', d['budget'], 'steady peak', d['steady_peak_live'],
              'reserved', d['allocator_peak_reserved'],
              'limit', a.get('growth_limit'), 'raises', a.get('growth_limit_raises'),
              'reverts', a.get('growth_limit_reverts'), 'end reserved', a.get('reserved_bytes'),
              'settle trims', a.get('settle_trims'), a.get('settle_trimmed_bytes'),
              'settled peak reserved', a.get('settled_peak_reserved_bytes'),
              'under limit', a.get('settled_peak_limit_bytes'),
              'steps over', a.get('settled_steps_over_limit'),
              'marked', a.get('marked_steps'), 'settled', d.get('settled_steps'),
              'later compiled', d.get('later_compiled'),
              'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
for f in sorted(glob.glob(os.environ['OUT'] + '/runs/steps-*.json')):
    s = json.load(open(f))
    print(os.path.basename(f), 'median of steps 4 on %.2f ms' % statistics.median(x['step_ms'] for x in s[3:]),
          'peak', max(x['peak_bytes'] for x in s),
          'reserved after steps', [x.get('allocator', {}).get('reserved_bytes') for x in s])
PY
grep -h "peak reserved\|settled steps with no raise" $R/*.out
cat $R/summary.txt
