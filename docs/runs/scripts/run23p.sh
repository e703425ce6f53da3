#!/usr/bin/env bash
# Issue 23, item 1 and 3 on one GPU: the products' differential cases and throughput
# (products-throughput, cuBLASLt vs CubeCL) beside PyTorch's torch.matmul on the same list
# (torch_products.py), then the reference step (peak-memory) per configuration beside
# torch_gpt.py's rows. Staged in .gpu/: peak-memory.gz, products-throughput.gz, torch_gpt.py,
# torch_products.py. CONFIGS: dev:config:limit_s[:extra,args] for peak-memory.
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
[ -f cubecl-cache.tgz ] && [ ! -d ../target/autotune ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in peak-memory products-throughput; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -x products-throughput ] && [ "${PRODUCTS:-1}" != 0 ]; then
  t0=$(date +%s)
  timeout ${PRODUCTS_LIMIT:-200} ./products-throughput ${PRODUCTS_ARGS:-} > $OUT/products.jsonl 2> $OUT/products.err
  echo "products-throughput exit $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/products.err
  timeout 120 python3 torch_products.py > $OUT/torch-products.jsonl 2>&1
  echo "torch products exit $?"
  python3 - <<'PY'
import json, os
bad = 0
for f in ['products.jsonl', 'torch-products.jsonl']:
    for l in open(os.environ['OUT'] + '/' + f):
        if not l.startswith('{'):
            print(l.rstrip()[:300]); continue
        d = json.loads(l)
        if d['bench'] == 'products-check':
            if not d['ok'] or d['case'].startswith('large') or d['case'].startswith('linear'):
                print('check', d['backend'], d['dtype'], d['products'], d['case'], '%.2e' % d['rel_error'], 'tol', d['tolerance'], 'blas', d['blas_products'], 'OK' if d['ok'] else 'FAIL')
        else:
            print(d['bench'], d['dtype'], d.get('products', ''), round(d['step_ms'], 3), 'ms', round(d['tflops'], 1), 'TFLOP/s', d.get('blas_products_per_step', ''))
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
        print(d.get('system'), d.get('config'), d.get('products', ''), 'blas', d.get('blas_products'), 'attn', d.get('attention_kernel_passes'),
              'peak', d.get('peak_allocated_bytes'), 'reserved', d.get('peak_reserved_bytes'), 'ms', round(d.get('step_ms_median') or 0, 2),
              [round(x) for x in d.get('step_ms', [])][:4], d.get('error'), [round(x, 5) for x in d.get('losses', [])][:6])
PY
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune target/frugal-cuda-kernels 2>/dev/null)
