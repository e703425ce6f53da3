#!/usr/bin/env bash
# Issue 20 on one GPU: the kernels' tests on CUDA (bf16 included; TEST_FILTER, attention:: by
# default, picks which: TEST_FILTER= runs them all), the kernels alone
# beside PyTorch's SDPA and written-out attention, and the reference step (peak-memory) with
# attention written out and fused, f32 and bf16 autocast, beside torch_gpt.py's rows.
# Staged in .gpu/: peak-memory.gz, attention-throughput.gz, kernel-tests.gz, torch_gpt.py,
# torch_attention.py. CONFIGS: dev:config:limit_s[:extra,args] for peak-memory.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
[ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory attention-throughput kernel-tests; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -x kernel-tests ]; then
  t0=$(date +%s)
  timeout ${TESTS_LIMIT:-120} ./kernel-tests --test-threads 1 ${TEST_FILTER-attention::} > $OUT/kernel-tests.txt 2>&1
  echo "kernel tests exit $? in $(( $(date +%s) - t0 )) s"; grep -E '^test |test result' $OUT/kernel-tests.txt
fi
if [ -x attention-throughput ]; then
  timeout ${BENCH_LIMIT:-120} ./attention-throughput --device cuda --dtypes f32,f16,bf16 > $OUT/attention.txt 2>&1
  echo "attention-throughput exit $?"; grep -v '^{' $OUT/attention.txt
  timeout 120 python3 torch_attention.py > $OUT/torch-attention.jsonl 2>&1
  echo "torch attention exit $?"
  python3 - <<'PY'
import json, os
for l in open(os.environ['OUT'] + '/torch-attention.jsonl'):
    if l.startswith('{'):
        d = json.loads(l); print('torch', d['impl'], d['dtype'], d['pass'], round(d['median_ms'], 3), 'ms', round(d['ms_for_layers'], 2), 'ms/12', round(d['tflops'], 1), 'TFLOP/s')
    else:
        print(l.rstrip()[:300])
PY
fi
if [ -n "${TORCH:-}" ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout ${TORCH_LIMIT:-150} python3 torch_gpt.py --configs $TORCH > $OUT/torch.jsonl 2>&1
  echo "torch exit $? in $(( $(date +%s) - t0 )) s"
fi
for spec in ${CONFIGS:-}; do
  IFS=: read -r dev name limit more <<< "$spec"; more=${more//,/ }
  t0=$(date +%s)
  timeout $limit ./peak-memory --device $dev --only $name --steps ${STEPS:-8} --warmup ${WARMUP:-3} ${more:-} >> $OUT/frugal.jsonl 2> /tmp/err
  echo "$dev $name $more exit $? in $(( $(date +%s) - t0 )) s"
  { echo "== $dev $name $more"; cat /tmp/err; } >> $OUT/stderr.txt
  grep -i 'panicked\|error' /tmp/err | head -5
done
python3 - <<'PY'
import json, os
for f in ['torch.jsonl', 'frugal.jsonl']:
    p = os.environ['OUT'] + '/' + f
    if not os.path.exists(p): continue
    for l in open(p):
        if not l.startswith('{'): continue
        d = json.loads(l)
        print(d.get('system'), d.get('config'), 'fused_attention=%s' % d.get('fused_attention'), 'kernel passes', d.get('attention_kernel_passes'),
              'peak', d.get('peak_allocated_bytes'), 'reserved', d.get('peak_reserved_bytes'), 'ms', round(d.get('step_ms_median') or 0, 2), d.get('error'),
              [round(x, 5) for x in d.get('losses', [])][:8])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune target/frugal-cuda-kernels 2>/dev/null)
