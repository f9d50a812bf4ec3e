"""A client that uses device memory the way vLLM does, in its order, against the hook's count.

vLLM cannot be installed on the GPU machine (no network), so this does what it does with
PyTorch and the driver API (ctypes; the hook's exported dlsym hands ctypes its wrappers):
  1. weights through a cuMem allocator (cuMemCreate, cuMemAddressReserve, cuMemMap,
     cuMemSetAccess), as vLLM's sleep-mode allocator does;
  2. memory profiling: a dummy forward through PyTorch's caching allocator, then
     `torch.cuda.mem_get_info` (cudaMemGetInfo) to size the KV cache at 90 % of what is left;
  3. the KV cache through the cuMem allocator;
  4. CUDA graphs captured for many batch sizes in one shared pool;
  5. a custom all-reduce's IPC buffer: cuIpcGetMemHandle here, cuIpcOpenMemHandle in a second
     process, which writes into it;
  6. sleep (unmap and release the weights and the KV cache) and wake (create and map again);
  7. teardown.
At each stage: this process's NVML per-process usage, the hook's count for its slot
(`vgpu inspect --json`), and the gap.
    python3 vllm_like.py VGPU REGION          (under the hook, one GPU)
    python3 vllm_like.py --peer HANDLE_HEX     (the second process of stage 5)
"""
import ctypes as C
import json, os, subprocess, sys, time

cu = C.CDLL("libcuda.so.1")


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32HandleMetaData", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


class IpcHandle(C.Structure):  # CUipcMemHandle, passed by value
    _fields_ = [("reserved", C.c_char * 64)]


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


class CuMemPool:
    """vLLM's sleep-mode allocator in miniature: each block is its own handle and mapping."""

    def __init__(self, dev):
        self.dev, self.blocks = dev, []
        self.prop = Prop(type=1, requestedHandleTypes=1, location=Loc(1, dev))  # pinned, fd, device
        g = C.c_size_t()
        ck(cu.cuMemGetAllocationGranularity(C.byref(g), C.byref(self.prop), 0), "granularity")
        self.gran = g.value

    def alloc(self, size):
        size = (size + self.gran - 1) // self.gran * self.gran
        h, va = C.c_ulonglong(), C.c_ulonglong()
        ck(cu.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(self.prop), C.c_ulonglong(0)), "cuMemCreate")
        ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(size), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve")
        ck(cu.cuMemMap(va, C.c_size_t(size), C.c_size_t(0), h, C.c_ulonglong(0)), "cuMemMap")
        acc = Access(Loc(1, self.dev), 3)
        ck(cu.cuMemSetAccess(va, C.c_size_t(size), C.byref(acc), C.c_size_t(1)), "cuMemSetAccess")
        self.blocks.append([va.value, size, h.value])

    def sleep(self):  # unmap and release every block, keep the sizes (vLLM offloads or discards)
        for b in self.blocks:
            ck(cu.cuMemUnmap(C.c_ulonglong(b[0]), C.c_size_t(b[1])), "cuMemUnmap")
            ck(cu.cuMemRelease(C.c_ulonglong(b[2])), "cuMemRelease")

    def wake(self):  # new physical memory mapped at the same addresses
        for b in self.blocks:
            h = C.c_ulonglong()
            ck(cu.cuMemCreate(C.byref(h), C.c_size_t(b[1]), C.byref(self.prop), C.c_ulonglong(0)), "cuMemCreate")
            ck(cu.cuMemMap(C.c_ulonglong(b[0]), C.c_size_t(b[1]), C.c_size_t(0), h, C.c_ulonglong(0)), "cuMemMap")
            acc = Access(Loc(1, self.dev), 3)
            ck(cu.cuMemSetAccess(C.c_ulonglong(b[0]), C.c_size_t(b[1]), C.byref(acc), C.c_size_t(1)), "access")
            b[2] = h.value

    def free(self):
        self.sleep()
        for b in self.blocks:
            ck(cu.cuMemAddressFree(C.c_ulonglong(b[0]), C.c_size_t(b[1])), "cuMemAddressFree")
        self.blocks = []


