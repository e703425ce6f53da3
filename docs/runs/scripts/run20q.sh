#!/usr/bin/env bash
# Issues 20 and 23 on one GPU: attention forward and backward as products on cuBLASLt
# (`--attention-path products`) against the flash-attention kernels. The kernels' tests on CUDA
# first (kernel-tests.gz, if staged; TEST_FILTER, attention:: by default); products-throughput
# checks both paths' outputs and gradients (and the products' own differential cases), then
# times the reference shapes' attention alone beside torch_attention.py; then the reference
# step (peak-memory) per configuration beside torch_gpt.py's rows. Staged in .gpu/:
# peak-memory.gz, products-throughput.gz, torch_gpt.py, torch_attention.py, cubecl-cache.tgz.
# CONFIGS: dev:config:limit_s[:extra,args].
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
# The cache is tarred from target/ (autotune/, frugal-cuda-kernels/); older ones carry the target/ prefix.
mkdir -p ../target
if [ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ]; then
  case "$(tar tzf cubecl-cache.tgz | head -1)" in target/*) tar xzf cubecl-cache.tgz -C .. ;; *) tar xzf cubecl-cache.tgz -C ../target ;; esac
fi
for f in peak-memory products-throughput kernel-tests; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -x kernel-tests ]; then
  t0=$(date +%s)
  timeout ${TESTS_LIMIT:-120} ./kernel-tests --test-threads 1 ${TEST_FILTER-attention::} > $OUT/kernel-tests.txt 2>&1
  echo "kernel tests exit $? in $(( $(date +%s) - t0 )) s"; grep -E '^test |test result' $OUT/kernel-tests.txt
fi
if [ -x products-throughput ] && [ "${PRODUCTS:-1}" != 0 ]; then
  t0=$(date +%s)
  timeout ${PRODUCTS_LIMIT:-240} ./products-throughput ${PRODUCTS_ARGS:-} > $OUT/products.jsonl 2> $OUT/products.err
  echo "products-throughput exit $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/products.err
  timeout 120 python3 torch_attention.py > $OUT/torch-attention.jsonl 2>&1
  echo "torch attention exit $?"
  python3 - <<'PY'
import json, os
for f in ['products.jsonl', 'torch-attention.jsonl']:
    for l in open(os.environ['OUT'] + '/' + f):
        if not l.startswith('{'):
            print(l.rstrip()[:300]); continue
        d = json.loads(l)
        b = d.get('bench')
        if b == 'products-check':
            if not d['ok'] or d['products'].startswith('attention'):
                print('check', d['backend'], d['dtype'], d['products'], d['case'], '%.2e' % d['rel_error'], 'tol', d['tolerance'], 'blas', d['blas_products'], 'OK' if d['ok'] else 'FAIL')
        elif b == 'attention-step':
            print('frugal attention', d['dtype'], d['path'], round(d['step_ms'], 3), 'ms for', d['layers'], 'layers', 'product passes/step', d['product_passes_per_step'])
        elif b == 'products-throughput':
            print(b, d['dtype'], d['products'], round(d['step_ms'], 3), 'ms', round(d['tflops'], 1), 'TFLOP/s')
        elif 'impl' in d:
            print('torch', d['impl'], d['dtype'], d['pass'], round(d['median_ms'], 3), 'ms', round(d['ms_for_layers'], 2), 'ms/12', round(d['tflops'], 1), 'TFLOP/s')
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
        print(d.get('system'), d.get('config'), d.get('products', ''), 'attn', d.get('attention_path'), 'kernel passes', d.get('attention_kernel_passes'),
              'product passes', d.get('attention_product_passes'), 'blas', d.get('blas_products'),
              'peak', d.get('peak_allocated_bytes'), 'reserved', d.get('peak_reserved_bytes'), 'ms', round(d.get('step_ms_median') or 0, 2),
              [round(x) for x in d.get('step_ms', [])][:4], d.get('error'), [round(x, 5) for x in d.get('losses', [])][:8])
PY
(cd ../target && tar czf $OUT/cubecl-cache.tgz autotune frugal-cuda-kernels 2>/dev/null)
