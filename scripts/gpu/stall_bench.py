"""The stall case (scripts/gpu-check.sh stall): bf16 4096² matmuls.

  stall_bench.py flood               launches without ever synchronizing, so the
                                     driver's queue stays full; prints "flooding"
  stall_bench.py measure GO SECS     warms up, prints "ready", waits for the file
                                     GO, then runs for SECS seconds synchronizing
                                     every 5 matmuls; prints a JSON line with the
                                     rate (matmuls/s) of each 0.25 s window
"""
import json
import os
import sys
import time

import torch

a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

if sys.argv[1] == "flood":
    print("flooding", flush=True)
    n = 0
    t0 = time.perf_counter()
    while True:
        torch.mm(a, b)
        n += 1
        if n % 2000 == 0:
            print(f"queued {n} launches in {time.perf_counter() - t0:.1f} s", flush=True)
else:
    go, secs = sys.argv[2], float(sys.argv[3])
    torch.mm(a, b)
    torch.cuda.synchronize()
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    t0 = w0 = time.perf_counter()
    windows, n = [], 0
    while True:
        for _ in range(5):
            torch.mm(a, b)
        torch.cuda.synchronize()
        n += 5
        t = time.perf_counter()
        if t - w0 >= 0.25:
            windows.append(n / (t - w0))
            n, w0 = 0, t
        if t - t0 >= secs:
            break
    print(json.dumps({"windows": windows}), flush=True)
