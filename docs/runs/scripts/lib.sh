# Shared by the GPU scripts staged in .gpu/ beside it (`. ./lib.sh` after `cd` there):
# the kernel cache carried between calls, .xz binaries unpacked, and `one NAME LIMIT CMD...`,
# which runs one process with its own time limit into $R/NAME.out and .err and logs its exit
# status to $R/summary.txt. Set R before calling `one`.
export FRUGAL_CUDA_KERNEL_CACHE=$(cd .. && pwd)/target/frugal-cuda-kernels
mkdir -p ../target
[ -d ../target/frugal-cuda-kernels ] || tar xzf cubecl-cache.tgz -C ../target
# unxz NAME...: NAME.xz to NAME, executable.
unxz_bins() {
  for f in "$@"; do
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], \"wb\"))" $f.xz $f && chmod +x $f
  done
}
one() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit "$@" > $R/$name.out 2> $R/$name.err
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a $R/summary.txt; }
# anchors [LIMIT_EAGER [LIMIT_COMPILE]]: PyTorch eager fp32_math and torch.compile with its
# activation memory budget, each in its own process, into $OUT/anchors; prints their medians.
anchors() { R=$OUT/anchors; mkdir -p $R
  one torch_gpt ${1:-60} python3 torch_gpt.py --configs fp32_math
  one torch_best ${2:-90} python3 torch_best.py --configs bf16_compile_amb20
  grep -ho '"step_ms_median": [0-9.]*' $R/torch_*.out; }
