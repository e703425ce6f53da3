#!/usr/bin/env bash
# Issue 18, in one process per device (the configurations share compiled kernels).
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory gpt; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
t0=$(date +%s)
timeout ${LIMIT:-420} ./peak-memory --device ${DEV:-cuda} --configs ${CONFIGS:-plain,budget-1/3,budget-1/4} --in-process --reference-peak 8096366596 --steps ${STEPS:-8} --warmup ${WARMUP:-5} ${EXTRA:-} > $OUT/bench.jsonl 2> $OUT/bench.err
echo "peak-memory exit $? in $(( $(date +%s) - t0 )) s"
grep "step" $OUT/bench.err | tr "\n" " " | cut -c1-3000; echo
grep -v "step\|^\s*$" $OUT/bench.err | head -5 | cut -c1-300
python3 - <<'PY'
import json, os
for l in open(os.environ['OUT'] + '/bench.jsonl'):
    if not l.startswith('{'): continue
    d = json.loads(l); r = d.get('remat') or {}
    print(d.get('config'), {k: d.get(k) for k in ['budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','error']},
          {k: r.get(k) for k in ['recomputes','offloads','uploads','upload_nanos','plan_period','replans']},
          [round(x) for x in d.get('step_ms', [])], [round(x, 4) for x in d.get('losses', [])])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
