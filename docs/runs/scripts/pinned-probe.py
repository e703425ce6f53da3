# Host-memory costs on this machine: pinning fresh memory, and copies to the host into pinned
# and pageable buffers.
import time, torch
GiB = 1 << 30
dev = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
for label, size in [("1 GiB", GiB), ("256 MiB", GiB // 4), ("16 MiB", 16 << 20)]:
    n = max(1, (4 * GiB) // size)
    t = time.perf_counter(); bufs = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    alloc = time.perf_counter() - t
    t = time.perf_counter()
    for b in bufs: b.copy_(dev[:size], non_blocking=True)
    torch.cuda.synchronize(); d2h = time.perf_counter() - t
    t = time.perf_counter()
    for b in bufs: dev[:size].copy_(b, non_blocking=True)
    torch.cuda.synchronize(); h2d = time.perf_counter() - t
    t = time.perf_counter(); del bufs; free = time.perf_counter() - t
    gb = n * size / 1e9
    print(f"pinned {label} x{n}: alloc {gb/alloc:.2f} GB/s, d2h {gb/d2h:.2f} GB/s, h2d {gb/h2d:.2f} GB/s, free {free*1e3:.0f} ms")
t = time.perf_counter(); page = torch.empty(4 * GiB, dtype=torch.uint8); page.fill_(1); fill = time.perf_counter() - t
t = time.perf_counter(); page.copy_(dev); torch.cuda.synchronize(); d2h = time.perf_counter() - t
print(f"pageable 4 GiB: alloc+touch {4*GiB/1e9/fill:.2f} GB/s, d2h {4*GiB/1e9/d2h:.2f} GB/s")
