#!/usr/bin/env bash
# Kernel time per phase of the last step, from CubeCL's own profiler (each kernel timed on the
# device, one sync per launch): CONFIGS="name[:flags]" ...
set -u
cd "$(dirname "$0")"
[ -f cubecl-cache.tgz ] && (cd .. && tar xzf .gpu/cubecl-cache.tgz)
gunzip -kf peak-memory.gz && chmod +x peak-memory
mkdir -p prof && cd prof
cat > cubecl.toml <<'T'
[profiling.logger]
level = "basic"
file = "profile.log"
append = true
T
for spec in $CONFIGS; do
  IFS=: read -r name extra <<< "$spec"
  rm -f profile.log
  timeout 150 ../peak-memory --device cuda $extra --only $name --steps 3 --warmup 2 > /dev/null 2> err.txt
  echo "== $name $extra exit $?"; grep step err.txt | tr "\n" " "; echo
  f=$OUT/prof-$(echo $name$extra | tr -c 'a-z0-9-' _).txt
  python3 - profile.log > $f <<'PY'
import sys, re
text = open(sys.argv[1], encoding='utf-8', errors='replace').read()
blocks = re.findall(r'\|⎺+\| \n(.*?)\|⎯+\| ', text, re.S)
print(len(blocks), 'summaries')
for b in blocks[-5:]:
    rows = [r for r in b.splitlines() if r.startswith('| ')]
    total = [r for r in rows if r.startswith('| Total')]
    print('TOTAL', total)
    for r in rows[1:30]:
        cells = [c.strip() for c in r.strip('|').split(' | ')]
        print(cells[0][:110], '|', ' | '.join(cells[1:]))
PY
  head -c 9000 $f
done
