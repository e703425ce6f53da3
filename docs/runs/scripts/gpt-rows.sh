#!/usr/bin/env bash
# gpt rows at the reference size, one process per row with its own time limit.
# ROWS: "limit_s|device|extra args" separated by ';'. The kernel and autotune caches travel in
# cubecl-cache.tgz (paths under target/).
set -u
cd "$(dirname "$0")"
mkdir -p ../target && [ -f cubecl-cache.tgz ] && tar xzf cubecl-cache.tgz -C ../target
for f in gpt peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
R="--layers 12 --d-model 768 --heads 12 --seq 512 --batch 8 --steps ${STEPS:-16}"
j=0
IFS=';' read -ra rows <<< "$ROWS"
for row in "${rows[@]}"; do
  IFS='|' read -r limit dev more <<< "$row"
  j=$((j+1)); t0=$(date +%s)
  RUST_LOG=${RUST_LOG:-frugal::engine::plan=debug} timeout $limit ./gpt --device $dev $R $more --out /tmp/r$j > /tmp/r$j.txt 2>&1
  echo "== $j: gpt --device $dev $more: exit $? in $(( $(date +%s) - t0 )) s"
  mkdir -p /tmp/rows && cp /tmp/r$j.txt /tmp/rows/r$j.txt && cp /tmp/r$j/steps.json /tmp/rows/r$j-steps.json 2>/dev/null
  python3 - /tmp/r$j/steps.json <<'PY'
import json, statistics, sys
try: l = json.load(open(sys.argv[1]))
except Exception as e: print('no steps.json'); sys.exit()
ms = [round(s['step_ms'], 1) for s in l]
print('ms', ms); print('median of steps 6-', statistics.median(ms[6:]), 'peak', max(s['peak_bytes'] for s in l))
print('loss', [round(s['loss'], 6) for s in l])
r = l[-1].get('remat')
if r: print('last step: recomputed %d B (%d), offloaded %d B, uploaded %d B, %d offload batches, %d room rounds, %d budget rounds' % (r['recomputed_bytes'], r['recomputes'], r['offloaded_bytes'], r['uploaded_bytes'], r['offload_batches'], r['room_rounds'], r['budget_rounds']))
PY
  grep "segments of about\|selection of" /tmp/r$j.txt | tail -1 | cut -c40-400
  grep "allocator:\|per step (mean" /tmp/r$j.txt
done
tar czf $OUT/rows-${TAG:-a}.tgz -C /tmp rows
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
