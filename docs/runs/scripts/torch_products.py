#!/usr/bin/env python3
"""PyTorch's twin of Frugal's `products-throughput` bench: the reference GPT step's matrix
products (12 layers of 768->2304, 768->768, 768->3072, 3072->768 and the 768->8192 head, over
4,096 tokens; each as x @ W, g @ W.T and x.T @ g) with torch.matmul, all queued, then synced;
median of wall-clock times after warm-up, as the Rust bench times its step. Rows: bf16, f16,
f32 strict (allow_tf32 off, PyTorch's default for matmul) and f32 with TF32. One JSON line per
row."""
import argparse, json, statistics, time
import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    linears = [(a.tokens, k, n) for _ in range(a.layers)
               for (k, n) in [(768, 2304), (768, 768), (768, 3072), (3072, 768)]]
    linears.append((a.tokens, 768, 8192))
    flops = sum(3 * 2 * m * k * n for (m, k, n) in linears)
    for name, dtype, tf32 in [("bf16", torch.bfloat16, False), ("f16", torch.float16, False),
                              ("f32", torch.float32, False), ("f32-tf32", torch.float32, True)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ops = {}
        for s in set(linears):
            m, k, n = s
            ops[s] = tuple(torch.rand(shape, device="cuda", dtype=dtype) - 0.5
                           for shape in [(m, k), (k, n), (m, n)])

        def step():
            for s in linears:
                x, w, g = ops[s]
                torch.matmul(x, w)
                torch.matmul(g, w.t())
                torch.matmul(x.t(), g)
            torch.cuda.synchronize()

        for _ in range(a.warmup):
            step()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        print(json.dumps({"bench": "torch-products", "dtype": name, "step_ms": sec * 1e3,
                          "tflops": flops / sec / 1e12, "products_per_step": 3 * len(linears)}),
              flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
