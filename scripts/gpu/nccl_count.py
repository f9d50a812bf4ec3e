"""Where NCCL's device memory goes, stage by stage, against the hook's count.

Run under the hook, one process per GPU (spawned here). At each stage every
rank prints its own NVML per-process usage on its GPU, the hook's count for
its own slot (`vgpu inspect --json`), and PyTorch's reserved bytes, so the
stage where a gap opens names the path that escaped the count.
    python3 nccl_count.py VGPU REGION [MiB]
NCCL_COUNT_MEMINFO=1: every rank also asks for memory info at each stage
(torch.cuda.mem_get_info, as vLLM and SGLang do), before it is measured.

    python3 nccl_count.py VGPU REGION [MiB] --steady[=SECS,...]
Steady mode: the same collectives (1 float, then 20 all-reduces of MiB), then
the ranks make no CUDA call at all (no allocation, no barrier, no memory
info) until released. The parent process, which never touches CUDA, measures
each rank from outside SECS (default 0.5,2.5) after the later rank's last
CUDA call: NVML's per-process used memory on the rank's GPU (nvidia-smi),
the hook's count for the rank's slot (`vgpu inspect --json`) and the gap.
Lines start with "steady" (key value pairs) for the caller to tabulate.
Measurements never run under LD_PRELOAD (the hook stays out of nvidia-smi).
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


# Measuring tools run without the hook preloaded.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def nvml_apps():
    """[(pid, uuid, MiB)] of every compute process, from nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         env=CLEAN_ENV).stdout
    apps = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 3 and f[2].isdigit():
            apps.append((f[0], f[1], int(f[2])))
    return apps


def nvml_used(pid, uuid):
    for p, u, m in nvml_apps():
        if p == str(pid) and u == uuid:
            return m
    return -1


def inspect(vgpu, region):
    d = json.loads(subprocess.run([vgpu, "inspect", "--json", region], capture_output=True,
                                  text=True, env=CLEAN_ENV).stdout)
    return d["regions"][0] if "regions" in d else d


def slot_usage(r, pid, dev):
    """The slot's counters (bytes) on device dev: total, context, module, data."""
    keys = ("total_bytes", "context_bytes", "module_bytes", "data_bytes")
    got = [0, 0, 0, 0]
    for s in r["slots"]:
        if s.get("pid") == pid:
            for u in s["usage"]:
                if u["device"] == dev:
                    got = [g + u.get(k, 0) for g, k in zip(got, keys)]
    return got


def counted(vgpu, region, pid, dev):
    return slot_usage(inspect(vgpu, region), pid, dev)[0] >> 20


def run(rank, world, vgpu, region, mib):
    torch.cuda.set_device(rank)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(rank).uuid)
    pid = os.getpid()

    def stage(name):
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier()
        time.sleep(1.5)
        if os.environ.get("NCCL_COUNT_MEMINFO"):
            torch.cuda.mem_get_info()
        n, c = nvml_used(pid, uuid), counted(vgpu, region, pid, rank)
        print(f"rank {rank} {name:<28} nvml {n:6d} MiB  counted {c:6d} MiB  gap {n - c:5d} MiB  "
              f"torch reserved {torch.cuda.memory_reserved() >> 20} MiB", flush=True)

    torch.zeros(1, device="cuda")
    stage("context")
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29534", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    stage("init_process_group")
    s = torch.ones(1, device="cuda")
    dist.all_reduce(s)
    stage("first all_reduce (1 float)")
    x = torch.ones(mib << 18, device="cuda")
    stage(f"{mib} MiB tensor")
    for _ in range(20):
        dist.all_reduce(x)
    stage("20 all_reduce")
    ok = float(x[0].item()) == float(world ** 20)
    print(f"rank {rank} pid {pid} result ok {ok}", flush=True)
    dist.destroy_process_group()
    stage("destroy_process_group")


def steady_rank(rank, world, mib, port, sync):
    torch.cuda.set_device(rank)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(rank).uuid)
    torch.zeros(1, device="cuda")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    s = torch.ones(1, device="cuda")
    dist.all_reduce(s)
    x = torch.ones(mib << 18, device="cuda")
    for _ in range(20):
        dist.all_reduce(x)
    ok = float(x[0].item()) == float(world ** 20)  # waits for the last all-reduce: the last CUDA call
    t = time.time()
    with open(os.path.join(sync, f"ready-{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {uuid} {t} {ok}\n")
    os.rename(os.path.join(sync, f"ready-{rank}.tmp"), os.path.join(sync, f"ready-{rank}"))
    while not os.path.exists(os.path.join(sync, "release")):
        time.sleep(0.05)
    dist.destroy_process_group()


def steady(vgpu, region, mib, times, world=2):
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    sync = tempfile.mkdtemp(prefix="nccl-steady.")
    ctx = mp.spawn(steady_rank, args=(world, mib, port, sync), nprocs=world, join=False)
    ranks = {}
    deadline = time.time() + 300
    while len(ranks) < world:
        if ctx.join(timeout=0.05):  # raises if a rank failed
            break
        for r in range(world):
            p = os.path.join(sync, f"ready-{r}")
            if r not in ranks and os.path.exists(p):
                pid, uuid, t, ok = open(p).read().split()
                ranks[r] = (int(pid), uuid, float(t), ok)
        if time.time() > deadline:
            print("steady: ranks not ready after 300 s", flush=True)
            break
    if len(ranks) == world:
        last = max(v[2] for v in ranks.values())
        for at in times:
            time.sleep(max(0.0, last + at - time.time()))
            since = time.time() - last
            apps, r = nvml_apps(), inspect(vgpu, region)
            for rank, (pid, uuid, _, ok) in sorted(ranks.items()):
                n = next((m for p, u, m in apps if p == str(pid) and u == uuid), -1)
                other = sum(m for p, u, m in apps if p == str(pid) and u != uuid)
                tot, c, mo, da = (b >> 20 for b in slot_usage(r, pid, rank))
                print(f"steady rank {rank} pid {pid} at {since:.2f} nvml {n} counted {tot} "
                      f"gap {n - tot} context {c} module {mo} data {da} other_gpus {other} "
                      f"ok {ok}", flush=True)
    open(os.path.join(sync, "release"), "w").close()
    ctx.join()
    shutil.rmtree(sync, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    times = None
    for a in [a for a in args if a.startswith("--steady")]:
        times = [float(x) for x in (a.partition("=")[2] or "0.5,2.5").split(",")]
        args.remove(a)
    vgpu, region = args[0], args[1]
    mib = int(args[2]) if len(args) > 2 else 1024
    print(f"torch {torch.__version__} nccl {torch.cuda.nccl.version()} "
          f"NCCL_CUMEM_ENABLE={os.environ.get('NCCL_CUMEM_ENABLE', 'unset')} "
          f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}", flush=True)
    if times is not None:
        steady(vgpu, region, mib, times)
    else:
        mp.spawn(run, args=(2, vgpu, region, mib), nprocs=2)
