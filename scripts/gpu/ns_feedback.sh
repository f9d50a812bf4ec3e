#!/usr/bin/env bash
# Real-GPU check of the SM feedback loop inside a PID namespace: a matmul
# container limited to LIMIT % runs in its own PID namespace while
# `vgpu daemon` fills its slot's host PID. NVML inside the namespace names
# processes by namespace PID, so a loop that matches NVML's samples by host
# PID reads "no use" and lowers its gain. Prints, per build, the device
# utilization (nvidia-smi, every 0.2 s) and the loop's last gain lines.
#   DAEMON=/path/vgpu VARIANTS="name=/path/libvgpu.so ..." [LIMIT=30] [SECS=30] bash scripts/gpu/ns_feedback.sh
set -uo pipefail
LIMIT=${LIMIT:-30}
SECS=${SECS:-30}
W=$(mktemp -d /tmp/vgpu-nsfb.XXXXXX)
OUT=${OUT:-$W}
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || LIBCUDA=/usr/local/nvidia/lib64/libcuda.so.1
exec > >(tee "$OUT/ns_feedback.log") 2>&1
echo "vgpu ns_feedback, $(date -u +%Y-%m-%dT%H:%M:%SZ), limit $LIMIT, ${SECS} s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cat >"$W/matmul.py" <<'PY'
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    n += 10
print("matmuls", n, flush=True)
PY
for v in $VARIANTS; do
    name=${v%%=*}; lib=${v#*=}
    mkdir -p "$W/$name/containers/pod_ctr" "$W/$name/state"
    "$DAEMON" daemon --libcuda "$LIBCUDA" --state-dir "$W/$name/state" --listen 127.0.0.1:9396 \
        --regions-root "$W/$name/containers" --interval 0.5 >"$W/$name/daemon.log" 2>&1 &
    dp=$!
    for ((t = 0; t < 300; t++)); do curl -sf localhost:9396/readyz >/dev/null && break; sleep 0.1; done
    unshare --pid --fork --mount-proc env LD_PRELOAD="$lib" LIBCUDA_LOG_LEVEL=4 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name/containers/pod_ctr/r.cache" \
        CUDA_DEVICE_SM_LIMIT="$LIMIT" python3 "$W/matmul.py" "$SECS" >"$W/$name/ctr.txt" 2>&1 &
    cp=$!
    for ((t = 0; t < 600; t++)); do grep -q ready "$W/$name/ctr.txt" 2>/dev/null && break; sleep 0.1; done
    sleep 8
    "$DAEMON" inspect "$W/$name/containers/pod_ctr/r.cache" >"$W/$name/inspect.txt" 2>&1
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >"$W/$name/util.txt" &
    sp=$!
    wait "$cp"
    kill "$sp" "$dp" 2>/dev/null; wait "$sp" "$dp" 2>/dev/null
    echo "=== $name"
    awk '{s += $1; n++} END {printf "device utilization over the last %d samples: mean %.1f %%\n", n, s / n}' "$W/$name/util.txt"
    grep -h "matmuls" "$W/$name/ctr.txt"
    grep -h "sm feedback" "$W/$name/ctr.txt" | grep -E "open loop|gain" | sed -n '1,2p;$p'
    grep -iE "slot|host" "$W/$name/inspect.txt" | head -6
    cp "$W/$name/ctr.txt" "$OUT/$name-ctr.txt" 2>/dev/null
done
