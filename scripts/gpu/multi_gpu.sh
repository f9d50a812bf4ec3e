#!/usr/bin/env bash
# Multi-GPU checks on a machine with two GPUs. Needs DIST (vgpu,
# libvgpu.so), this checkout's tests/c and scripts/gpu, PyTorch with NCCL.
#   DIST=... bash scripts/gpu/multi_gpu.sh [parts]   parts: any of mem torch smi nccl sm trace (default all),
#   and ncclcount (stage by stage, NCCL's memory against the hook's count; not in the default)
# Every container is a region under $W/containers/pod-<name>_c/ (the daemon
# labels it pod_uid pod-<name>, container c); limits as HAMi's device plugin sets them.
set -uo pipefail
DIST=$(realpath "${DIST:-.device/dist}")
ROOT=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
W=$(mktemp -d /tmp/vgpu-mgpu.XXXXXX)
OUT=${OUT:-$W}
PARTS=${1:-mem torch smi nccl sm trace}
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || LIBCUDA=/usr/local/nvidia/lib64/libcuda.so.1
LIBDIR=$(dirname "$LIBCUDA")
export PATH=/usr/local/cuda/bin:$PATH
say() { printf '\n=== %s\n' "$*"; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
field() { awk -v k="$1" '{for (i=1;i<NF;i++) if ($i==k) {print $(i+1); exit}}'; }
wait_line() { for ((t = 0; t < $3 * 10; t++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "timeout waiting for $2 in $1"; cat "$1"; return 1; }

exec > >(tee "$OUT/log") 2>&1
echo "vgpu multi-GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
mapfile -t UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)
[ "${#UUIDS[@]}" -ge "${MGPU_MIN:-2}" ] || { echo "needs two GPUs"; exit 1; }
cc -O2 -o "$W/hook_mem" "$ROOT/tests/c/hook_mem.c" -I "$ROOT/tests/c" -DUSE_CUDA_H \
    -I/usr/local/cuda/include -L"$LIBDIR" -l:libcuda.so.1 -ldl || exit 1
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

"$DIST/vgpu" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
    --regions-root "$W/containers" --interval 0.5 >"$OUT/daemon.log" 2>&1 &
dp=$!
for ((t = 0; t < 300; t++)); do curl -sf localhost:9396/readyz >/dev/null && break; sleep 0.1; done

# ctr NAME cmd...: cmd under the hook in container NAME, limits 2 GiB on
# device 0 and 4 GiB on device 1 unless the caller's environment says otherwise.
ctr() {
    local name=$1
    shift
    mkdir -p "$W/containers/pod-${name}_c"
    env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/containers/pod-${name}_c/r.cache" \
        CUDA_DEVICE_MEMORY_LIMIT_0="${L0:-2g}" CUDA_DEVICE_MEMORY_LIMIT_1="${L1:-4g}" "$@"
}
region() { echo "$W/containers/pod-$1_c/r.cache"; }
# used NAME DEV: the region's container usage on device DEV, in bytes.
used() {
    "$DIST/vgpu" inspect --json "$(region "$1")" | python3 -c 'import json,sys
d=json.load(sys.stdin); r=d["regions"][0] if "regions" in d else d
print(sum(u["total_bytes"] for s in r["slots"] for u in s["usage"] if u["device"]=='"$2"'))'
}

if has mem; then
    say "C driver-API program: per-device limits (LIMIT_0=2g, LIMIT_1=4g), each ordinal, without and with CUDA_VISIBLE_DEVICES=1,0"
    for cvd in unset 1,0; do
        for o in 0 1; do
            if [ $cvd = unset ]; then e=(env -u CUDA_VISIBLE_DEVICES); else e=(env CUDA_VISIBLE_DEVICES=$cvd); fi
            info=$(ctr "c-$cvd" "${e[@]}" "$W/hook_mem" -d $o info)
            lim=$(ctr "c-$cvd" "${e[@]}" "$W/hook_mem" -d $o limit alloc | tail -1)
            vmm=$(ctr "c-$cvd" "${e[@]}" "$W/hook_mem" -d $o limit create | tail -1)
            fill=$(ctr "c-$cvd" "${e[@]}" "$W/hook_mem" -d $o fill)
            dt=$(echo "$info" | field devtotal) mt=$(echo "$info" | field total)
            echo "CUDA_VISIBLE_DEVICES=$cvd ordinal $o: cuDeviceTotalMem $((${dt:-0} >> 20)) MiB," \
                "cuMemGetInfo total $((${mt:-0} >> 20)) MiB; alloc: $lim; cuMemCreate: $vmm; $fill"
        done
    done
    "$DIST/vgpu" inspect "$(region c-1,0)" | head -20
fi

if has torch; then
    say "PyTorch: 64 MiB tensors on each device until refused, without and with CUDA_VISIBLE_DEVICES=1,0"
    cat >"$W/torch_each.py" <<'PY'
import torch
for d in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(d)
    held, err = [], "none"
    try:
        while len(held) < 100000:
            held.append(torch.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{d}"))
    except torch.OutOfMemoryError as e:
        err = str(e).splitlines()[0][:100]
    print(f"cuda:{d} {torch.cuda.get_device_properties(d).uuid} mem_get_info total {total >> 20} MiB, "
          f"got {len(held) * 64} MiB then: {err}", flush=True)
    del held
    torch.cuda.empty_cache()
PY
    ctr torch env -u CUDA_VISIBLE_DEVICES python3 "$W/torch_each.py"
    ctr torch-rev env CUDA_VISIBLE_DEVICES=1,0 python3 "$W/torch_each.py"
fi

if has smi; then
    say "nvidia-smi inside the container (a process holding 1 GiB on device 1 only)"
    sleep 8 | ctr smi env CUDA_VISIBLE_DEVICES=1 "$W/hook_mem" hold 1073741824 >"$W/smi-hold.txt" 2>&1 &
    hp=$!
    wait_line "$W/smi-hold.txt" held 30
    ctr smi nvidia-smi --query-gpu=index,uuid,memory.total,memory.used --format=csv
    echo "on the host:"
    nvidia-smi --query-gpu=index,uuid,memory.total,memory.used --format=csv
    wait $hp
fi

if has nccl; then
    say "torch.distributed NCCL all-reduce, one process per GPU, 1 GiB buffers, 100 iterations, under the hook (16 GiB each)"
    cat >"$W/nccl.py" <<'PY'
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world, hold):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=world)
    x = torch.ones(256 << 20, device="cuda")  # 1 GiB of float32
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(100):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = time.time() - t0
    ok = float(x[0].item()) == float(world ** 100)
    print(f"rank {rank} pid {os.getpid()} allreduce 100 x 1 GiB in {dt:.2f} s "
          f"({100 * 2 * (world - 1) / world * 1.0 / dt:.1f} GiB/s bus) ok {ok} "
          f"torch allocated {torch.cuda.memory_allocated() >> 20} MiB reserved {torch.cuda.memory_reserved() >> 20} MiB", flush=True)
    while not os.path.exists(hold):
        time.sleep(0.1)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, args=(2, sys.argv[1]), nprocs=2)
