#!/usr/bin/env bash
# Where a budget's offload time goes on frugal-cuda: host-memory costs (pinned-probe.py), then
# the 1.2 B model under --budget auto and an 80 GB cap, its device time by kernel and copy.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
R=/tmp/probe; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
one pinned 120 python3 pinned-probe.py
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
rm -rf /tmp/o-cap
one capped ${LIMIT:-240} ./gpt --device frugal-cuda --model 1b --memory-cap 79GiB --budget auto \
  --steps ${STEPS:-2} --save-minutes 0 --profile-kernels --out /tmp/o-cap
cp /tmp/o-cap/steps.json $R/steps-capped.json 2>/dev/null
rm -rf /tmp/o-off
one offload 180 ./gpt --device frugal-cuda --model reference --budget 2024091649 --evict offload \
  --keep-micro-batch --steps 8 --save-minutes 0 --out /tmp/o-off
cp /tmp/o-off/steps.json $R/steps-offload.json 2>/dev/null
tar czf $OUT/probe.tgz -C /tmp probe
cat $R/pinned.out; for f in capped offload; do grep -v "^|" $R/$f.out | cut -c1-240 | head -30; grep -v compiling $R/$f.err | tail -4; done
python3 -c "import json,sys
for n in sys.argv[1:]:
  for s in json.load(open(n)):
    r=s['remat']; print(n[-20:], s['step'], round(s['step_ms']), s['micro_batches'], r['offloaded_bytes'], round(r['offload_nanos']/1e6), r['offload_batches'], round(r['upload_nanos']/1e6))" $R/steps-*.json
tail -3 $R/torch_*.out; cat $R/summary.txt
