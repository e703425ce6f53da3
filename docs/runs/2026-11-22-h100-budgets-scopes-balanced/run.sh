#!/usr/bin/env bash
# Issue 4, one device call: PyTorch's twin (checkpointing configs), then the peak-memory bench
# with Frugal's budgets (1/2, 1/3, 1/4 of the unconstrained peak live bytes), checkpoint scopes
# and Burn's BalancedCheckpointing, with the torch lines beside it.
set -u
cd "$(dirname "$0")"
for f in gpt peak-memory; do [ -f $f.gz ] && gunzip -kf $f.gz && chmod +x $f; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
PYTHONUNBUFFERED=1 timeout 150 python3 torch_gpt.py --configs fp32_math_ckpt,bf16_sdpa_ckpt > $OUT/torch.jsonl 2>&1
tail -3 $OUT/torch.jsonl
timeout 420 ./peak-memory --device cuda --steps 5 --warmup 2 --configs ${CONFIGS:-plain,frugal,budget-1/3,frugal-scopes,budget-1/2,budget-1/4,budget-1/3-scopes,burn-balanced} --torch $OUT/torch.jsonl --chart $OUT/peak-memory-budget.png 2>&1 | tee $OUT/burn.txt | grep -v '^{'
echo "bench exit: ${PIPESTATUS[0]}"