PY
    L0=16g L1=16g ctr nccl env -u CUDA_VISIBLE_DEVICES python3 "$W/nccl.py" "$W/nccl.release" >"$W/nccl.txt" 2>&1 &
    np=$!
    for ((t = 0; t < 1800; t++)); do [ "$(grep -c '^rank' "$W/nccl.txt")" -ge 2 ] && break; sleep 0.1; done
    cat "$W/nccl.txt"
    sleep 4 # two daemon scans
    echo "per device: region (all slots) vs NVML per-process used memory of the container's processes"
    pids=$(awk '/^rank/ {print $4}' "$W/nccl.txt")
    smi=$(nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits)
    echo "$smi"
    for d in 0 1; do
        r=$(used nccl $d)
        n=0
        for p in $pids; do
            v=$(echo "$smi" | awk -F', *' -v p="$p" -v u="${UUIDS[$d]}" '$1==p && $2==u {print $3}')
            n=$((n + ${v:-0}))
        done
        echo "device $d (${UUIDS[$d]}): region $((r >> 20)) MiB, NVML $n MiB, difference $(((r >> 20) - n)) MiB"
    done
    "$DIST/vgpu" inspect "$(region nccl)" | head -30
    echo "daemon findings:"
    curl -s localhost:9396/findings | python3 -c 'import json,sys
fs=json.load(sys.stdin)["findings"]
print(len(fs), "findings")
for f in fs: print({k: f.get(k) for k in ("kind","pid","untracked_bytes","probe_bytes","nvml_bytes","source","message")})'
    echo "daemon metrics for the container (each device's index and uuid):"
    curl -s localhost:9396/metrics | grep -E '^(hami_vgpu_memory_(used|limit)_bytes|vgpu_untracked_bytes)' | grep 'pod_uid="pod-nccl"'
    touch "$W/nccl.release"
    wait $np
fi

