#!/usr/bin/env bash
# Issue 4, second call: one child per configuration with its own time limit, so that a slow
# budgeted configuration does not hide the others. Budgets are fractions of the unconstrained
# peak live bytes measured in the previous call (8,096,366,596 B, identical in every call).
set -u
cd "$(dirname "$0")"
for f in peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
PEAK=8096366596
one() { # name limit steps warmup [budget]
  local t0=$(date +%s)
  local extra=""; [ -n "${5:-}" ] && extra="--budget-bytes $5"
  timeout $2 ./peak-memory --device cuda --only $1 --steps $3 --warmup $4 $extra > $OUT/$(echo $1 | tr / _).json 2> $OUT/$(echo $1 | tr / _).err
  echo "$1 exit $? in $(( $(date +%s) - t0 )) s"; tail -c 600 $OUT/$(echo $1 | tr / _).err
}
one plain 70 4 2
one budget-1/3 210 3 1 $((PEAK / 3))
one budget-1/2 110 3 1 $((PEAK / 2))
one frugal-scopes 80 4 2
one burn-balanced 80 4 2
