#!/usr/bin/env python3
"""Where a kernel's compilation time goes: the CUDA sources frugal-cuda compiled (CubeCL's
compilation log, `CUBECL_DEBUG_LOG=FILE`), compiled again through NVRTC (ctypes) with option
variants, one after another and on a thread pool. Prints one JSON line per variant.

Usage: nvrtc-bench.py LOG [--limit N] [--threads T]
"""
import argparse, ctypes, ctypes.util, glob, json, os, re, statistics, time
from concurrent.futures import ThreadPoolExecutor

p = argparse.ArgumentParser()
p.add_argument("log")
p.add_argument("--limit", type=int, default=40)
p.add_argument("--threads", type=int, default=16)
p.add_argument("--arch", default="90a")
p.add_argument("--cuda", default=os.environ.get("CUDA_PATH", "/usr/local/cuda"))
a = p.parse_args()

text = open(a.log, errors="replace").read()
sources, names = [], []
for m in re.finditer(r"\[START_KERNEL_COMPILATION\](.*?)source:\n```[a-z]*\n(.*?)\n```\n\[END_KERNEL_COMPILATION\]", text, re.S):
    head, src = m.group(1), m.group(2)
    name = re.search(r"name: (.*)", head)
    names.append(name.group(1)[:80] if name else "?")
    sources.append(src)
print(json.dumps({"kernels_in_log": len(sources), "distinct": len(set(sources))}), flush=True)
seen, picked = set(), []
for n, s in zip(names, sources):
    if s not in seen:
        seen.add(s)
        picked.append((n, s))
picked = picked[: a.limit]

cands = glob.glob(f"{a.cuda}/lib64/libnvrtc.so*") + glob.glob(f"{a.cuda}/targets/*/lib/libnvrtc.so*")
lib_path = next((c for c in sorted(cands) if "builtins" not in c), None) or ctypes.util.find_library("nvrtc")
nv = ctypes.CDLL(lib_path)
major, minor = ctypes.c_int(), ctypes.c_int()
nv.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
print(json.dumps({"nvrtc": lib_path, "version": f"{major.value}.{minor.value}"}), flush=True)


def compile_one(src, options):
    prog = ctypes.c_void_p()
    r = nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None)
    assert r == 0, r
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    t0 = time.perf_counter()
    r = nv.nvrtcCompileProgram(prog, len(options), opts)
    dt = time.perf_counter() - t0
    log = b""
    if r != 0:
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, buf)
        log = buf.value[:300]
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return dt, r, log


inc = [f"--include-path={a.cuda}/include"]
if os.path.isdir(f"{a.cuda}/include/cccl"):
    inc.append(f"--include-path={a.cuda}/include/cccl")
base = [f"--gpu-architecture=sm_{a.arch}"] + inc + ["-lineinfo"]
variants = {
    "base": base,
    "no-lineinfo": [o for o in base if o != "-lineinfo"],
    "ptx-only": [f"--gpu-architecture=compute_{a.arch}"] + inc + ["-lineinfo"],
    "pch": base + ["--pch"],
    "ptxas-O1": base + ["--ptxas-options=-O1"],
    "ptxas-O0": base + ["--ptxas-options=-O0"],
    "dopt-off": base + ["--dopt=off"],
}
# Warm NVRTC's own start (library load, first program) outside the timings.
compile_one(picked[0][1], base)
for label, options in variants.items():
    times, fails = [], []
    t0 = time.perf_counter()
    for n, s in picked:
        dt, r, log = compile_one(s, options)
        times.append(dt)
        if r:
            fails.append((n, r, log.decode(errors="replace")))
    seq = time.perf_counter() - t0
    print(json.dumps({"variant": label, "kernels": len(picked), "sequential_s": round(seq, 2),
                      "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                      "failures": len(fails), "first_failure": fails[0] if fails else None}), flush=True)
for label in ["base", "pch"]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as ex:
        list(ex.map(lambda ns: compile_one(ns[1], variants[label]), picked))
    print(json.dumps({"variant": label, "threads": a.threads, "kernels": len(picked),
                      "wall_s": round(time.perf_counter() - t0, 2)}), flush=True)
# The slowest kernels by name under the base options.
slow = sorted(((compile_one(s, base)[0], n) for n, s in picked[:20]), reverse=True)[:8]
print(json.dumps({"slowest_base": [(round(t, 3), n) for t, n in slow]}), flush=True)
