#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
R=/tmp/pin; rm -rf $R; mkdir -p $R
timeout 200 python3 pin-threads.py 2>&1 | tee $R/pin.out
for conf in "pinned_use_cuda_host_register:True,pinned_num_register_threads:8" "pinned_use_cuda_host_register:True,pinned_num_register_threads:16"; do
  echo "== $conf"; PYTORCH_CUDA_ALLOC_CONF=$conf timeout 100 python3 pinned-probe.py 2>&1 | head -4
done | tee -a $R/pin.out
tar czf $OUT/pin.tgz -C /tmp pin
