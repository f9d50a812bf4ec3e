#!/usr/bin/env python3
"""The SM limit's effect on a launch-bound PyTorch loop, paired inside one process.

Separate runs of a Python launch loop differ by ±15-25 % on a shared host, more than
the limiter's own cost. Here one hooked process runs the loop the whole time while
`vgpu set-sm-limit` flips its region between no limit (0) and LIMIT every PERIOD
seconds; each limited phase is compared with the mean of the unlimited phases either
side of it, so host drift slower than a phase cancels out.

Run under the hook (the region is CUDA_DEVICE_MEMORY_SHARED_CACHE):
  LD_PRELOAD=.../libvgpu.so CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/ab.cache \\
  CUDA_DEVICE_SM_LIMIT=90 GPU_CORE_UTILIZATION_POLICY=force \\
      python3 scripts/gpu/ab_limit.py --vgpu .device/dist/vgpu --limits 90,60,30,10

Prints, per limit, the median and range of (limited rate / neighbouring unlimited
rate) over the cycles, and the rates themselves.
"""

import argparse
import os
import statistics
import subprocess
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vgpu", required=True, help="the vgpu binary (for set-sm-limit)")
    p.add_argument("--limits", default="90,60,30,10", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--period", type=float, default=1.0, help="measured seconds per phase")
    p.add_argument("--settle", type=float, default=0.3, help="unmeasured seconds after each flip")
    p.add_argument("--cycles", type=int, default=8, help="limited phases per limit")
    p.add_argument("--elems", type=int, default=4096, help="elements of the loop's tensor (65536: about a third of the GPU busy)")
    args = p.parse_args()
    region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    if not region or "LD_PRELOAD" not in os.environ:
        raise SystemExit("run under the hook, with CUDA_DEVICE_MEMORY_SHARED_CACHE set")

    import torch

    x = torch.zeros(args.elems, device="cuda")

    def step():
        x.add_(1.0)

    # The CLI itself runs without the hook.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def flip(limit):
        # 0 is "no limit" to the hook, but the CLI asks for it by name.
        pct = str(limit) if limit else "none"
        subprocess.run([args.vgpu, "set-sm-limit", "--all", region, pct], check=True, env=env, stdout=subprocess.DEVNULL)

    def phase(limit):
        """Loop rate (kernels/s) with the region at `limit`."""
        flip(limit)
        # The hook re-reads the region every 50 ms; let the queue reach its
        # steady state too.
        t_end = time.monotonic() + args.settle
        while time.monotonic() < t_end:
            for _ in range(8):
                step()
        n = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.period:
            for _ in range(8):
                step()
            n += 8
        torch.cuda.synchronize()
        return n / (time.monotonic() - t0)

    # Warm-up with a limit: the hook learns the kernel's cost.
    phase(args.limits[0])
    print(f"{'limit':>5} {'median':>7} {'min':>6} {'max':>6}  {'limited k/s':>11} {'unlimited k/s':>13}", flush=True)
    for limit in args.limits:
        free = [phase(0)]
        held = []
        for _ in range(args.cycles):
            held.append(phase(limit))
            free.append(phase(0))
        ratios = [100.0 * h / ((free[i] + free[i + 1]) / 2) for i, h in enumerate(held)]
        print(
            f"{limit:5d} {statistics.median(ratios):6.1f}% {min(ratios):5.1f}% {max(ratios):5.1f}%"
            f"  {statistics.median(held) / 1e3:11.1f} {statistics.median(free) / 1e3:13.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
