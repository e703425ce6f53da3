#!/usr/bin/env bash
# Issue 6, 2026-11-22: frugal-cuda's reserved bytes over a longer run, with the default
# allocator policy and with huge requests in their own segments (FRUGAL_CUDA_HUGE_THRESHOLD_MIB).
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
for t in ${THRESHOLDS:-0}; do
  t0=$(date +%s)
  if [ "$t" = 0 ]; then unset FRUGAL_CUDA_HUGE_THRESHOLD_MIB; else export FRUGAL_CUDA_HUGE_THRESHOLD_MIB=$t; fi
  timeout 150 ./peak-memory --device frugal-cuda --only frugal --steps ${STEPS:-12} --warmup 3 > $OUT/huge-$t.json 2> $OUT/huge-$t.err
  echo "threshold $t MiB exit $? in $(( $(date +%s) - t0 )) s"
  python3 -c "
import json
for l in open('$OUT/huge-$t.json'):
    if l.startswith('{'):
        d=json.loads(l); print({k: d.get(k) for k in ['peak_allocated_bytes','peak_reserved_bytes','step_ms_median','tokens_per_s']}, d.get('allocator'), [round(x,1) for x in d['step_ms']], [p['pool_reserved_bytes'] for p in d['ledger_vs_pool']])
"
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
