#!/usr/bin/env bash
# Issue 18 diagnosis: the allocator's trace and the ledger's timeline of a gpt step on
# frugal-cuda, to find the allocations the ledger does not see.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
[ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in gpt; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
R="--device frugal-cuda --layers 12 --d-model 768 --heads 12 --seq 512 --batch 8"
j=0
for spec in ${GPTS:-}; do
  IFS=: read -r limit more <<< "$spec"; more=${more//,/ }
  j=$((j+1)); t0=$(date +%s)
  timeout $limit ./gpt $R $more --out /tmp/gpt$j > /tmp/gpt$j.txt 2>&1
  echo "gpt $more exit $? in $(( $(date +%s) - t0 )) s"
  grep -v "^\s*$" /tmp/gpt$j.txt | grep -v "DEBUG\|TRACE" | tail -12 | cut -c1-200
  (cd /tmp/gpt$j && tar czf $OUT/run$j.tgz memory.json memory_viz.pickle steps.json ../gpt$j.txt 2>/dev/null)
done
(cd .. && tar czf $OUT/z-cubecl-cache.tgz target/autotune target/frugal-cuda-kernels 2>/dev/null)
