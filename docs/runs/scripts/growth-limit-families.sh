#!/usr/bin/env bash
# One of burn-nn's models (MODEL, default encoder) plain and at FRACTIONS (default "0.5 0.333")
# of its plain peak under each growth limit of LIMITS (values of burn-nn-models' --growth-limit;
# `default`: the one set_budget sets; default "default none"), each configuration its own
# process and limit, with --profile-kernels; PyTorch's anchors first unless SKIP_TORCH. Prints
# per run: median step, device busy and idle time, copies, and the allocator's driver calls
# per step from the fourth on. Staged in .gpu/: burn-nn-models.xz, lib.sh, torch_gpt.py,
# torch_best.py, cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
[ -f burn-nn-models ] || unxz_bins burn-nn-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -z "${SKIP_TORCH:-}" ] && anchors 90 120
R=$OUT/runs; mkdir -p $R
m=${MODEL:-encoder}; steps=${STEPS:-16}
one $m-plain 90 ./burn-nn-models --model $m --steps $steps --profile-kernels
peak=$(python3 -c "import json; print(json.loads(open('$R/$m-plain.out').readline())['peak_live'])")
for f in ${FRACTIONS-0.5 0.333}; do
  for g in ${LIMITS-default none}; do
    flag=; [ $g = default ] || flag="--growth-limit $g"
    one $m-$f-$g ${LIMIT:-90} ./burn-nn-models --model $m --steps $steps --budget-of $peak \
      --fraction $f --profile-kernels $flag
  done
done
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/runs/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        kp = d.get('kernel_profile') or {}
        busy = sum(c['ms'] for c in kp.get('classes', []))
        copies = sum(c['ms'] for c in kp.get('classes', []) if c['name'] == 'copies')
        steady = (d.get('driver_per_step') or [])[3:]
        mean = lambda k: sum(s[k] for s in steady) / max(len(steady), 1)
        print(os.path.basename(f)[:-4], 'median %.2f ms' % d['median_ms'],
              'busy %.2f idle %.2f copies %.2f ms' % (busy, kp.get('idle_ms', 0), copies),
              'maps %.1f (%.2f ms) unmaps %.1f (%.2f ms) waits %.1f (%.2f ms) misses %.1f '
              '(host: %.2f ms handing back slots, %.2f ms after) a step'
              % (mean('maps'), mean('maps_ms'), mean('unmaps'), mean('unmaps_ms'),
                 mean('waits'), mean('waits_ms'), mean('misses'),
                 mean('miss_cleanup_ms'), mean('miss_grow_ms')),
              'budget', d['budget'], 'steady peak', d['steady_peak_live'],
              'reserved', d['allocator_peak_reserved'],
              'loss %.4f->%.4f' % (d['losses'][0], d['losses'][-1]))
PY
cat $R/summary.txt
