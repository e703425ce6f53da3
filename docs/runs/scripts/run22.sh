#!/usr/bin/env bash
# The user check (2026-11-25) on the GPU: the gpt example at the reference size, default fused
# backend, with --optimizer adamw8bit and RUST_LOG=frugal=info; its memory_viz.pickle loaded
# in python. RUNS: name:limit_s:device:args (args comma-separated, REF = the reference size).
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
gunzip -kf gpt.gz && chmod +x gpt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
REF="--layers,12,--d-model,768,--heads,12,--seq,512,--batch,8,--no-recover"
for run in ${RUNS:-}; do
  IFS=: read -r name limit dev args <<< "$run"; args="${args//REF/$REF}"; args=${args//,/ }
  t0=$(date +%s)
  RUST_LOG=frugal=info,frugal_cuda=info timeout $limit ./gpt --device $dev --out /tmp/$name $args > /tmp/$name.txt 2>&1
  code=$?
  echo "== $name ($dev $args): exit $code in $(( $(date +%s) - t0 )) s"
  grep -vE "^\s*$|\[[0-9:]+\]" /tmp/$name.txt | tail -12 | cut -c1-220
  python3 - /tmp/$name <<'PY'
import json, pickle, sys
d = sys.argv[1]
try:
    steps = json.load(open(d + "/steps.json"))
    print("  step ms:", [round(s["step_ms"], 1) for s in steps], "losses:", [round(s["loss"], 6) for s in steps])
    f = pickle.load(open(d + "/memory_viz.pickle", "rb"))
    (t,) = f["device_traces"]
    live = 0; top = 0
    for e in t:
        live += e["size"] if e["action"] == "alloc" else -e["size"]; top = max(top, live)
    print("  memory_viz: %d trace entries, %d segments, %d B in segments, peak of the replay %d B" % (len(t), len(f["segments"]), sum(s["total_size"] for s in f["segments"]), top))
except Exception as e:
    print("  check failed:", e)
PY
  cat /tmp/$name.txt >> $OUT/runs.txt
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
