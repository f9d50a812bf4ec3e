#!/usr/bin/env python3
"""A stand-in for HAMi's vGPU monitor's feedback loop, for GPU runs without Kubernetes.

    hami_monitor.py [--tick 5] REGION...

Every tick (HAMi: 5 s) it does what HAMi's monitor does to each container's region
(https://github.com/Project-HAMi/HAMi, cmd/vGPUmonitor/feedback.go, `Observe`):
decays `recent_kernel` (2 -> 1 -> 0) and counts the containers that launched since the last
tick per GPU and priority; sets `recent_kernel = -1` (blocked) on a container when a
container of higher priority (a lower number) launched recently on one of its GPUs, and 0
(unblocked) when none did; sets `utilization_switch` to 1 when a higher priority or another
container of the same priority is active on its GPU, else 0. Prints one line per change.
"""

import argparse
import mmap
import os
import struct
import time

UUIDS, UUID_LEN, DEVICES = 64, 96, 16
SWITCH, RECENT, PRIORITY = 2_008_900, 2_008_904, 2_008_908


def i32(m, off):
    return struct.unpack_from("<i", m, off)[0]


def put(m, off, v):
    struct.pack_into("<i", m, off, v)


def uuids(m):
    out = []
    for i in range(DEVICES):
        raw = bytes(m[UUIDS + i * UUID_LEN: UUIDS + (i + 1) * UUID_LEN])
        if raw[0]:
            out.append(raw)
    return out


def tick(regions, log):
    active = {}  # uuid -> {priority: count}
    for name, m in regions:
        rk = i32(m, RECENT)
        if rk > 0:
            rk -= 1
            if rk > 0:
                p = i32(m, PRIORITY)
                if p >= 0:
                    for u in uuids(m):
                        active.setdefault(u, {}).setdefault(p, 0)
                        active[u][p] += 1
            put(m, RECENT, rk)
    for name, m in regions:
        p = i32(m, PRIORITY)
        devs = uuids(m)
        higher = any(q < p and n > 0 for u in devs for q, n in active.get(u, {}).items())
        same = any(active.get(u, {}).get(p, 0) > 1 for u in devs)
        rk = i32(m, RECENT)
        if higher and rk >= 0:
            put(m, RECENT, -1)
            log(f"{name}: blocked")
        elif not higher and rk < 0:
            put(m, RECENT, 0)
            log(f"{name}: unblocked")
        want = 1 if (higher or same) else 0
        if i32(m, SWITCH) != want:
            put(m, SWITCH, want)
            log(f"{name}: utilization_switch {want}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tick", type=float, default=5.0)
    ap.add_argument("regions", nargs="+")
    a = ap.parse_args()
    regions = []
    t0 = time.time()
    log = lambda s: print(f"monitor {time.time() - t0:6.1f}s {s}", flush=True)
    while True:
        for path in a.regions:
            if path not in [n for n, _ in regions] and os.path.exists(path) and os.path.getsize(path) >= PRIORITY + 4:
                with open(path, "r+b") as f:
                    regions.append((path, mmap.mmap(f.fileno(), 0)))
        tick(regions, log)
        time.sleep(a.tick)


if __name__ == "__main__":
    main()
