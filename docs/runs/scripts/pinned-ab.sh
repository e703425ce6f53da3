#!/usr/bin/env bash
# Pinned host memory faulted in on several threads and registered, against cuMemAllocHost:
# two gpt builds (BINS, default "gpt-before gpt"), each configuration its own process, the
# builds alternating; PyTorch beside. Everything lands in $OUT/pinned-ab.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
BINS=${BINS:-gpt-before gpt}
unxz_bins $BINS
R=/tmp/pinned-ab; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
for bin in $BINS; do
  rm -rf /tmp/o; one offload-$bin 120 ./$bin --device frugal-cuda --model reference --budget 2024091649 \
    --evict offload --keep-micro-batch --steps 8 --save-minutes 0 --out /tmp/o
  cp /tmp/o/steps.json $R/steps-offload-$bin.json 2>/dev/null
done
for bin in $BINS; do
  rm -rf /tmp/o; one capped-$bin ${LIMIT:-200} ./$bin --device frugal-cuda --model 1b --memory-cap 79GiB \
    --budget auto --steps ${STEPS:-3} --save-minutes 0 --out /tmp/o
  cp /tmp/o/steps.json $R/steps-capped-$bin.json 2>/dev/null
done
tar czf $OUT/pinned-ab.tgz -C /tmp pinned-ab
for f in $R/capped-*.out $R/offload-*.out; do echo "== $f"; grep -v "^|" $f | grep -v "^ *$" | cut -c1-200 | sed -n '3,5p;/offload/p;/first step/p'; done
python3 -c "import json,sys
for n in sys.argv[1:]:
  for s in json.load(open(n)):
    r=s['remat']; print(n.split('steps-')[1], s['step'], round(s['step_ms']), s['micro_batches'], r['offloaded_bytes'], round(r['offload_nanos']/1e6), r['offload_batches'], round(r['upload_nanos']/1e6), r['peak_host_bytes'])" $R/steps-*.json
tail -qn1 $R/torch_*.out | cut -c1-200; cat $R/summary.txt
