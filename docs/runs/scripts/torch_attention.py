#!/usr/bin/env python3
"""PyTorch's attention alone on the reference shapes, the twin of Frugal's
`attention-throughput` bench: SDPA (`F.scaled_dot_product_attention`, causal) and the
written-out attention (matmul, mask, softmax, matmul), forward and forward + backward, in f32
and bf16. Median of CUDA-event timings after warm-up; one JSON line per row. TF32 stays off
(PyTorch's default for matmul), as in torch_gpt.py's fp32 rows."""
import argparse, json, statistics
import torch
import torch.nn.functional as F


def written_out(q, k, v):
    s = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    fwd_flops = 4 * a.batch * a.heads * a.seq * a.seq * a.head_dim * 0.5
    for dtype_name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        for impl_name, impl in [("sdpa", sdpa), ("written-out", written_out)]:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, go = (torch.rand(shape, generator=g, device="cuda", dtype=dtype) - 0.5 for _ in range(4))
            q.requires_grad_(); k.requires_grad_(); v.requires_grad_()

            def fwd():
                with torch.no_grad():
                    impl(q, k, v)

            def fwd_bwd():
                out = impl(q, k, v)
                torch.autograd.grad(out, (q, k, v), go)

            for pass_name, fn, flops in [("forward", fwd, fwd_flops), ("forward+backward", fwd_bwd, fwd_flops * 3.5)]:
                ms = time_ms(fn, a.reps, a.warmup)
                print(json.dumps({"bench": "torch-attention", "device": torch.cuda.get_device_name(),
                                  "impl": impl_name, "dtype": dtype_name, "pass": pass_name,
                                  "shape": list(shape), "causal": True, "median_ms": ms,
                                  "ms_for_layers": ms * a.layers, "layers": a.layers,
                                  "tflops": flops / (ms / 1e3) / 1e12}))


if __name__ == "__main__":
    main()
