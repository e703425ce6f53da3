#!/usr/bin/env bash
# Issue 5 (2026-11-22): Frugal's own kernels reached from the decorator on CUDA. Each spec is
# name:limit:steps:warmup:kernels:fusion (kernels auto|always|never; fusion 1|0). Same-call
# comparison of Burn's casts and Frugal's, with and without fusion; the losses of runs that
# differ only in the kernel mode must be equal bit for bit.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for spec in $SPECS; do
  IFS=: read -r name limit steps warm kernels fusion <<< "$spec"
  flag=""; [ "$fusion" = 0 ] && flag="--no-fusion"
  f=$OUT/$(echo $name | tr / _)-$kernels-f$fusion
  t0=$(date +%s)
  timeout $limit ./peak-memory --device cuda $flag --kernels $kernels --only $name --steps $steps --warmup $warm > $f.json 2> $f.err
  echo "$name kernels=$kernels fusion=$fusion exit $? in $(( $(date +%s) - t0 )) s"
  grep "step" $f.err | sed 's/.*step/step/' | tr "\n" " "; echo
done
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f), {k: d.get(k) for k in ['config','kernels','kernel_casts','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','tokens_per_s']}, 'losses', [float.hex(x) for x in d['losses']][:3], d['step_ms'])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
