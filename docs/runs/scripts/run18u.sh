#!/usr/bin/env bash
# Issue 18, frugal-cuda's map unit: the reference step (peak-memory, vocabulary 8192) at budget
# 1/4 with FRUGAL_CUDA_MAP_UNIT_MIB set per run, one process per row, plain first.
# UNITS: map units in MiB ("-" leaves it unset: the driver's granularity), or unit/huge pairs
# such as 4/0 (FRUGAL_CUDA_HUGE_THRESHOLD_MIB as well), or triples such as 0/-/8
# (FRUGAL_CUDA_HUGE_MAP_UNIT_MIB as well); "-" leaves a variable unset.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
if [ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ]; then
  case "$(tar tzf cubecl-cache.tgz | head -1)" in target/*) tar xzf cubecl-cache.tgz -C .. ;; *) tar xzf cubecl-cache.tgz -C ../target ;; esac
fi
gunzip -kf peak-memory.gz && chmod +x peak-memory
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
PEAK=8096366596
run() { # label env config extra...
  local label=${1//\//h} unit huge hunit; IFS=/ read -r unit huge hunit <<< "$2"; huge=${huge:--}; hunit=${hunit:--}; local config=$3; shift 3
  local f=/tmp/$label.err t0=$(date +%s)
  if [ "$unit" = "-" ]; then unset FRUGAL_CUDA_MAP_UNIT_MIB; else export FRUGAL_CUDA_MAP_UNIT_MIB=$unit; fi
  if [ "$huge" = "-" ]; then unset FRUGAL_CUDA_HUGE_THRESHOLD_MIB; else export FRUGAL_CUDA_HUGE_THRESHOLD_MIB=$huge; fi
  if [ "$hunit" = "-" ]; then unset FRUGAL_CUDA_HUGE_MAP_UNIT_MIB; else export FRUGAL_CUDA_HUGE_MAP_UNIT_MIB=$hunit; fi
  RUST_LOG=frugal::engine::plan=debug timeout ${LIMIT:-60} ./peak-memory --device frugal-cuda --only $config \
    --steps 16 --warmup 10 --fused-attention "$@" >> $OUT/frugal.jsonl 2> $f
  echo "$label unit=$unit huge=$huge huge-unit=$hunit $config $* exit $? in $(( $(date +%s) - t0 )) s"
  { echo "== $label unit=$unit huge=$huge huge-unit=$hunit $config $*"; cat $f; } >> $OUT/stderr.txt
  grep "step 1[0-5] took" $f | sed 's/(0 kernels compiled in 0.0 ms, 0 loaded from disk; 0.0 ms loading)//; s/.*step/step/; s/budget: .*room rounds; //' | cut -c1-200
}
# CONFIG: budget-1/4 (the default) or plain; DENOM: the budget's share of PEAK (4: a quarter).
CONFIG=${CONFIG:-budget-1/4}; DENOM=${DENOM:-4}
budget=(); [ "$CONFIG" = plain ] || budget=(--budget-bytes $((PEAK / DENOM)))
[ -n "${NOPLAIN:-}" ] || run plain - plain
for round in q r; do
  for unit in ${UNITS:-- 8 20}; do
    run $round$unit $unit $CONFIG "${budget[@]}" "$@"
  done
done
python3 - $OUT/frugal.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith('{'): continue
    d = json.loads(l)
    if d.get('error'): print(d['config'], 'failed:', d['error'][:200]); continue
    print(d['config'], 'median', round(d['step_ms_median'], 2), 'reserved', d.get('peak_reserved_bytes'), 'live', d.get('peak_allocated_bytes'))
PY
tar czf $OUT/cubecl-cache.tgz -C ../target autotune frugal-cuda-kernels 2>/dev/null