if has ncclcount; then
    mapfile -t variants < <(printf '%s\n' "${NCCL_VARIANTS:-NCCL_CUMEM_ENABLE=1;NCCL_CUMEM_ENABLE=0}" | tr ';' '\n')
    for v in "${variants[@]}"; do
        say "NCCL memory stage by stage under the hook (16 GiB each), $v"
        rm -rf "$W/containers/pod-ncc_c"
        # shellcheck disable=SC2086
        L0=16g L1=16g ctr ncc env -u CUDA_VISIBLE_DEVICES $v NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ALLOC \
            LIBCUDA_LOG_LEVEL=4 python3 "$ROOT/scripts/gpu/nccl_count.py" "$DIST/vgpu" "$(region ncc)" 1024 >"$W/ncc.txt" 2>&1
        grep -E '^(torch|rank)' "$W/ncc.txt"
        echo "NCCL's device allocations by call site (rank 0): count, bytes"
        grep '\[0\] NCCL INFO .*Cuda Alloc Size' "$W/ncc.txt" |
            awk '{for (i = 1; i < NF; i++) {if ($i == "INFO") site = $(i + 1); if ($i == "Size") sz = $(i + 1)}
                  n[site]++; b[site] += sz} END {for (s in n) printf "  %-28s %4d  %10d\n", s, n[s], b[s]}'
        echo "driver entry points taken past the hook (memory, VMM, IPC, multicast, modules):"
        grep -o 'cuGetProcAddress([A-Za-z0-9_]*, [0-9]*, 0x[0-9a-f]*) -> [a-z]*' "$W/ncc.txt" |
            grep -E 'Mem|Multicast|Ipc|Module|Library|Host' | sort | uniq -c | sort -k2 | head -80
        cp "$W/ncc.txt" "$OUT/ncc-$(echo "$v" | tr -c 'A-Za-z0-9\n' '_').txt" 2>/dev/null
    done
fi

if has sm; then
    cat >"$W/mm.py" <<'PY'
import sys, threading, time, torch
secs = float(sys.argv[1]); devs = [int(x) for x in sys.argv[2:]]
counts = {}
def loop(d):
    torch.cuda.set_device(d)
    a = torch.randn(4096, 4096, device=f"cuda:{d}", dtype=torch.bfloat16); b = torch.randn_like(a)
    n = 0; end = time.time() + secs
    while time.time() < end:
        for _ in range(10): a @ b
        torch.cuda.synchronize(); n += 10
    counts[d] = n / secs
ts = [threading.Thread(target=loop, args=(d,)) for d in devs]
[t.start() for t in ts]; [t.join() for t in ts]
print(" ".join(f"cuda:{d} {counts[d]:.0f} matmuls/s" for d in devs), flush=True)
PY
    # util_run SECONDS FN: runs FN; per-GPU utilization samples (every 0.2 s) from its 8th second.
    util_run() {
        local secs=$1
        shift
        "$@" &
        local p=$!
        sleep 8
        nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 200 >"$W/util.txt" &
        local sp=$!
        sleep $((secs - 10))
        kill $sp
        wait $p
        for d in 0 1; do
            awk -F', *' -v d=$d '$1==d {s+=$2; q+=$2*$2; n++} END {m=s/n; printf "GPU %d utilization mean %.1f stdev %.1f (%d samples)\n", d, m, sqrt(q/n-m*m), n}' "$W/util.txt"
        done
    }
    sm_unlimited() { python3 "$W/mm.py" 24 0 1; }
    sm_per_gpu() {
        export CUDA_DEVICE_SM_LIMIT_0=30 CUDA_DEVICE_SM_LIMIT_1=70
        ctr sm2 env CUDA_VISIBLE_DEVICES=0 python3 "$W/mm.py" 24 0 &
        ctr sm2 env CUDA_VISIBLE_DEVICES=1 python3 "$W/mm.py" 24 0 &
        wait
    }
    sm_one_process() {
        export CUDA_DEVICE_SM_LIMIT_0=70 CUDA_DEVICE_SM_LIMIT_1=30
        ctr sm1 env -u CUDA_VISIBLE_DEVICES python3 "$W/mm.py" 24 0 1
    }
    say "unlimited: one process, a matmul thread per GPU"
    util_run 24 sm_unlimited
    say "SM limits 30 (device 0) / 70 (device 1): one process of the container per GPU (CUDA_VISIBLE_DEVICES=0 and =1)"
    util_run 24 sm_per_gpu
    say "SM limits 70 (device 0) / 30 (device 1): one process driving both GPUs"
    util_run 24 sm_one_process
fi

if has trace; then
    say "vgpu trace: context calls labelled with their device (a process with CUDA_VISIBLE_DEVICES=1, one without)"
    "$DIST/vgpu" -v trace --libcuda "$LIBCUDA" --json >"$W/trace.json" 2>"$W/trace.err" &
    tp=$!
    sleep 3
    # Each holds its context 3 s: the trace reads a process's environment
    # while it runs.
    sleep 3 | ctr trace env CUDA_VISIBLE_DEVICES=1 "$W/hook_mem" hold 1048576 >/dev/null &
    sleep 3 | ctr trace env -u CUDA_VISIBLE_DEVICES "$W/hook_mem" -d 1 hold 1048576 >/dev/null &
    sleep 3 | ctr trace env -u CUDA_VISIBLE_DEVICES "$W/hook_mem" -d 0 hold 1048576 >/dev/null &
    sleep 5
    kill -INT $tp
    wait $tp 2>/dev/null
    grep -E 'PrimaryCtxRetain|CtxCreate' "$W/trace.json" | head -6
    grep -i 'nvml\|error' "$W/trace.err" | head -5
    echo "host GPUs: ${UUIDS[*]}"
fi

kill -INT $dp
wait $dp 2>/dev/null
echo "done $(date -u +%Y-%m-%dT%H:%M:%SZ)"
