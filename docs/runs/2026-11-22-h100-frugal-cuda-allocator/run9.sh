#!/usr/bin/env bash
# Issue 6, 2026-11-22: frugal-cuda's allocator input recorded on the reference step (for
# offline policy comparisons), and the differential cases on burn-cuda vs frugal-cuda.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory differential; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TRACE:-}" ]; then
  t0=$(date +%s)
  timeout 120 ./peak-memory --device frugal-cuda --only frugal --steps 6 --warmup 2 --allocator-trace $OUT/alloc-trace.txt > $OUT/trace-run.json 2> $OUT/trace-run.err
  echo "trace run exit $? in $(( $(date +%s) - t0 )) s"; grep -v "^\s*$" $OUT/trace-run.err | tail -3
  gzip -f $OUT/alloc-trace.txt; ls -la $OUT/alloc-trace.txt.gz
  python3 -c "
import json
for l in open('$OUT/trace-run.json'):
    if l.startswith('{'):
        d=json.loads(l); print({k: d.get(k) for k in ['peak_allocated_bytes','peak_reserved_bytes','step_ms_median']}, d.get('allocator'))
"
fi
if [ -n "${DIFF:-}" ]; then
  t0=$(date +%s)
  timeout ${DIFF_LIMIT:-400} ./differential --exact all_ops_on_frugal_cuda --nocapture --test-threads=1 > $OUT/differential.txt 2>&1
  echo "differential exit $? in $(( $(date +%s) - t0 )) s"; tail -c 3000 $OUT/differential.txt
fi
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
