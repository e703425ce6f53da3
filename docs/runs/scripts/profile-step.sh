#!/usr/bin/env bash
# The reference step's device time by kind of work: Frugal on frugal-cuda (`peak-memory
# --profile-kernels`, `gpt --profile-kernels`) beside PyTorch (`torch_profile.py`), and
# PyTorch's anchors (`torch_gpt.py`, `torch_best.py`), all in one call. Optionally (TAKE=1) a
# reference run with memory taken mid-run. Staged in .gpu/: gpt.gz, peak-memory.gz,
# torch_gpt.py, torch_best.py, torch_profile.py, and cubecl-cache.tgz if a call left one.
# PM: peak-memory configurations (name:limit_s[:extra,args]); GPT: gpt runs (tag:limit_s:args,
# args comma-separated, --device and --model included). A PM name prefixed `before@` runs
# peak-memory-before.gz (an earlier build staged beside the new one) for A/B pairs.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -f cubecl-cache.tgz ] && [ ! -d ../target/frugal-cuda-kernels ] && tar xzf cubecl-cache.tgz -C ../target
for f in gpt peak-memory peak-memory-before; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
R=/tmp/prof; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
one() { # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
}
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs ${TORCH_GPT:-fp32_math,bf16_sdpa}
  one torch_best 200 python3 torch_best.py --configs bf16_sdpa_fusedadam,bf16_compile_amb20
  for c in ${TPROF-bf16_sdpa_fusedadam bf16_compile_amb20 fp32_math}; do
    one tprof-$c 150 python3 torch_profile.py --config $c
  done
fi
# A spec whose extra args hold `nocache` runs with FRUGAL_CUDA_METADATA_CACHE=0 (metadata
# uploaded at every launch, as cubecl-cuda does).
for spec in ${PM-}; do
  IFS=: read -r name limit more <<< "$spec"; more=${more//,/ }
  bin=./peak-memory; case $name in before@*) bin=./peak-memory-before; name=${name#before@} ;; esac
  tag=${name//\//_}; cache=1; [ $bin = ./peak-memory-before ] && tag=before-$tag
  case " $more " in *" nocache "*) cache=0; tag=$tag-nocache; more=${more//nocache/} ;; esac
  n=2; base=$tag; while [ -e $R/pm-$tag.out ]; do tag=$base-$n; n=$((n + 1)); done
  export FRUGAL_CUDA_METADATA_CACHE=$cache; one pm-$tag $limit $bin --device frugal-cuda --only $name --steps ${STEPS:-10} --warmup ${WARMUP:-4} --profile-kernels ${more:-}
done
export FRUGAL_CUDA_METADATA_CACHE=1
for spec in ${GPT-}; do
  IFS=: read -r tag limit more <<< "$spec"; more=${more//,/ }
  one gpt-$tag $limit ./gpt --out /tmp/gpt-$tag ${more:-}
  ls -la --time-style=+%T /tmp/gpt-$tag/checkpoints > $R/gpt-$tag-checkpoints.txt 2>&1
  cp /tmp/gpt-$tag/kernel-profile.json $R/gpt-$tag-profile.json 2>/dev/null
  cp /tmp/gpt-$tag/steps.json $R/gpt-$tag-steps.json 2>/dev/null
done
tar czf $OUT/prof-${TAG:-a}.tgz -C /tmp prof
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
python3 - <<'PY'
import json, glob, os
R = '/tmp/prof'
for f in sorted(glob.glob(R + '/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        if 'classes' in d:
            print('torch-profile', d['config'], 'step', round(d['step_ms_median'], 2), 'busy', round(d['busy_ms'], 2), 'idle', round(d['idle_ms'], 2), 'launches', round(d['launches']))
            print('   ', ', '.join('%s %.2f' % (c['class'], c['ms']) for c in d['classes']))
        else:
            kp = d.get('kernel_profile')
            print(d.get('system'), d.get('config'), 'peak', d.get('peak_allocated_bytes'), 'reserved', d.get('peak_reserved_bytes'), 'ms', round(d.get('step_ms_median') or 0, 2), d.get('error', ''))
            if kp:
                print('    busy %.2f idle %.2f launches %d:' % (sum(c['ms'] for c in kp['classes']), kp['idle_ms'], sum(c['launches'] for c in kp['classes'])), ', '.join('%s %.2f' % (c['name'], c['ms']) for c in kp['classes']))
for f in sorted(glob.glob(R + '/gpt-*.out')):
    print('==', os.path.basename(f))
    print(''.join(l for l in open(f) if not l.startswith('|'))[-1500:])
PY
cat $R/summary.txt
