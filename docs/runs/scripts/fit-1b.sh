#!/usr/bin/env bash
# Issue 53 goal 1 on one 80 GB GPU: the 1.2 B model with `--budget auto --fit` (the probes'
# memory after each one in the debug log: the ledger's live bytes and frugal-cuda's pool),
# then `--budget auto` alone (the split), each its own process with its own limit, PyTorch's
# anchors first. Logs go to $R (/tmp/fit-1b) and come back as one $OUT/fit-1b.tgz, the
# steps printed last; gpt's --out folders stay on the machine (their memory traces are
# gigabytes). The device tool returns only a handful of files: keep $OUT to a few.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
anchors ${ANCHOR_LIMITS:-45 75}
R=/tmp/fit-1b; rm -rf $R; mkdir -p $R
trap 'tar czf $OUT/fit-1b.tgz -C /tmp fit-1b' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
export RUST_LOG="error,gpt=debug,frugal::training::fit=debug,frugal=warn,frugal_cuda=warn"
for run in ${RUNS:-fit split}; do
  case $run in
    fit) flags="--budget auto --fit"; limit=${FIT_LIMIT:-280}; steps=${FIT_STEPS:-3} ;;
    split) flags="--budget auto"; limit=${SPLIT_LIMIT:-170}; steps=${SPLIT_STEPS:-8} ;;
  esac
  one $run $limit ./gpt --device frugal-cuda --model 1b $flags --steps $steps \
    --save-minutes 0 --out /tmp/o-$run
  cp /tmp/o-$run/steps.json $R/steps-$run.json 2>/dev/null
done
tar czf $OUT/kernel-cache.tgz -C ../target frugal-cuda-kernels 2>/dev/null
for f in $R/*.out; do echo "== $f"; grep -v "^|" $f | cut -c1-200 | head -45; done
grep -h "auto-fit probe\|--fit:\|gave back" $R/*.err | cut -c1-300 | head -60
for f in $R/steps-*.json; do echo "== $f"; python3 -c "
import json, sys
for s in json.load(open(sys.argv[1])):
    print(s['step'], round(s['step_ms'], 1), 'ms', s['micro_batches'], 'micro-batches, peak', s['peak_bytes'], 'B, loss', round(s['loss'], 4))
" $f; done
cat $R/summary.txt $OUT/anchors/summary.txt
