#!/usr/bin/env bash
# Issue 19 on the GPU, item 3: frugal-cuda's out-of-memory handler answered by the budget.
# TESTS: test binaries to run first (each its own process, TEST_LIMIT s); RUNS:
# name:limit_s:device:args (args comma-separated). Each output goes to $OUT/<name>.txt.
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
for f in *.gz; do [ -f "$f" ] && [ "$f" != cubecl-cache.tgz ] && gunzip -kf "$f" && chmod +x "${f%.gz}"; done
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in ${TESTS:-}; do
  t0=$(date +%s)
  timeout ${TEST_LIMIT:-150} ./$t --nocapture > $OUT/$t.txt 2>&1
  echo "== test $t: exit $? in $(( $(date +%s) - t0 )) s"; grep -E "test result|handler calls|panicked|assert" $OUT/$t.txt | head -8 | cut -c1-400
done
for run in ${RUNS:-}; do
  IFS=: read -r name limit dev args <<< "$run"; args=${args//,/ }
  t0=$(date +%s)
  timeout $limit ./gpt --device $dev --out $OUT/$name $args > $OUT/$name.txt 2>&1
  code=$?
  rm -rf $OUT/$name/checkpoints $OUT/$name/step-memory.png
  echo "== $name ($dev $args): exit $code in $(( $(date +%s) - t0 )) s, $(wc -l < $OUT/$name.txt) lines; panicked: $(grep -c panicked $OUT/$name.txt)"
  grep -v '^\s*$' $OUT/$name.txt | tail -${LINES_SHOWN:-16} | cut -c1-500
done
(cd .. && tar czf $OUT/cubecl-cache.tgz target/autotune 2>/dev/null)