def peer(handle_hex):
    import torch
    torch.zeros(1, device="cuda")
    h = IpcHandle.from_buffer_copy(bytes.fromhex(handle_hex))
    p = C.c_ulonglong()
    ck(cu.cuIpcOpenMemHandle_v2(C.byref(p), h, C.c_uint(1)), "cuIpcOpenMemHandle")
    ck(cu.cuMemsetD8_v2(p, C.c_ubyte(7), C.c_size_t(64 << 20)), "memset")
    torch.cuda.synchronize()
    print("peer wrote", flush=True)
    sys.stdin.readline()
    ck(cu.cuIpcCloseMemHandle(p), "cuIpcCloseMemHandle")


def stager(vgpu, region, dev, uuid, sync):
    """`stage(name)`: prints NVML's figure for this process, the hook's count and the gap."""
    pid = os.getpid()

    def stage(name):
        sync()
        time.sleep(1.0)
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
        n = next((int(f[2]) for f in (l.split(", ") for l in out.splitlines())
                  if f[0] == str(pid) and f[1] == uuid), -1)
        d = json.loads(subprocess.run([vgpu, "inspect", "--json", region], capture_output=True, text=True).stdout)
        r = d["regions"][0] if "regions" in d else d
        c = sum(u["total_bytes"] for s in r["slots"] if s.get("pid") == pid
                for u in s["usage"] if u["device"] == dev) >> 20
        print(f"{name:<40} nvml {n:6d} MiB  counted {c:6d} MiB  gap {n - c:5d} MiB", flush=True)
    return stage


def main(vgpu, region):
    import torch
    dev = torch.cuda.current_device()
    uuid = "GPU-" + str(torch.cuda.get_device_properties(dev).uuid)
    stage = stager(vgpu, region, dev, uuid, torch.cuda.synchronize)

    torch.zeros(1, device="cuda")
    stage("context")
    weights = CuMemPool(dev)
    for _ in range(16):
        weights.alloc(64 << 20)
    stage("weights: 16 x 64 MiB cuMem blocks")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    acts = [x @ x for _ in range(8)]
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated() + sum(b[1] for b in weights.blocks)
    kv_bytes = max(int(total * 0.9) - (total - free), 0) // 2
    del acts
    print(f"profile: mem_get_info free {free >> 20} MiB total {total >> 20} MiB, peak {peak >> 20} MiB, "
          f"KV cache {kv_bytes >> 20} MiB", flush=True)
    stage("profiled (dummy forward freed)")
    kv = CuMemPool(dev)
    chunk = 256 << 20
    for _ in range(max(kv_bytes // chunk, 1)):
        kv.alloc(chunk)
    stage("KV cache (cuMem, 256 MiB blocks)")
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for bs in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]:
        inp = torch.randn(bs, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            (inp @ w).relu()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            out = (inp @ w).relu()
        graphs.append((g, inp, w, out))
    for g, *_ in graphs:
        g.replay()
    stage("10 CUDA graphs captured and replayed")
    buf = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    h = IpcHandle()
    ck(cu.cuIpcGetMemHandle(C.byref(h), C.c_ulonglong(buf.data_ptr())), "cuIpcGetMemHandle")
    child = subprocess.Popen([sys.executable, __file__, "--peer", bytes(h).hex()], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    print("peer:", child.stdout.readline().strip(), flush=True)
    ok = bool((buf[:1024] == 7).all())
    stage(f"IPC buffer written by a peer (seen {ok})")
    child.stdin.write("\n")
    child.stdin.flush()
    child.wait()
    weights.sleep()
    kv.sleep()
    stage("sleep: weights and KV cache released")
    weights.wake()
    kv.wake()
    stage("wake: mapped again")
    weights.free()
    kv.free()
    del graphs, buf, x
    torch.cuda.empty_cache()
    stage("teardown")


if __name__ == "__main__":
    if sys.argv[1] == "--peer":
        peer(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
