#!/usr/bin/env bash
# Real-GPU check of what the daemon and `vgpu top` observe: nvidia-smi inside a
# PID-namespaced hooked container, the daemon's per-container utilization
# of an unlimited matmul container vs nvidia-smi's device utilization, and
# a capture of `vgpu top`. Needs DIST (vgpu, libvgpu.so) and tests/c.
#   DIST=... [ROOT=checkout] bash scripts/gpu/observe.sh  (writes top.json, daemon.log to $OUT)
set -uo pipefail
DIST=$(realpath "${DIST:-.device/dist}")
ROOT=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
W=$(mktemp -d /tmp/vgpu-observe.XXXXXX)
OUT=${OUT:-$W}
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || LIBCUDA=/usr/local/nvidia/lib64/libcuda.so.1
LIBDIR=$(dirname "$LIBCUDA")
say() { printf '\n=== %s\n' "$*"; }
wait_line() { for ((t = 0; t < $3 * 10; t++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "timeout waiting for $2 in $1"; cat "$1"; return 1; }
# metric NAME POD_UID: its value on device 0.
metric() { curl -s localhost:9396/metrics | awk -v m="$1" -v p="$2" 'index($0, m"{") == 1 && index($0, "pod_uid=\""p"\"") && index($0, "vdevice_index=\"0\"") {print $NF}'; }

exec > >(tee "$OUT/log") 2>&1
echo "vgpu observe, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cc -O2 -o "$W/hook_mem" "$ROOT/tests/c/hook_mem.c" -I "$ROOT/tests/c" -DUSE_CUDA_H \
    -I/usr/local/cuda/include -L"$LIBDIR" -l:libcuda.so.1 -ldl || exit 1
cat >"$W/matmul.py" <<'PY'
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
PY
mkdir -p "$W/containers/pod-unlimited_matmul" "$W/containers/pod-limited_matmul"
"$DIST/vgpu" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
    --regions-root "$W/containers" --interval 0.5 >"$W/daemon.log" 2>&1 &
dp=$!
for ((t = 0; t < 300; t++)); do curl -sf localhost:9396/readyz >/dev/null && break; sleep 0.1; done

# container NAME SM_LIMIT SECONDS: a PID-namespaced hooked matmul loop.
container() {
    unshare --pid --fork --mount-proc env LD_PRELOAD="$DIST/libvgpu.so" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/containers/pod-$1_matmul/r.cache" \
        CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_SM_LIMIT="$2" \
        python3 "$W/matmul.py" "$3" >"$W/$1.txt" 2>&1 &
}
say "a host process holding 1 GiB (no hook), and an unlimited matmul container"
sleep 60 | "$W/hook_mem" hold 1073741824 >"$W/host.txt" 2>&1 &
hp=$!
container unlimited 0 45
up=$!
wait_line "$W/host.txt" held 30
wait_line "$W/unlimited.txt" ready 90 || exit 1
upid=$(pgrep -P "$up" | head -1)
echo "host process: pid $(pgrep -f 'hook_mem hold 1073741824' | head -1); container workload: host pid $upid"

say "nvidia-smi on the host"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
say "nvidia-smi inside the container (its PID namespace and /proc), under the hook"
nsenter --target "$upid" --pid --mount env LD_PRELOAD="$DIST/libvgpu.so" \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/containers/pod-unlimited_matmul/r.cache" CUDA_DEVICE_MEMORY_LIMIT=8g \
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
nsenter --target "$upid" --pid --mount env LD_PRELOAD="$DIST/libvgpu.so" \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/containers/pod-unlimited_matmul/r.cache" CUDA_DEVICE_MEMORY_LIMIT=8g \
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
say "nvidia-smi inside the container, no hook"
nsenter --target "$upid" --pid --mount nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
say "per-process utilization samples (nvidia-smi pmon): host, then inside the container"
nvidia-smi pmon -c 1 -s u
nsenter --target "$upid" --pid --mount nvidia-smi pmon -c 1 -s u

say "unlimited container: daemon utilization metric vs nvidia-smi device utilization (10 s, every 0.5 s)"
: >"$W/m" ; : >"$W/s"
for i in $(seq 20); do
    metric hami_container_device_utilization_ratio pod-unlimited >>"$W/m"
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits >>"$W/s"
    sleep 0.5
done
echo "metric samples: $(tr '\n' ' ' <"$W/m")"
echo "nvidia-smi samples: $(tr '\n' ' ' <"$W/s")"
paste "$W/m" "$W/s" | awk '{m += $1; s += $2; n++} END {printf "mean metric %.1f, mean nvidia-smi %.1f, difference %.1f points (n=%d)\n", m/n, s/n, m/n - s/n, n}'
echo "slot sm_util (HAMi's monitor reads it):"
"$DIST/vgpu" inspect --json "$W/containers/pod-unlimited_matmul/r.cache" | python3 -c 'import json,sys
d=json.load(sys.stdin); r=d["regions"][0]
print([(s["pid"], s["hostpid"], [u["sm_util"] for u in s["usage"]]) for s in r["slots"] if s["pid"]])'

say "a second container, SM limit 30, beside it; vgpu top"
container limited 30 20
wait_line "$W/limited.txt" ready 90
sleep 6
nvidia-smi pmon -c 1 -s u
for i in $(seq 6); do
    echo "metric unlimited $(metric hami_container_device_utilization_ratio pod-unlimited | head -1)" \
        "limited $(metric hami_container_device_utilization_ratio pod-limited | head -1)" \
        "nvidia-smi $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits)"
    sleep 0.5
done
COLUMNS=150 "$DIST/vgpu" top --root "$W/containers" --state-dir "$W/state" --count 2 --interval 1 --sort sm
"$DIST/vgpu" top --json --root "$W/containers" --state-dir "$W/state" >"$OUT/top.json"
curl -s localhost:9396/metrics | grep -E '^(hami_container_device_utilization_ratio|vgpu_sm_limit_percent|hami_host_gpu_utilization_ratio|vgpu_findings|vgpu_untracked_bytes)' | grep -v 'vdevice_index="[1-9]' | sed -E 's/region="[^"]*",//' 
kill "$hp" "$upid" 2>/dev/null
kill -INT $dp; wait $dp 2>/dev/null
cp "$W/daemon.log" "$OUT/daemon.log"
echo done
