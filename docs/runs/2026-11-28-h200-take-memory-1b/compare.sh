#!/usr/bin/env bash
# The 1.2 B model's losses after an in-process retry, against a run that used the smaller
# micro-batch from that step: steps 0-2 at 16 x 4, checkpoint, then steps 3-5 at 8 x 8.
set -u
cd "$(dirname "$0")"
gunzip -kf gpt.gz && chmod +x gpt
export FRUGAL_CUDA_KERNEL_CACHE=/tmp/kcache
R=/tmp/r51c; rm -rf $R /tmp/cmp; mkdir -p $R
t0=$(date +%s)
timeout 200 ./gpt --device frugal-cuda --model 1b --accumulate 4 --steps 3 --save-minutes 0 --out /tmp/cmp > $R/first.txt 2>&1
echo "first: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
t0=$(date +%s)
timeout 200 ./gpt --device frugal-cuda --model 1b --accumulate 8 --steps 6 --save-minutes 0 --resume --out /tmp/cmp > $R/second.txt 2>&1
echo "second: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt
cp /tmp/cmp/steps.json $R/steps-cmp.json
tar czf $OUT/r51c.tgz -C /tmp r51c
grep -v "^|" $R/second.txt | head -12
python3 -c "
import json; s=json.load(open('$R/steps-cmp.json')); print([(x['step'], x['loss'], x['micro_batches']) for x in s])"
