#!/usr/bin/env bash
# Which kernels a first process compiles in each step: `burn-nn-models` ARGS... from empty
# caches in /tmp/cn, with CubeCL's compilation log at its basic level (one line per kernel,
# its name) on stderr beside the bench's step lines; then the names counted per step. LIMIT
# (default 200) bounds the process. Staged in .gpu/: burn-nn-models.xz.
set -u
cd "$(dirname "$0")"
[ -x burn-nn-models ] || python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" burn-nn-models.xz burn-nn-models
chmod +x burn-nn-models; B=$(pwd)/burn-nn-models
R=$OUT/names; mkdir -p $R
rm -rf /tmp/cn; mkdir -p /tmp/cn/run/home
printf '[compilation.logger]\nlevel = "basic"\nstderr = true\n' > /tmp/cn/cubecl.toml
cd /tmp/cn/run
HOME=/tmp/cn/run/home FRUGAL_CUDA_KERNEL_CACHE=/tmp/cn/kernels timeout ${LIMIT:-200} $B "$@" > $R/run.out 2> $R/run.err
echo "exit $?" | tee $R/summary.txt
python3 - $R/run.err <<'PY' | tee -a $R/summary.txt
import re, sys, collections
step, counts = 0, collections.defaultdict(collections.Counter)
for line in open(sys.argv[1], errors='replace'):
    m = re.match(r'step (\d+):', line)
    if m: step = int(m.group(1)) + 1; continue
    if '[Compiling kernel]' in line:
        counts[step][line.split('[Compiling kernel]')[1].strip()[:90]] += 1
for s in sorted(counts):
    print(f'before the end of step {s}: {sum(counts[s].values())} kernels')
    if s >= 3:
        for n, c in counts[s].most_common(12): print(f'   {c:4d} {n}')
PY
