#!/usr/bin/env python3
"""Probe: does exclusive time division avoid the time-slicing loss?

Two unhooked processes on one GPU run a bf16 4096² matmul loop, each only in
its own phase of a common frame on CLOCK_MONOTONIC (shared by all processes of
a host), draining its queue before its phase ends. Prints throughput as a
share of the same loop run alone (`--solo` measures that first).

  python3 tdm_probe.py --solo 5                      # prints `solo <it/s>`
  python3 tdm_probe.py --share 0.3 --offset 0.0 --base <it/s> &
  python3 tdm_probe.py --share 0.7 --offset 0.3 --base <it/s>
"""
import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--solo", type=float, help="measure the solo rate for this many seconds")
    p.add_argument("--share", type=float, default=0.3)
    p.add_argument("--offset", type=float, default=0.0, help="phase start, fraction of the frame")
    p.add_argument("--frame-ms", type=float, default=50.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--base", type=float, help="solo it/s")
    p.add_argument("--no-sync", action="store_true", help="do not drain the queue before the phase ends")
    a = p.parse_args()
    n = 4096
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        torch.matmul(x, y, out=z)
    torch.cuda.synchronize()
    if a.solo:
        t0, it = time.monotonic(), 0
        while time.monotonic() - t0 < a.solo:
            for _ in range(16):
                torch.matmul(x, y, out=z)
            it += 16
        torch.cuda.synchronize()
        print(f"solo {it / (time.monotonic() - t0):.1f}", flush=True)
        return
    frame = a.frame_ms / 1000.0
    cost = 1.0 / a.base  # seconds per matmul at the power-capped clock
    t0, it, issue, phases = time.monotonic(), 0, 0.0, 0
    while True:
        now = time.monotonic()
        if now - t0 >= a.seconds:
            break
        # Next start of our phase.
        k = (now - a.offset * frame) // frame
        start = k * frame + a.offset * frame
        end = start + a.share * frame
        if now >= end:
            start += frame
            end += frame
        if start > now:
            time.sleep(start - now)
        # Issue what fits in the phase (90 %), then drain before it ends.
        count = max(1, int(((end - time.monotonic()) * 0.9) / cost))
        b0 = time.monotonic()
        for _ in range(count):
            torch.matmul(x, y, out=z)
        issue += time.monotonic() - b0
        phases += 1
        it += count
        if not a.no_sync:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    dt = time.monotonic() - t0
    print(
        f"share {a.share} offset {a.offset}: {it / dt:.1f} it/s = {100 * it / dt / a.base:.1f} % of solo, "
        f"issuing a phase's work took {1e3 * issue / max(phases, 1):.2f} ms",
        flush=True,
    )


if __name__ == "__main__":
    main()
