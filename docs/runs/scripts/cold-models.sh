#!/usr/bin/env bash
# First processes of `burn-nn-models` on a fresh machine: each configuration in its own process,
# folder and home directory, so each starts with empty caches (frugal-cuda's kernel cache,
# CubeCL's autotune cache under the working directory's target/, the driver's in ~/.nv).
# Arguments: tag:limit_s:env:flags (env: NAME=VALUE,... or empty). Staged in .gpu/:
# burn-nn-models.xz, lib.sh. BIN names another build of it (default burn-nn-models).
set -u
cd "$(dirname "$0")"
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" $1.xz $1 && chmod +x $1; }
BIN=${BIN:-burn-nn-models}
[ -x $BIN ] || unxz $BIN
B=$(pwd)/$BIN
R=$OUT/cold; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
for spec in "$@"; do
  IFS=: read -r tag limit envs more <<< "$spec"
  rm -rf /tmp/c-$tag; mkdir -p /tmp/c-$tag/home && cd /tmp/c-$tag
  t0=$(date +%s)
  env HOME=/tmp/c-$tag/home FRUGAL_CUDA_KERNEL_CACHE=/tmp/c-$tag/kernels ${envs//,/ } \
    timeout $limit $B $more > $R/$tag.out 2> $R/$tag.err
  echo "$tag: exit $? in $(( $(date +%s) - t0 )) s, $(ls /tmp/c-$tag/kernels 2>/dev/null | wc -l) kernels cached" | tee -a $R/summary.txt
  cd - > /dev/null
done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ['OUT'] + '/cold/*.out')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f)[:-4], 'first %.1f s' % (d['first_step_ms'] / 1e3), 'compiled', d.get('first_step_compiled'),
              'in %.1f s' % (d.get('first_step_compile_s') or 0), 'nvrtc %.1f s' % (d.get('first_step_nvrtc_s') or 0),
              'later', d.get('later_compiled'), 'median %.2f ms' % d['median_ms'])
PY
for f in $R/*.err; do echo "== $(basename $f)"; grep "compiling kernels" $f | tail -2; done
cat $R/summary.txt
