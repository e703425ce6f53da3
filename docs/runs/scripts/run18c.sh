#!/usr/bin/env bash
# Issue 18, forward segments: the reference step (peak-memory, vocabulary 8192) under a budget
# alone, one configuration per process with its own time limit, PyTorch first in the same call.
# SPECS: dev:config:limit_s:steps:warmup[:budget_denominator[:extra,args]]
# GPTS: limit_s:gpt,args,comma,separated (the example binary as a user runs it; a budget of
# 'third' or 'quarter' is that share of the peak of the last unbudgeted gpt run in the same call).
set -u
cd "$(dirname "$0")"
# CubeCL's autotune cache and frugal-cuda's compiled kernels, carried from the last call (a
# warm machine keeps both under target/ anyway).
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
# The cache is tarred from target/ (autotune/, frugal-cuda-kernels/); older ones carry the target/ prefix.
mkdir -p ../target
if [ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ]; then
  case "$(tar tzf cubecl-cache.tgz | head -1)" in target/*) tar xzf cubecl-cache.tgz -C .. ;; *) tar xzf cubecl-cache.tgz -C ../target ;; esac
fi
for f in peak-memory peak-memory-old gpt gpt-old; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
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
  i=$((i+1)); f=/tmp/$i.err
  t0=$(date +%s)
  # A device named old-<device> runs peak-memory-old (the binary before a change, for an A/B in one call).
  bin=./peak-memory; case $dev in old-*) bin=./peak-memory-old; dev=${dev#old-} ;; esac
  RUST_LOG=${RUST_LOG:-frugal::engine::plan=debug} timeout $limit $bin --device $dev --only $name --steps $steps --warmup $warm $extra ${more:-} >> $OUT/frugal.jsonl 2> $f
  echo "$bin $dev $name $more exit $? in $(( $(date +%s) - t0 )) s"
  { echo "== $i $bin $dev $name $more"; cat $f; } >> $OUT/stderr.txt
  grep "step" $f | grep -v "frugal: step plan" | sed 's/.*step/step/' | tr "\n" " " | cut -c1-1500; echo
  grep "segments\|whole step" $f | tail -4 | cut -c1-300
done
j=0; last_peak=""
for spec in ${GPTS:-}; do
  IFS=: read -r limit more <<< "$spec"; more=${more//,/ }
  [ -n "$last_peak" ] && more=${more//third/$((last_peak / 3))} && more=${more//quarter/$((last_peak / 4))}
  j=$((j+1)); t0=$(date +%s)
  bin=./gpt; case "$more" in old\ *) bin=./gpt-old; more=${more#old } ;; esac
  timeout $limit $bin $more --out /tmp/gpt$j > $OUT/gpt$j.txt 2>&1
  echo "$bin $more exit $? in $(( $(date +%s) - t0 )) s"
  cp /tmp/gpt$j/steps.json $OUT/gpt$j-steps.json 2>/dev/null
  case "$more" in *--budget*) ;; *) last_peak=$(python3 -c "import json; print(max(s['peak_bytes'] for s in json.load(open('/tmp/gpt$j/steps.json'))))" 2>/dev/null) ;; esac
  python3 -c "import json; l=json.load(open('/tmp/gpt$j/steps.json')); print('ms', [round(s.get('step_ms', 0), 1) for s in l]); print('loss', [round(s['loss'], 5) for s in l]); print('peak', max(s['peak_bytes'] for s in l))" 2>/dev/null
  grep -E "dropped at|segments of about|evicted [0-9]+ times in the last|selection stays" $OUT/gpt$j.txt | tail -4 | cut -c1-400
  grep -v "^\s*$" $OUT/gpt$j.txt | grep -v "DEBUG\|TRACE" | tail -30 | cut -c1-200
  python3 - $OUT/gpt$j.txt <<'PY'
import sys, re, collections
lines = open(sys.argv[1], errors='replace').read().splitlines()
periods = [int(m.group(1)) for l in lines for m in [re.search(r'a step of (\d+) tensors', l)] if m]
rec = [(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)) for l in lines for m in [re.search(r'recompute (\S+) (\d+) B, ordinal (\d+), dead (\S+)', l)] if m]
if rec and periods:
    top = max(o for _, _, o, _ in rec); p = periods[-1]
    c = collections.Counter(); b = collections.Counter()
    for op, n, o, dead in rec:
        if o > top - 3 * p:
            c[(op, dead)] += 1; b[(op, dead)] += n
    print('recomputes in the last 3 periods (%d tensors each): %d, %d B' % (p, sum(c.values()), sum(b.values())))
    for k, v in b.most_common(12): print('  ', k, c[k], v)
PY
done
python3 - <<'PY'
import json, os
for l in open(os.environ['OUT'] + '/frugal.jsonl'):
    if not l.startswith('{'): continue
    d = json.loads(l); r = d; a = d.get('allocator') or {}
    print(d.get('device'), d.get('config'), {k: d.get(k) for k in ['budget_bytes','peak_allocated_bytes','peak_reserved_bytes','step_ms_median','error']},
          {k: r.get(k) for k in ['recomputes','recomputed_bytes','offloads','uploads','upload_nanos','plan_period','replans','plan_segments','plan_segment_bytes','plan_estimated_peak','segment_plans','budget_rounds','room_rounds','plan_parked_bytes','parked_bytes','offloaded_bytes','offload_nanos']},
          {k: a.get(k) for k in ['peak_reserved_bytes','peak_allocated_bytes']},
          [round(x, 1) for x in d.get('step_ms', [])], [round(x, 6) for x in d.get('losses', [])])
PY
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
ls -la $OUT/cubecl-cache.tgz
