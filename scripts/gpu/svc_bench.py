#!/usr/bin/env python3
"""A latency-bound service beside a trainer, on a real GPU.

  svc_bench.py service --seconds S   every 20 ms: 4 bf16 2048x2048 matmuls and a
                                     synchronize (a small inference request); prints
                                     `service p50 P p99 Q ms n N` over the requests after
                                     the first 2 s
  svc_bench.py trainer --seconds S   a loop of bf16 4096x4096 matmuls, synchronizing
                                     every 25 (a training step's loss.item()); prints
                                     `trainer R matmuls/s` between 2 s and S - 0.5 s

Run them as two processes (two containers: each its own region and environment).
"""

import argparse
import time

import torch


def service(secs):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    nxt = t0
    lat = []
    while True:
        now = time.perf_counter()
        if now - t0 > secs:
            break
        if now < nxt:
            time.sleep(nxt - now)
        s = time.perf_counter()
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()
        e = time.perf_counter()
        if s - t0 > 2.0:
            lat.append((e - s) * 1e3)
        nxt += 0.020
        if nxt < e:
            nxt = e
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    print(f"service p50 {q(0.5):.3f} p99 {q(0.99):.3f} ms n {len(lat)}", flush=True)


def trainer(secs):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n, n0, ta = 0, None, None
    while True:
        for _ in range(25):
            a @ b
        torch.cuda.synchronize()
        n += 25
        t = time.perf_counter() - t0
        if n0 is None and t >= 2.0:
            n0, ta = n, t
        if t >= secs - 0.5:
            break
    rate = (n - n0) / (t - ta) if n0 is not None and t > ta else 0.0
    print(f"trainer {rate:.1f} matmuls/s", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["service", "trainer"])
    p.add_argument("--seconds", type=float, default=12.0)
    a = p.parse_args()
    service(a.seconds) if a.role == "service" else trainer(a.seconds)
