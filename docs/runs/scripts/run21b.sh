#!/usr/bin/env bash
# Issue 21 on the GPU: the reference step (peak-memory, vocabulary 8192) with AdamW and AdamW8bit,
# one configuration per process, each with its own time limit, PyTorch first in the same call.
# SPECS: dev:config:limit_s:steps:warmup[:budget_denominator[:extra,args]]
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory gpt; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TORCH:-}" ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout ${TORCH_LIMIT:-150} python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
  echo "torch exit $? in $(( $(date +%s) - t0 )) s"; grep '^{' $OUT/torch.jsonl | cut -c1-300
fi
# The frugal configuration's peak live bytes at the reference size (2026-11-22 to 2026-11-23).
PEAK=8096366596
i=0
for spec in ${SPECS:-}; do
  IFS=: read -r dev name limit steps warm frac more <<< "$spec"; more=${more//,/ }
  extra=""; [ -n "$frac" ] && extra="--budget-bytes $((PEAK / frac))"
  # One file for every configuration's JSON and one for their stderr: the device tool
  # returns a limited number of files.
  i=$((i+1)); f=/tmp/$i.err
  t0=$(date +%s)
  timeout $limit ./peak-memory --device $dev --only $name --steps $steps --warmup $warm $extra ${more:-} >> $OUT/frugal.jsonl 2> $f
  echo "$dev $name $more exit $? in $(( $(date +%s) - t0 )) s"
  { echo "== $i $dev $name $more"; cat $f; } >> $OUT/stderr.txt
  grep "step" $f | sed 's/.*step/step/' | tr "\n" " "; echo
  grep -v "step\|^\s*$" $f | head -6
done
python3 - <<'PY'
import json, os, glob
for f in [os.environ['OUT'] + '/frugal.jsonl']:
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l); a = d.get('allocator') or {}
        print(d.get('config'), {k: d.get(k) for k in ['optimizer','budget_bytes','model_state_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','adamw8bit_kernel_updates','recomputes','recomputed_bytes','offloads','uploads','upload_nanos','compressions','plan_period','replans','error']},
              {k: a.get(k) for k in ['peak_reserved_bytes','peak_allocated_bytes']},
              [round(x, 1) for x in d.get('step_ms', [])], [round(x, 6) for x in d.get('losses', [])])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
