#!/usr/bin/env bash
# Issue 19 on the GPU: out-of-memory on frugal-cuda and burn-cuda, --budget auto, recovery under
# frugal-cuda's cap. RUNS: name:limit_s:device:args (args comma-separated); TEST=1 runs the
# device_out_of_memory test binary first. Each run's stdout+stderr goes to $OUT/<name>.txt.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
[ -f nv-cache.tgz ] && (cd ~ && tar xzf "$OLDPWD/nv-cache.tgz")
for f in peak-memory gpt device_out_of_memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TEST:-}" ] && [ -f device_out_of_memory ]; then
  t0=$(date +%s)
  timeout ${TEST_LIMIT:-120} ./device_out_of_memory --nocapture > $OUT/test.txt 2>&1
  echo "device_out_of_memory test exit $? in $(( $(date +%s) - t0 )) s"; tail -5 $OUT/test.txt
fi
for run in ${RUNS:-}; do
  IFS=: read -r name limit dev args <<< "$run"; args=${args//,/ }
  t0=$(date +%s)
  timeout $limit ./gpt --device $dev --out $OUT/$name $args > $OUT/$name.txt 2>&1
  code=$?
  echo "== $name ($dev $args): exit $code in $(( $(date +%s) - t0 )) s, $(wc -l < $OUT/$name.txt) lines of output; grep -c 'panicked' = $(grep -c panicked $OUT/$name.txt)"
  grep -v '^\s*$' $OUT/$name.txt | head -${LINES_SHOWN:-14} | cut -c1-400
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
du -sh ~/.nv 2>/dev/null
