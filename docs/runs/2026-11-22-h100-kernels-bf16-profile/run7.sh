#!/usr/bin/env bash
# Issue 5 (2026-11-22): the whole GPU table in one call. PyTorch's twins, plain Burn, Frugal's
# bf16 autocast (cast back / low outputs / low outputs + bf16 storage under a budget of 1/3),
# the cast kernels' throughput, and the example on f16 autocast with loss scaling (GradScaler's
# fused unscale on CUDA under fusion).
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory gpt cast-throughput; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
[ -n "${TORCH:-}" ] && PYTHONUNBUFFERED=1 timeout 150 python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
echo "torch exit $? in $(( $(date +%s) - t0 )) s"; grep '^{' $OUT/torch.jsonl | cut -c1-300
PEAK=8096366596
for spec in $SPECS; do
  IFS=: read -r name limit steps warm frac <<< "$spec"
  extra=""; [ -n "$frac" ] && extra="--budget-bytes $((PEAK / frac))"
  f=$OUT/$(echo $name | tr / _)
  t0=$(date +%s)
  timeout $limit ./peak-memory --device cuda --only $name --steps $steps --warmup $warm $extra > $f.json 2> $f.err
  echo "$name exit $? in $(( $(date +%s) - t0 )) s"
  grep "step" $f.err | sed 's/.*step/step/' | tr "\n" " "; echo
done
timeout 60 ./cast-throughput --reps 7 > $OUT/cast-throughput.txt 2>&1; echo "cast-throughput exit $?"; grep -v '^{' $OUT/cast-throughput.txt
t0=$(date +%s)
timeout ${GPT_LIMIT:-180} ./gpt --device cuda --precision f16 --loss-scale --steps 30 --layers 2 --d-model 128 --seq 128 --batch 16 --out $OUT/gpt-f16 > $OUT/gpt-f16.txt 2>&1
echo "gpt f16 exit $? in $(( $(date +%s) - t0 )) s"; grep -v "^ " $OUT/gpt-f16.txt | tail -12
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        r = d.get('remat') or {}
        print(os.path.basename(f), {k: d.get(k) for k in ['config','budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','tokens_per_s']}, {k: r.get(k) for k in ['recomputes','offloads','compressions','search_nanos']}, d['step_ms'])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
