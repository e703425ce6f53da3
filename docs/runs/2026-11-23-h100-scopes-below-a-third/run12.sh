#!/usr/bin/env bash
# Issue 4 (2026-11-23): who holds the bytes at the peak (--peak-holders), budget curve, one call.
# reserved bytes can follow the budget) beside burn-cuda and PyTorch's checkpointing, one call.
# SPECS: dev:config:limit_s:steps:warmup[:budget_fraction_denominator]
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TORCH:-}" ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 200 python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
  echo "torch exit $? in $(( $(date +%s) - t0 )) s"; grep '^{' $OUT/torch.jsonl | cut -c1-400
fi
PEAK=8096366596
for spec in ${SPECS:-}; do
  IFS=: read -r dev name limit steps warm frac <<< "$spec"
  extra=""; [ -n "$frac" ] && extra="--budget-bytes $((PEAK / frac))"
  f=$OUT/$dev-$(echo $name | tr / _)
  t0=$(date +%s)
  timeout $limit ./peak-memory --device $dev --only $name --steps $steps --warmup $warm $extra ${EXTRA:-} > $f.json 2> $f.err
  echo "$dev $name exit $? in $(( $(date +%s) - t0 )) s"
  grep "step" $f.err | sed 's/.*step/step/' | tr "\n" " "; echo
  grep -v "step\|^\s*$" $f.err | head -24
done
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        r = d
        a = d.get('allocator') or {}
        print(os.path.basename(f), {k: d.get(k) for k in ['budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','tokens_per_s','error']}, {k: r.get(k) for k in ['recomputes','recomputed_bytes','offloads','offloaded_bytes','offload_batches','search_nanos','upload_nanos','offload_nanos']}, {k: a.get(k) for k in ['peak_reserved_bytes','peak_allocated_bytes']}, [round(x) for x in d.get('step_ms', [])], d.get('losses'))
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
