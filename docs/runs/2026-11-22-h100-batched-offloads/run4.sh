#!/usr/bin/env bash
# Issue 4 (2026-11-22): plain Burn, Frugal's scopes and budgets (offloads batched into one device
# read per eviction round), PyTorch's checkpointing twins, in one call. One child per
# configuration with its own time limit; every step's time is kept (`step_ms`) and the number
# of CubeCL kernel compilations per configuration is counted (cubecl.toml logs them).
# The autotune cache of an earlier call is restored first, so the first steps are not
# dominated by autotuning. NOFUSION=1 runs the same on CubeCL's CUDA backend without fusion.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory gpt cast-throughput kt-casts kt-unscale; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TORCH:-}" ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 200 python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
  echo "torch exit $? in $(( $(date +%s) - t0 )) s"; grep '^{' $OUT/torch.jsonl | cut -c1-400
fi
PEAK=8096366596
FLAG=""; [ -n "${NOFUSION:-}" ] && FLAG="--no-fusion"
for spec in $SPECS; do
  IFS=: read -r name limit steps warm frac <<< "$spec"
  extra=""; [ -n "$frac" ] && extra="--budget-bytes $((PEAK / frac))"
  f=$OUT/$(echo $name | tr / _)${NOFUSION:+-nofusion}
  rm -f compile.log
  t0=$(date +%s)
  timeout $limit ./peak-memory --device cuda $FLAG --only $name --steps $steps --warmup $warm $extra > $f.json 2> $f.err
  echo "$name exit $? in $(( $(date +%s) - t0 )) s, $(cat compile.log 2>/dev/null | wc -l) kernels compiled"
  grep "step" $f.err | sed 's/.*step/step/' | tr "\n" " "; echo
done
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        keys = ['config','device','budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','evictions','recomputes','offloads','offload_batches','uploads','offloaded_bytes','search_nanos','offload_nanos','upload_nanos']
        print({k: d.get(k) for k in keys})
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
