#!/usr/bin/env bash
# Issue 6 (2026-11-22): frugal-cuda (CubeCL's CUDA kernels on Frugal's caching allocator) beside
# burn-cuda and PyTorch, one call. Allocation latency and the stress test first, then the
# reference step on both runtimes (plain Burn and Frugal's ledger), then torch_gpt.py.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory alloc-latency gpt; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
timeout ${ALLOC_LIMIT:-120} ./alloc-latency ${ALLOC_ARGS:-} > $OUT/alloc.jsonl 2> $OUT/alloc.err
echo "alloc-latency exit $? in $(( $(date +%s) - t0 )) s"; cat $OUT/alloc.jsonl; tail -5 $OUT/alloc.err
for spec in ${SPECS:-}; do
  IFS=: read -r dev name limit steps warm <<< "$spec"
  f=$OUT/$dev-$name
  t0=$(date +%s)
  timeout $limit ./peak-memory --device $dev --only $name --steps $steps --warmup $warm > $f.json 2> $f.err
  echo "$dev $name exit $? in $(( $(date +%s) - t0 )) s"
  grep "step" $f.err | sed 's/.*step/step/' | tr "\n" " "; echo
  grep -v "step\|^\s*$" $f.err | head -8
done
for dev in ${GPT_DEVICES:-}; do
  t0=$(date +%s)
  timeout 150 ./gpt --device $dev ${GPT_ARGS:-} --out $OUT/gpt-$dev > $OUT/gpt-$dev.txt 2>&1
  echo "gpt $dev exit $? in $(( $(date +%s) - t0 )) s"; grep -v "^ " $OUT/gpt-$dev.txt | tail -8
done
if [ -n "${TORCH:-}" ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 200 python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
  echo "torch exit $? in $(( $(date +%s) - t0 )) s"; grep '^{' $OUT/torch.jsonl | cut -c1-400
fi
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ['OUT'] + '/*.json')):
    for l in open(f):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(os.path.basename(f), {k: d.get(k) for k in ['device','config','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','tokens_per_s','error']}, d.get('allocator'), [round(x,1) for x in d.get('step_ms',[])], d.get('losses'))
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
