#!/usr/bin/env python3
"""SM-limit benchmark for a real GPU (self-contained: PyTorch + nvidia-smi).

Runs three workloads, each for N seconds, and prints their throughput:
  matmul  bf16 4096x4096 matmul loop (long kernels)
  tiny    a loop of tiny element-wise kernels on a 4096-element tensor (launch-bound:
          Python issues them slower than the GPU runs them, so unlimited it keeps
          the GPU busy only part of the time)
  spin    a loop of one-block kernels of ~10 us each (torch.cuda._sleep): tiny grids
          (what a grid-size charge undercounts) that keep the GPU busy
  graph   a CUDA-graph replay of 20 tiny kernels + one 1024x1024 matmul

Usage (the lead runs it with and without the hook, at each limit):
  python3 scripts/gpu/sm_bench.py --seconds 10 --save base.json     # unlimited baseline
  LD_PRELOAD=/path/libvgpu.so CUDA_DEVICE_SM_LIMIT=30 \\
  GPU_CORE_UTILIZATION_POLICY=force \\
  CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu-bench/x.cache \\
      python3 scripts/gpu/sm_bench.py --seconds 10 --baseline base.json

  --sweep 10,30,60,90 --hook /path/libvgpu.so   re-runs itself under the hook at each
                                                 limit (fresh region each time) and prints
                                                 a table: throughput vs unlimited, and
                                                 nvidia-smi utilization mean / stdev.
  --interleave                                   with --sweep: an unlimited run between
                                                 every two limits; each limit's share is
                                                 against the mean of the runs either side
                                                 (for workloads whose rate drifts with the
                                                 host, such as the launch-bound tiny loop).
  --hook name=/path/libvgpu.so (repeatable)      with --interleave: each limit runs every
  --rounds N                                     build (in an order rotated each round),
                                                 then one unlimited run; N rounds; a last
                                                 table gives each build's median share and
                                                 utilization over the rounds (paired A/B of
                                                 builds on a drifting host).

Each workload line: `<name> <iters/s> <unit/s>` plus, when nvidia-smi sampling is on (default),
`util mean/stdev` over the timed part (100 ms samples).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def smi_sampler(stop, samples, gpu_index):
    cmd = [
        "nvidia-smi",
        f"--id={gpu_index}",
        "--query-gpu=utilization.gpu,clocks.sm,power.draw",
        "--format=csv,noheader,nounits",
        "-lms",
        "100",
    ]
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    except OSError:
        return
    try:
        for line in p.stdout:
            if stop.is_set():
                break
            f = [x.strip() for x in line.split(",")]
            try:
                samples.append((time.monotonic(), int(f[0]), float(f[1]), float(f[2])))
            except (ValueError, IndexError):
                continue
    finally:
        p.kill()
        p.wait()


def timed(name, step, seconds, work_per_iter, unit, sample, gpu_index):
    import torch

    # Warm-up: compile, allocate, learn costs (the hook times the first launches).
    t_end = time.monotonic() + min(1.0, seconds / 5)
    while time.monotonic() < t_end:
        step()
    torch.cuda.synchronize()

    samples, stop = [], threading.Event()
    th = None
    if sample:
        th = threading.Thread(target=smi_sampler, args=(stop, samples, gpu_index), daemon=True)
        th.start()
        time.sleep(0.3)
    iters = 0
    t0 = time.monotonic()
    while True:
        for _ in range(8):
            step()
        iters += 8
        if time.monotonic() - t0 >= seconds:
            break
    torch.cuda.synchronize()
    dt = time.monotonic() - t0
    stop.set()
    # The window: the middle 60 % of the timed run.
    mid = [s for s in samples if t0 + 0.2 * dt <= s[0] <= t0 + 0.8 * dt]
    util = [s[1] for s in mid]
    res = {
        "name": name,
        "iters_per_s": iters / dt,
        "work_per_s": iters * work_per_iter / dt,
        "unit": unit,
        "util_mean": statistics.mean(util) if util else None,
        "util_stdev": statistics.pstdev(util) if len(util) > 1 else None,
        # SM clock (MHz) and board power (W) over the same window: a GPU
        # under its power cap clocks down, so a duty-cycled one does more
        # work per busy second than an unlimited one.
        "clock_mhz": statistics.mean(s[2] for s in mid) if mid else None,
        "power_w": statistics.mean(s[3] for s in mid) if mid else None,
    }
    u = (
        f" util {res['util_mean']:.1f} ± {res['util_stdev']:.1f}"
        if res["util_mean"] is not None and res["util_stdev"] is not None
        else ""
    )
    if res["clock_mhz"] is not None:
        u += f" sm clock {res['clock_mhz']:.0f} MHz, {res['power_w']:.0f} W"
    print(f"{name:7s} {res['iters_per_s']:12.1f} it/s {res['work_per_s']:14.3f} {unit}{u}", flush=True)
    return res


def run_all(args):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    results = {}

    if "matmul" in args.workloads:
        n = 4096
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

        def mm():
            torch.matmul(a, b, out=c)

        results["matmul"] = timed("matmul", mm, args.seconds, 2 * n**3 / 1e12, "TFLOP/s", args.smi, args.device)

    if "tiny" in args.workloads:
        x = torch.zeros(args.tiny_elems, device=dev)

        def tiny():
            x.add_(1.0)

        results["tiny"] = timed("tiny", tiny, args.seconds, 1, "kernels/s", args.smi, args.device)

    if "spin" in args.workloads:
        cycles = 20000  # ~10 us at the H100/H200 boost clock

        def spin():
            torch.cuda._sleep(cycles)

        results["spin"] = timed("spin", spin, args.seconds, 1, "kernels/s", args.smi, args.device)

    if "graph" in args.workloads:
        x = torch.zeros(4096, device=dev)
        m = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
        out = torch.empty(1024, 1024, device=dev, dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1.0)
                torch.matmul(m, m, out=out)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                x.add_(1.0)
            torch.matmul(m, m, out=out)

        results["graph"] = timed("graph", g.replay, args.seconds, 1, "replays/s", args.smi, args.device)
    return results


def clk(r):
    """SM clock and power columns of a result."""
    if r.get("clock_mhz") is None:
        return f"{'-':>5} {'-':>4}"
    return f"{r['clock_mhz']:5.0f} {r['power_w']:4.0f}"


def sweep(args):
    """Baseline without the hook, then each limit under it; prints a table."""
    me = os.path.abspath(__file__)
    base_cmd = [sys.executable, me, "--seconds", str(args.seconds), "--json", "--device", str(args.device)]
    base_cmd += ["--workloads", ",".join(args.workloads), "--tiny-elems", str(args.tiny_elems)]
    if not args.smi:
        base_cmd.append("--no-smi")

    def run(env):
        out = subprocess.run(base_cmd, env=env, capture_output=True, text=True)
        sys.stderr.write(out.stderr)
        for line in out.stdout.splitlines():
            if line.startswith("JSON "):
                return json.loads(line[5:])
        raise SystemExit(f"no result: {out.stdout}")

    env0 = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    base = run(env0)
    # Rows are printed as each limit finishes, so a run cut short by a time
    # limit still shows what it measured.
    # A limit is a cap: a workload that unlimited keeps the GPU busy only
    # u % of the time should get min(limit, u) % utilization and
    # min(1, limit / u) of its throughput. Both are printed as the target.
    print(
        f"{'limit':>5} {'workload':8} {'share of unlimited':>18} {'(target)':>8} "
        f"{'util mean':>9} {'(target)':>8} {'stdev':>6} {'MHz':>5} {'W':>4}",
        flush=True,
    )
    for name, r in base.items():
        um = f"{r['util_mean']:.1f}" if r["util_mean"] is not None else "-"
        print(f"{'none':>5} {name:8} {100.0:17.1f}% {'':>8} {um:>9} {'':>8} {'':>6} {clk(r)}", flush=True)
    hooks = args.hook

    def limited(limit, hook):
        d = tempfile.mkdtemp(prefix="vgpu-smbench-")
        env = dict(env0)
        env.update(
            {
                "LD_PRELOAD": hook,
                "CUDA_DEVICE_SM_LIMIT": str(limit),
                "GPU_CORE_UTILIZATION_POLICY": "force",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": os.path.join(d, "bench.cache"),
            }
        )
        return run(env)

    if args.interleave:
        # Each limit runs every build, then one unlimited run; each share is
        # against the unlimited runs either side of its group.
        shares = {}
        for rnd in range(args.rounds):
            for limit in args.sweep:
                order = hooks[rnd % len(hooks) :] + hooks[: rnd % len(hooks)]
                group = [(name, limited(limit, hook)) for name, hook in order]
                after = run(env0)
                for name, res in group:
                    row(limit, res, base, after, name if len(hooks) > 1 else "")
                    for w, r in res.items():
                        share = 100.0 * r["work_per_s"] / statistics.mean(
                            x[w]["work_per_s"] for x in (base, after)
                        )
                        shares.setdefault((limit, name, w), []).append((share, r["util_mean"]))
                base = after
        if args.rounds > 1:
            print(f"medians over {args.rounds} rounds (range):", flush=True)
            for (limit, name, w), v in shares.items():
                s, u = [x[0] for x in v], [x[1] for x in v if x[1] is not None]
                um = f"util {statistics.median(u):.1f} ({min(u):.1f}-{max(u):.1f})" if u else ""
                print(
                    f"{limit:5d} {w:8} {name:10} share {statistics.median(s):5.1f}% "
                    f"({min(s):.1f}-{max(s):.1f}) {um}",
                    flush=True,
                )
        return
    results = []
    for limit in args.sweep:
        res = limited(limit, hooks[0][1])
        results.append((limit, res, base, None))
        row(limit, res, base, None)
    # A launch-bound loop's rate drifts with the host by ±15 % between runs:
    # a second unlimited run at the end shows how far, and the shares are
    # given again against the mean of both.
    end = run(env0)
    print("unlimited again at the end (throughput vs the first; shares against the mean of both):", flush=True)
    for name, r in end.items():
        print(f"{'none':>5} {name:8} {100.0 * r['work_per_s'] / base[name]['work_per_s']:17.1f}%", flush=True)
    for limit, res, _, _ in results:
        for name, r in res.items():
            mean = (base[name]["work_per_s"] + end[name]["work_per_s"]) / 2
            print(f"{limit:5d} {name:8} {100.0 * r['work_per_s'] / mean:17.1f}%", flush=True)


def row(limit, res, before, after, build=""):
    """One table row per workload: the share of unlimited throughput (against
    the mean of the unlimited runs before and after, when interleaved),
    utilization, and the targets."""
    for name, r in res.items():
        b = [x[name] for x in (before, after) if x is not None]
        base_rate = statistics.mean(x["work_per_s"] for x in b)
        share = 100.0 * r["work_per_s"] / base_rate
        um = f"{r['util_mean']:.1f}" if r["util_mean"] is not None else "-"
        us = f"{r['util_stdev']:.1f}" if r["util_stdev"] is not None else "-"
        u0s = [x["util_mean"] for x in b if x["util_mean"]]
        if u0s:
            u0 = statistics.mean(u0s)
            ut, st = f"{min(limit, u0):.1f}", f"{min(100.0, 100.0 * limit / u0):.1f}%"
        else:
            ut, st = "-", "-"
        extra = ""
        if after is not None:
            um0 = f"{after[name]['util_mean']:.1f}" if after[name]["util_mean"] is not None else "-"
            extra = f"  (unlimited after: {100.0 * after[name]['work_per_s'] / before[name]['work_per_s']:.1f}% of before, util {um0})"
        if build:
            extra += f"  [{build}]"
        print(f"{limit:5d} {name:8} {share:17.1f}% {st:>8} {um:>9} {ut:>8} {us:>6} {clk(r)}{extra}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per workload")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--workloads", default="matmul,tiny,spin,graph", type=lambda s: s.split(","))
    p.add_argument("--no-smi", dest="smi", action="store_false", help="do not sample nvidia-smi")
    p.add_argument("--json", action="store_true", help="also print one `JSON {...}` line")
    p.add_argument("--save", help="write the results as JSON to this file (for --baseline)")
    p.add_argument("--baseline", help="JSON file of an unlimited run (--save): print shares against it")
    p.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], help="limits to sweep")
    p.add_argument(
        "--hook",
        action="append",
        default=[],
        type=lambda s: tuple(s.split("=", 1)) if "=" in s else ("hook", s),
        help="libvgpu.so for --sweep; with --interleave, repeat as name=path to compare builds",
    )
    p.add_argument(
        "--tiny-elems", type=int, default=4096, help="elements of the tiny loop's tensor (65536: launch-bound at about a third of the GPU)"
    )
    p.add_argument("--rounds", type=int, default=1, help="with --interleave: repeat the sweep")
    p.add_argument(
        "--interleave", action="store_true", help="with --sweep: an unlimited run between every two limits"
    )
    args = p.parse_args()
    if args.sweep:
        if not args.hook:
            p.error("--sweep needs --hook")
        if len(args.hook) > 1 and not args.interleave:
            p.error("several --hook builds need --interleave")
        sweep(args)
        return
    res = run_all(args)
    if args.baseline:
        with open(args.baseline) as f:
            base = json.load(f)
        for name, r in res.items():
            if name in base:
                print(f"{name:7s} {100.0 * r['work_per_s'] / base[name]['work_per_s']:.1f}% of unlimited")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(res, f)
    if args.json:
        print("JSON " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
