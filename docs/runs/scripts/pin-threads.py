# Pinning host memory on this machine: cudaHostAlloc against touching pageable pages then
# cudaHostRegister, on one thread and on several (each pinning its own piece).
import ctypes, sys, threading, time
import numpy as np, torch
torch.cuda.init(); torch.empty(1, device="cuda")
rt = torch.cuda.cudart()
GiB = 1 << 30
TOTAL = 8 * GiB

def run_threads(n, work):
    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    return time.perf_counter() - t0

for n in (1, 4, 8, 16):
    piece = TOTAL // n
    keep = [None] * n
    def alloc(i):
        torch.cuda.set_device(0)
        keep[i] = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
    dt = run_threads(n, alloc)
    print(f"cudaHostAlloc via torch, {n} threads x {piece >> 20} MiB: {TOTAL/1e9/dt:.2f} GB/s", flush=True)
    del keep
    arrs = [None] * n; reg = [0.0] * n; touch = [0.0] * n
    def touch_register(i):
        torch.cuda.set_device(0)
        t0 = time.perf_counter()
        a = np.empty(piece, dtype=np.uint8); a[::4096] = 1
        t1 = time.perf_counter()
        err = rt.cudaHostRegister(a.ctypes.data, piece, 0)
        t2 = time.perf_counter()
        assert int(err) == 0, err
        arrs[i] = a; touch[i] = t1 - t0; reg[i] = t2 - t1
    dt = run_threads(n, touch_register)
    print(f"touch + cudaHostRegister, {n} threads x {piece >> 20} MiB: {TOTAL/1e9/dt:.2f} GB/s (touch {max(touch):.2f} s, register {max(reg):.2f} s)", flush=True)
    for a in arrs: rt.cudaHostUnregister(a.ctypes.data)
    del arrs
