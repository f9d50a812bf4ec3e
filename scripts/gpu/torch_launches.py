#!/usr/bin/env python3
"""Make a known number of kernel launches through PyTorch (runtime API).

Warm up first (so lazy module loading and allocator set-up are done), print
`ready`, wait for a line on stdin, then launch N element-wise kernels and
print `launched N`.
"""
import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
x = torch.zeros(1024, device="cuda")
for _ in range(10):
    x.add_(1.0)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    x.add_(1.0)  # one vectorized elementwise kernel per call
torch.cuda.synchronize()
print(f"launched {n}", flush=True)
