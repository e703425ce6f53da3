#!/usr/bin/env bash
# Data parallelism on one host's GPUs: each configuration of the `ddp` example in its own
# process with its own time limit, beside PyTorch's one-GPU anchors (torch_gpt.py,
# torch_best.py), all in one call. Staged in .gpu/: ddp.gz, optionally collectives.gz
# (frugal-cuda's two-GPU test binary), torch_gpt.py, torch_best.py, and cubecl-cache.tgz if a
# call left one (frugal-cuda's kernel cache and CubeCL's autotune results).
# RUNS: tag:limit_s:ddp args (comma-separated; `+` stands for a comma inside a value),
# e.g. "two-b8:240:--devices,0+1,--batch,8".
set -u
cd "$(dirname "$0")"
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -f cubecl-cache.tgz ] && [ ! -d ../target/frugal-cuda-kernels ] && tar xzf cubecl-cache.tgz -C ../target
# CubeCL's autotune results live under the working directory's target/.
[ -f autotune.tgz ] && tar xzf autotune.tgz
for f in ddp collectives; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
# NCCL from PyTorch's wheel: cudarc looks for libnccl.so, the wheel has libnccl.so.2.
NCCL_LIB=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")/lib
mkdir -p /tmp/nccl && ln -sf $NCCL_LIB/libnccl.so.2 /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl:$NCCL_LIB:${LD_LIBRARY_PATH:-}
# Multicast is off on these machines.
export NCCL_NVLS_ENABLE=0
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
one() { # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
}
[ -x collectives ] && NCCL_DEBUG=WARN one collectives 90 ./collectives --test-threads 1 --nocapture
if [ -z "${SKIP_TORCH:-}" ]; then
  one torch_gpt 120 python3 torch_gpt.py --configs ${TORCH_GPT:-fp32_math}
  one torch_best 200 python3 torch_best.py --configs bf16_compile_amb20
fi
for spec in ${RUNS-}; do
  IFS=: read -r tag limit more <<< "$spec"
  args=${more//,/ }
  one ddp-$tag $limit ./ddp ${args//+/,}
done
tar czf $R/cubecl-cache.tgz -C ../target frugal-cuda-kernels 2>/dev/null
[ -d target/autotune ] && tar czf $R/autotune.tgz target/autotune
for f in $R/ddp-*.out; do
  python3 - "$f" <<'PY'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    sys.exit(0)
print(sys.argv[1].split('/')[-1][:-4], d['runtime'], 'gpus', len(d['devices']), 'global', d['global_batch'],
      'median', round(d['median_ms'], 2), 'ms', 'seq/s', round(d['sequences_per_s'], 1),
      'first', round(d['first_step_ms']), 'peak', d['peak_live'], 'last loss', round(d['losses'][-1], 6))
PY
done | tee -a $R/summary.txt
# Few files come back from a call: the logs travel as one archive.
(cd $R && tar czf logs.tgz *.out *.err && rm -f *.out *.err)
