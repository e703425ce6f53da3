#!/usr/bin/env bash
# First processes with empty caches, each in its own folder and home directory, reporting how
# long their first step waited for kernels to compile and what made it wait (frugal-cuda's
# `compile_waits`); PyTorch's first steps beside. Every output tarred into $OUT/waits.tgz.
set -u
cd "$(dirname "$0")"
FINAL=$OUT
export OUT=/tmp/o; mkdir -p $OUT
bash cold-models.sh \
  "resnet-one:120::--model resnet --steps 8 --conv one-kernel" \
  "encoder:50::--model encoder --steps 8" \
  "resnet-auto:160::--model resnet --steps 6"
bash cold.sh "gpt:60::"
. ./lib.sh 2>/dev/null
anchors 90 110
for f in $OUT/cold/*.err; do echo "== $f"; grep "first step:" $f; done
grep -h "first step" $OUT/cold-gpt.out
for f in $OUT/cold/*.out; do python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(sys.argv[1].split('/')[-1], 'first %.1f s' % (d['first_step_ms']/1e3), 'compiled', d['first_step_compiled'], 'threads %.1f s' % d['first_step_compile_s'], 'waited %.1f s' % d['first_step_wait_s'], 'later', d['later_compiled'], 'median %.2f' % d['median_ms'])" $f; done
tar czf $FINAL/waits.tgz -C /tmp o
