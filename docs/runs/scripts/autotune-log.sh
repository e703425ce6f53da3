#!/usr/bin/env bash
# First processes with empty caches and CubeCL's autotune log on (a cubecl.toml in the working
# directory): which autotune keys a first step tunes. Arguments: tag:limit_s:flags.
set -u
cd "$(dirname "$0")"
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" $1.xz $1 && chmod +x $1; }
[ -x burn-nn-models ] || unxz burn-nn-models
B=$(pwd)/burn-nn-models
R=$OUT/autotune; mkdir -p $R
for spec in "$@"; do
  IFS=: read -r tag limit more <<< "$spec"
  rm -rf /tmp/d-$tag; mkdir -p /tmp/d-$tag/home && cd /tmp/d-$tag
  printf '[autotune.logger]\nlevel = "full"\nfile = "%s"\n' "$R/$tag.log" > cubecl.toml
  t0=$(date +%s)
  env HOME=/tmp/d-$tag/home FRUGAL_CUDA_KERNEL_CACHE=/tmp/d-$tag/kernels \
    timeout $limit $B $more > $R/$tag.out 2> $R/$tag.err
  echo "$tag: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
  ls -R /tmp/d-$tag/target/autotune > $R/$tag.cache-files.txt 2>&1
  cd - > /dev/null
done
