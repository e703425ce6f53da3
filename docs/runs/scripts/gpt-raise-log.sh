#!/usr/bin/env bash
# The gpt example's reference step at 1/3 and 1/4 with frugal-cuda's debug log: each raise of
# the growth limit names the device's wait for misses in the step it judged, and that step's
# length. Staged in .gpu/: gpt.xz, lib.sh, cubecl-cache.tgz.
set -u
cd "$(dirname "$0")"
. ./lib.sh
unxz_bins gpt
R=$OUT/runs; mkdir -p $R
export RUST_LOG="error,gpt=info,frugal_cuda=debug"
for run in ref3 ref4; do
  case $run in
    ref3) b=2698788865 ;;
    ref4) b=2024091649 ;;
  esac
  one gpt-$run 90 ./gpt --device frugal-cuda --model reference --steps 24 --budget $b --save-minutes 0 --out /tmp/o-$run
  grep -h "growth limit raised" $R/gpt-$run.err | sed "s/^/$run: /"
done
(cd $OUT && tar czf results.tgz runs && rm -rf runs)
