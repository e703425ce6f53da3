#!/usr/bin/env bash
# Memory taken mid-run (--take-memory STEP:LEAVE): reference size on frugal-cuda and
# burn-cuda with checkpoints every 3 s; PyTorch beside. Everything lands in one tarball.
set -u
cd "$(dirname "$0")"
gunzip -kf gpt.gz && chmod +x gpt
export FRUGAL_CUDA_KERNEL_CACHE=/tmp/kcache
R=/tmp/r51; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt
one() { # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.txt 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s, $(wc -l < $R/$name.txt) lines, $(wc -c < $R/$name.txt) bytes" | tee -a $R/summary.txt
}
if [ -z "${SKIP_TORCH:-}" ]; then
one torch_gpt 120 python3 torch_gpt.py --configs fp32_math
one torch_best 150 python3 torch_best.py --configs bf16_compile_amb20
fi
TAKE=${TAKE:-60:2GiB}
for dev in ${DEVS:-frugal-cuda cuda}; do
  rm -rf /tmp/$dev
  one take-$dev ${LIMIT:-240} ./gpt --device $dev --model ${MODEL:-reference} --steps ${STEPS:-90} --save-minutes ${SAVE:-0.05} --take-memory $TAKE ${EXTRA:-} --out /tmp/$dev
  cp /tmp/$dev/steps.json $R/steps-take-$dev.json 2>/dev/null
  ls -la --time-style=+%T /tmp/$dev/checkpoints > $R/checkpoints-$dev.txt 2>&1
done
tar czf $OUT/r51-${TAG:-a}.tgz -C /tmp r51
for f in $R/take-*.txt; do echo "== $f"; grep -v "^|" $f | cut -c1-260 | head -30; done
cat $R/summary.txt
