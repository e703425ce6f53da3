#!/usr/bin/env bash
# Issue 4 (2026-11-22): plain Burn and Frugal's budgets after batching offloads into one device
# read per eviction round. One child per configuration with its own time limit. Budgets are
# fractions of the unconstrained peak live bytes (8,096,366,596 B, identical in every call).
set -u
cd "$(dirname "$0")"
for f in peak-memory gpt cast-throughput; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
PEAK=8096366596
one() { # name limit steps warmup [budget]
  local t0=$(date +%s)
  local extra=""; [ -n "${5:-}" ] && extra="--budget-bytes $5"
  local f=$OUT/$(echo $1 | tr / _)
  timeout $2 ./peak-memory --device cuda --only $1 --steps $3 --warmup $4 $extra > $f.json 2> $f.err
  echo "$1 exit $? in $(( $(date +%s) - t0 )) s"; grep "step" $f.err | tail -12 | tr "\n" " "; echo
}
for spec in ${SPECS:-plain:70:4:2 budget-1/2:120:3:1:2 budget-1/3:150:3:1:3}; do
  IFS=: read -r name limit steps warm frac <<< "$spec"
  if [ -n "$frac" ]; then one $name $limit $steps $warm $((PEAK / frac)); else one $name $limit $steps $warm; fi
done
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        keys = ['step_ms','config','budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','evictions','recomputes','offloads','offload_batches','uploads','offloaded_bytes','search_nanos','offload_nanos','upload_nanos','losses']
        print({k: d.get(k) for k in keys})
PY
