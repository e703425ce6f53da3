#!/usr/bin/env bash
# Issue 21 on the GPU: the reference step with AdamW and with AdamW8bit, on frugal-cuda and
# burn-cuda (fused). RUNS: name:limit_s:device:args (args comma-separated); outputs in $OUT.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in *.gz; do [ -f "$f" ] && [ "$f" != cubecl-cache.tgz ] && gunzip -kf "$f" && chmod +x "${f%.gz}"; done
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee $OUT/gpu.txt
REF="--layers,12,--d-model,768,--heads,12,--seq,512,--batch,8,--steps,8,--no-recover"
for run in ${RUNS:-}; do
  IFS=: read -r name limit dev args <<< "$run"; args="${args//REF/$REF}"; args=${args//,/ }
  t0=$(date +%s)
  timeout $limit ./gpt --device $dev --out $OUT/$name $args > $OUT/$name.txt 2>&1
  code=$?
  rm -rf $OUT/$name/checkpoints $OUT/$name/step-memory.png $OUT/$name/memory.json
  echo "== $name ($dev $args): exit $code in $(( $(date +%s) - t0 )) s"
  grep -E "reserved|Frugal's kernels" $OUT/$name.txt | head -3 | cut -c1-200
  python3 - "$OUT/$name/steps.json" <<'PY'
import json, sys
try:
    steps = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no steps.json:", e); sys.exit()
print("  step ms:", [round(s["step_ms"], 1) for s in steps])
print("  losses:", [round(s["loss"], 6) for s in steps])
print("  live after step (model state) B:", steps[-1]["live_bytes"], " peak B:", max(s["peak_bytes"] for s in steps))
PY
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
