#!/usr/bin/env bash
# Trial splits (MicroBatching's TRIAL_RECOMPUTE_RATIO): the 1.2 B model under --budget auto
# and an 80 GB cap (`split`) against --accumulate 8 and 4 without a budget (`acc8`, `acc4`,
# the split --fit chose on an 80 GB H100), and the reference model plain, at 1/3 and at 1/4
# of its peak (`ref`, `ref3`, `ref4`: the trial must not slow them); PyTorch's anchors first.
# Each run its own process and limit; logs come back as $OUT/trial-split.tgz, the steps
# printed last. RUNS picks runs; STEPS_1B, STEPS_REF their steps. `cref`, `cref3`, `cref4`:
# the reference runs on `--device cuda` (burn-cuda, Burn's fusion).
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
anchors ${ANCHOR_LIMITS:-45 75}
R=/tmp/trial-split; rm -rf $R; mkdir -p $R
trap 'tar czf $OUT/trial-split.tgz -C /tmp trial-split' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
export RUST_LOG="error,gpt=info"
for run in ${RUNS:-split acc8 acc4 ref ref3 ref4}; do
  big="--model 1b --memory-cap 79GiB"
  ref="--model reference --steps ${STEPS_REF:-16}"
  case $run in
    split) flags="$big --budget auto --steps ${STEPS_1B:-14}"; limit=190 ;;
    acc8) flags="$big --accumulate 8 --steps 4"; limit=60 ;;
    acc4) flags="$big --accumulate 4 --steps 4"; limit=60 ;;
    ref|cref) flags="$ref"; limit=45 ;;
    ref3|cref3) flags="$ref --budget 2698788865"; limit=50 ;;
    ref4|cref4) flags="$ref --budget 2024091649"; limit=50 ;;
  esac
  # burn-cuda compiles every kernel again in each process.
  case $run in c*) limit=${CUDA_LIMIT:-100} ;; esac
  device=frugal-cuda; case $run in c*) device=cuda ;; esac
  rm -rf /tmp/o-$run
  one $run $limit ./gpt --device $device $flags --save-minutes 0 --out /tmp/o-$run
  cp /tmp/o-$run/steps.json $R/steps-$run.json 2>/dev/null
done
tar czf $OUT/kernel-cache.tgz -C ../target frugal-cuda-kernels 2>/dev/null
grep -H "^step [0-9]*: " $R/*.out | cut -c1-240 | head -20
for f in $R/steps-*.json; do echo "== $f"; python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
print(' '.join(f\"{x['step_ms']:.0f}/{x['micro_batches']}\" for x in s))
print('peak', max(x['peak_bytes'] for x in s), 'loss', round(s[-1]['loss'], 4))
" $f; done
cat $R/summary.txt $OUT/anchors/summary.txt
