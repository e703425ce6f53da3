#!/usr/bin/env bash
# The check of issue 22 (2026-11-25) on the GPU: the gpt example at the reference size on cuda and
# frugal-cuda; its memory_viz.pickle loaded in python, the segments' total against the
# allocator's reserved bytes in memory.json (taken in the same snapshot), the trace replayed,
# and the ledger's bytes by role. RUNS: name:limit_s:device:args (args comma-separated, REF =
# the reference size).
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
gunzip -kf gpt.gz && chmod +x gpt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
REF="--layers,12,--d-model,768,--heads,12,--seq,512,--batch,8,--no-recover"
for run in ${RUNS:-}; do
  IFS=: read -r name limit dev args <<< "$run"; args="${args//REF/$REF}"; args=${args//,/ }
  t0=$(date +%s)
  timeout $limit ./gpt --device $dev --out /tmp/$name $args > /tmp/$name.txt 2>&1
  code=$?
  echo "== $name ($dev $args): exit $code in $(( $(date +%s) - t0 )) s"
  grep -vE "^\s*$|\[[0-9:]+\]" /tmp/$name.txt | tail -40 | cut -c1-220
  python3 - /tmp/$name <<'PY'
import json, pickle, sys, collections
d = sys.argv[1]
try:
    steps = json.load(open(d + "/steps.json"))
    print("  step ms:", [round(s["step_ms"], 1) for s in steps])
    rep = json.load(open(d + "/memory.json"))["report"]
    print("  live by role:", rep["live_by_role"])
    print("  peak by role:", rep["peak_by_role"])
    f = pickle.load(open(d + "/memory_viz.pickle", "rb"))
    (t,) = f["device_traces"]
    actions = collections.Counter(e["action"] for e in t)
    live = 0; top = 0
    for e in t:
        if e["action"] == "alloc": live += e["size"]
        elif e["action"] == "free_completed": live -= e["size"]
        top = max(top, live)
    total = sum(s["total_size"] for s in f["segments"])
    tiled = all(sum(b["size"] for b in s["blocks"]) == s["total_size"] for s in f["segments"])
    active = sum(b["size"] for s in f["segments"] for b in s["blocks"] if b["state"].startswith("active"))
    reserved = (rep.get("pool") or {}).get("bytes_reserved")
    print("  memory_viz: %d trace entries %s, %d segments, %d B in segments (tiled: %s), %d B active; allocator reserved %s B: %s" % (
        len(t), dict(actions), len(f["segments"]), total, tiled, active, reserved,
        "equal" if reserved == total else "DIFFERENT"))
    print("  replay: net %d B over the trace, its peak %d B" % (live, top))
except Exception as e:
    print("  check failed:", repr(e))
PY
  cat /tmp/$name.txt >> $OUT/runs.txt
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
