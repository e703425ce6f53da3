#!/usr/bin/env bash
# First processes on a fresh machine: each configuration in its own process, folder and home
# directory, so each starts with empty caches (frugal-cuda's kernel cache, CubeCL's autotune
# cache in ~/.cache/cubecl, the driver's in ~/.nv).
# Arguments: tag:limit_s:env:gpt flags (env: NAME=VALUE,... or empty; default: f32, then bf16
# with low outputs).
cd "$(dirname "$0")"
if [ -f gpt.xz ]; then python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" gpt.xz gpt
else gunzip -kf gpt.gz; fi
chmod +x gpt; G=$(pwd)/gpt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
specs=("$@"); [ ${#specs[@]} -eq 0 ] && specs=("f32:270::" "bf16:290::--precision bf16 --low-outputs")
for spec in "${specs[@]}"; do
  IFS=: read -r tag limit envs more <<< "$spec"
  mkdir -p /tmp/c-$tag/home && cd /tmp/c-$tag
  t0=$(date +%s)
  env HOME=/tmp/c-$tag/home FRUGAL_CUDA_KERNEL_CACHE=/tmp/c-$tag/kernels ${envs//,/ } \
    timeout $limit $G --device frugal-cuda --model reference --steps 14 $more --out /tmp/c-$tag/out \
    > $OUT/cold-$tag.out 2> $OUT/cold-$tag.err
  echo "cold-$tag: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $OUT/summary.txt
  cp /tmp/c-$tag/out/steps.json $OUT/cold-$tag-steps.json 2>/dev/null
  ls /tmp/c-$tag/kernels 2>/dev/null | wc -l | sed "s/^/kernel cache entries: /" | tee -a $OUT/summary.txt
  cd - > /dev/null
done
