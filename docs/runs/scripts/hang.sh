#!/usr/bin/env bash
# Where a run that stops making progress waits: starts `gpt ARGS` (env ARGS) in the background
# with RUST_LOG=frugal=debug, and after WAIT seconds dumps each thread's name and kernel wait
# channel and, where gdb is installed, every thread's backtrace (an unstripped gpt names the
# functions); then kills it. Everything lands in $OUT/hang-$TAG.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
R=/tmp/hang; rm -rf $R; mkdir -p $R
RUST_LOG=${LOG:-frugal=debug,frugal_cuda=debug} ./gpt $ARGS > $R/gpt.out 2> $R/gpt.err &
PID=$!
sleep ${WAIT:-100}
{
  for t in /proc/$PID/task/*; do
    echo "$(basename $t) $(cat $t/comm) $(cat $t/wchan 2>/dev/null) $(awk '{print $3, $14, $15}' $t/stat)"
  done
} > $R/threads.txt
which gdb > $R/tools.txt 2>&1; which eu-stack >> $R/tools.txt 2>&1
if which gdb > /dev/null 2>&1; then
  timeout 60 gdb -p $PID -batch -ex "thread apply all bt 30" > $R/gdb.txt 2>&1
elif which eu-stack > /dev/null 2>&1; then
  timeout 60 eu-stack -p $PID > $R/gdb.txt 2>&1
fi
nvidia-smi > $R/nvidia-smi.txt 2>&1
kill -9 $PID
wc -l $R/gpt.err > $R/lines.txt
tail -300 $R/gpt.err > $R/gpt-err-tail.txt
head -100 $R/gpt.err > $R/gpt-err-head.txt
rm $R/gpt.err
tar czf $OUT/hang-${TAG:-a}.tgz -C /tmp hang
cat $R/tools.txt $R/lines.txt; cut -c1-160 $R/threads.txt | head -60
