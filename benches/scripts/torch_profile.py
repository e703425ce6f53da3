#!/usr/bin/env python3
"""Device time of PyTorch's reference GPT step by kind of work, beside `peak-memory
--profile-kernels` (run on the same machine in the same call).

Runs the model of torch_gpt.py (which must sit beside this file or on PYTHONPATH) in one of
torch_best.py's configurations, profiles --steps steps after --warmup with torch.profiler, and
prints one JSON line: per step, the device time of each class of kernel (products, attention,
element-wise, reductions and norms, casts, optimizer, loss and softmax, copies, other), the
device's idle time between kernels, the 20 longest kernels, and the median step.
"""
import argparse, json, os, sys, time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch._functorch.config
import torch.nn.functional as F
from torch_gpt import Gpt

CONFIGS = {
    "fp32_math": dict(amp=False, math=True, compile=False, budget=None, fused=False),
    "bf16_sdpa_fusedadam": dict(amp=True, math=False, compile=False, budget=None, fused=True),
    "bf16_compile": dict(amp=True, math=False, compile=True, budget=None, fused=True),
    "bf16_compile_amb20": dict(amp=True, math=False, compile=True, budget=0.2, fused=True),
}


def kernel_class(name):
    """The kind of work a CUDA kernel does, from its name (cuBLAS, cuDNN, Triton, ATen)."""
    n = name.lower()
    has = lambda *words: any(w in n for w in words)
    if has("memcpy", "memset"):
        return "copies"
    if has("flash", "fmha", "attention", "sdpa", "efficient_attention"):
        return "attention"
    if has("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "ampere_", "hopper", "cublas", "matmul", "nvjet"):
        return "products"
    if has("adam", "multi_tensor", "fused_optim"):
        return "optimizer"
    if has("cross_entropy", "nll_loss", "softmax", "log_softmax"):
        return "loss and softmax"
    if has("layer_norm", "layernorm", "reduce", "norm", "welford", "sum"):
        return "reductions and norms"
    if has("copy_kernel", "to_copy", "cast", "convert"):
        return "casts"
    if has("triton", "elementwise", "vectorized", "unrolled", "gelu", "add", "mul", "fill"):
        return "element-wise"
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in dict(batch=8, seq=512, layers=12, d=768, heads=12, vocab=8192, steps=5, warmup=6).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--config", default="bf16_compile_amb20", choices=list(CONFIGS))
    a = p.parse_args()
    cfg = CONFIGS[a.config]
    if cfg["budget"] is not None:
        torch._functorch.config.activation_memory_budget = cfg["budget"]
    torch.manual_seed(0)
    model = Gpt(a.vocab, a.d, a.heads, a.layers, a.seq, cfg["math"], False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cfg["fused"])

    def forward(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg["amp"]):
            logits = model(x)
        return F.cross_entropy(logits.view(-1, a.vocab).float(), y.view(-1))

    fstep = torch.compile(forward) if cfg["compile"] else forward

    def step():
        x = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        y = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        loss = fstep(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    from torch.profiler import profile, ProfilerActivity

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            t0 = time.time()
            step()
            torch.cuda.synchronize()
            times.append(time.time() - t0)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = defaultdict(lambda: [0, 0.0])
    spans = []
    for e in kernels:
        by_name[e.name][0] += 1
        by_name[e.name][1] += (e.time_range.end - e.time_range.start) / 1e3  # us to ms
        spans.append((e.time_range.start, e.time_range.end))
    spans.sort()
    idle_us, end = 0.0, None
    for start, stop in spans:
        if end is not None and start > end:
            idle_us += start - end
        end = stop if end is None else max(end, stop)
    classes = defaultdict(lambda: [0, 0.0])
    for name, (count, ms) in by_name.items():
        c = classes[kernel_class(name)]
        c[0] += count
        c[1] += ms
    per = 1.0 / a.steps
    times.sort()
    out = dict(
        system="torch", config=a.config, device=torch.cuda.get_device_name(), version=torch.__version__,
        steps=a.steps, step_ms_median=times[len(times) // 2] * 1e3,
        busy_ms=sum(ms for _, ms in by_name.values()) * per,
        idle_ms=idle_us / 1e3 * per,
        launches=sum(c for c, _ in by_name.values()) * per,
        classes=sorted(({"class": k, "ms": v[1] * per, "launches": v[0] * per} for k, v in classes.items()),
                       key=lambda r: -r["ms"]),
        kernels=sorted(({"name": k[:160], "class": kernel_class(k), "ms": v[1] * per, "launches": v[0] * per}
                        for k, v in by_name.items()), key=lambda r: -r["ms"])[:40],
    )
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
