"""Where NCCL's device memory goes, stage by stage, against the hook's count.

Run under the hook, one process per GPU (spawned here). At each stage every
rank prints its own NVML per-process usage on its GPU, the hook's count for
its own slot (`vgpu inspect --json`), and PyTorch's reserved bytes, so the
stage where a gap opens names the path that escaped the count.
    python3 nccl_count.py VGPU REGION [MiB]
NCCL_COUNT_MEMINFO=1: every rank also asks for memory info at each stage
(torch.cuda.mem_get_info, as vLLM and SGLang do), before it is measured.
"""
import json, os, subprocess, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def nvml_used(pid, uuid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 3 and f[0] == str(pid) and f[1] == uuid:
            return int(f[2])
    return -1


def counted(vgpu, region, pid, dev):
    d = json.loads(subprocess.run([vgpu, "inspect", "--json", region], capture_output=True,
                                  text=True).stdout)
    r = d["regions"][0] if "regions" in d else d
    return sum(u["total_bytes"] for s in r["slots"] if s.get("pid") == pid
               for u in s["usage"] if u["device"] == dev) >> 20


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


if __name__ == "__main__":
    vgpu, region = sys.argv[1], sys.argv[2]
    mib = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    print(f"torch {torch.__version__} nccl {torch.cuda.nccl.version()} "
          f"NCCL_CUMEM_ENABLE={os.environ.get('NCCL_CUMEM_ENABLE', 'unset')} "
          f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}", flush=True)
    mp.spawn(run, args=(2, vgpu, region, mib), nprocs=2)
