#!/usr/bin/env bash
# Real-GPU checks (cargo xtask gpu-check stages the artifacts in .device/dist).
# The GPU machine has no Rust toolchain: everything Rust comes prebuilt from
# VGPU_DIST; C test programs are compiled here with cc against the real
# libcuda. Phases keep each run under 10 minutes:
#
#   bash scripts/gpu-check.sh mem        memory limit: C program, PyTorch, nvidia-smi, entry points
#   bash scripts/gpu-check.sh overhead   launch and alloc cost: native vs hook (limit set); with
#                                        VARIANTS="name=/path/libvgpu.so ...": native vs each build
#   bash scripts/gpu-check.sh meminfo    cudaMemGetInfo's cost: native vs hook, us per call, with each
#                                        ratio to native (HAMI_CORE=/path/libvgpu.so: HAMi-core too, as
#                                        scripts/gpu/build_hami_core.sh builds it; VARIANTS="name=/path/
#                                        libvgpu.so ...": those builds instead of the dist's)
#   bash scripts/gpu-check.sh steady     (two GPUs) NCCL at rest: two ranks all-reduce, then make no CUDA
#                                        call; NVML's per-process memory against each rank's slot count,
#                                        STEADY_AT (0.5,2.5) s after the last call, cuMem on and off
#                                        (VARIANTS: each build; HAMI_CORE: HAMi-core too; STEADY_LIMIT 40g)
#   bash scripts/gpu-check.sh trace      launch cost: native, bare uprobe, vgpu trace views; PyTorch launches seen
#   bash scripts/gpu-check.sh daemon     host-PID fill in 8 containers, untracked process, launch cost
#   bash scripts/gpu-check.sh sm         SM limit sweep 10/30/60/90 (SM_WORKLOADS, default all four)
#   bash scripts/gpu-check.sh smtiny     the launch-bound tiny loop's sweep, an unlimited run between limits
#                                        (TINY_ELEMS: its tensor's size, default 4096)
#                                        (VARIANTS="name=/path/libvgpu.so ...": those builds instead,
#                                        each at every limit; ROUNDS=n repeats, with medians)
#   bash scripts/gpu-check.sh pair       two containers at 30 / 70, taking turns and time-sliced
#                                        (VARIANTS: each build in turn)
#   bash scripts/gpu-check.sh mixed      a busy container (matmul, 30 %) beside a light one (tiny loop,
#                                        70 %): the light one is not held to turns (VARIANTS as pair)
#   bash scripts/gpu-check.sh pylaunch   PyTorch launch-bound loop: native vs hook, no limit / limit 90
#                                        (VARIANTS="name=/path/libvgpu.so ...": other builds at limit 90)
#   bash scripts/gpu-check.sh pyab       the same loop in one process, its limit flipped on and off
#                                        (paired: host drift cancels); VARIANTS as above; AB_ELEMS:
#                                        the tensor's size (default 4096), AB_LIMITS, AB_CYCLES
#   bash scripts/gpu-check.sh prio       a latency-bound service beside a trainer: service
#                                        p50/p99 and trainer throughput alone, unlimited, at 30/70 and
#                                        with priorities 0/1 (VARIANTS: other builds at 30/70 too;
#                                        PRIO_EXTRA=1: also with HAMi's monitor's feedback loop
#                                        emulated, and with `vgpu daemon` running)
#   bash scripts/gpu-check.sh prioab     priority 0 / 1 only, VARIANTS alternated over ROUNDS rounds
#   bash scripts/gpu-check.sh clients    device memory of real clients against the hook's count, stage
#                                        by stage: a vLLM-like client (cuMem allocator, profiling, graphs,
#                                        IPC, sleep/wake), PyTorch expandable_segments, CuPy, JAX
#   bash scripts/gpu-check.sh oversub    CUDA_OVERSUBSCRIBE: a neighbour holds all but 2 GiB; a container
#                                        with an 8 GiB limit allocates 6 GiB (served from host memory,
#                                        written and read back, shown by inspect), then 4 GiB past its
#                                        limit (refused); the same without the variable (refused)
#   bash scripts/gpu-check.sh gpt2oversub CUDA_OVERSUBSCRIBE: GPT-2-small training under an 8 GiB limit
#                                        while another process holds all but 2 GiB of the card, against
#                                        the same run without pressure and without the variable
#   bash scripts/gpu-check.sh hamish     as HAMi deploys it (CUDA_DEVICE_SM_LIMIT always set): priority
#                                        0 / 1 at limits 0, 100 and unset, 0 beside a trainer stating
#                                        none (VARIANTS: other builds there too); a limit-30 matmul
#                                        beside a limit-0 one in another container (HAMISH_MIX= skips it)
#   bash scripts/gpu-check.sh planned    issue 37's before and after in one run: the 30/70 pair and a
#                                        service at priority 0 beside a trainer (SM limit 0 and 100, as
#                                        HAMi sets them), BEFORE's hook (default .device/final/libvgpu.so)
#                                        sharing /tmp/vgpulock, then the dist's hook with `vgpu daemon`
#                                        planning, each process in an emulated container (a kubepods
#                                        cgroup and a runtime spec: containerd and the kubelet stand-ins)
#   bash scripts/gpu-check.sh witness    the daemon before (BEFORE_VGPU) and after a change to what
#                                        confirms a container's activity, same hook: the 30/70 pair and
#                                        a priority-0 service beside a trainer (SM limit 0 and 100)
#   bash scripts/gpu-check.sh sweep      for each build of VARIANTS (name=libvgpu.so ...): the SM sweep
#                                        (SM_WORKLOADS, default matmul,graph,tiny at 10/30/60/90) and
#                                        the 30/70 pair with the daemon planning
#   bash scripts/gpu-check.sh stall      a limited process (STALL_LIMIT, 30) right after a busy
#                                        unlimited neighbour is killed with work queued: its rate per
#                                        0.25 s window against the same process alone
#
#   bash scripts/gpu-check.sh steady meminfo   several phases, one after the other, in one run
#
# Every figure printed is measured in this run.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=$(realpath "${VGPU_DIST:-.device/dist}")
OUT=${OUT:-/tmp/vgpu-gpu-check}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vgpu-gpu.XXXXXX)
export PATH=/usr/local/cuda/bin:$PATH
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || LIBCUDA=/usr/local/nvidia/lib64/libcuda.so.1
LIBDIR=$(dirname "$LIBCUDA")
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PHASES=${*:-mem}

say() { printf '\n=== %s\n' "$*"; }
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

echo "vgpu gpu-check $PHASES, $(now)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "libcuda: $LIBCUDA"

build() { # name, extra cc args
    cc -O2 -Wall -o "$W/$1" "$ROOT/tests/c/$1.c" -I "$ROOT/tests/c" "${@:2}" \
        -L"$LIBDIR" -l:libcuda.so.1 -ldl -lpthread
}
build demo_workload
build bench_launch
cc -O2 -shared -fPIC -o "$W/bench_shim.so" "$ROOT/tests/c/bench_shim.c" -ldl
cc -O1 -DUSE_CUDA_H -I/usr/local/cuda/include -o "$W/hook_mem" "$ROOT/tests/c/hook_mem.c" \
    -L"$LIBDIR" -l:libcuda.so.1 -ldl

# hooked REGION LIMIT cmd... : run cmd under the hook with its own region.
hooked() {
    local region=$1 limit=$2
    shift 2
    env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$region" \
        CUDA_DEVICE_MEMORY_LIMIT="$limit" "$@"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { awk -v k="$1" '{for (i=1;i<NF;i++) if ($i==k) {print $(i+1); exit}}'; }

# apps_used PID: nvidia-smi's used memory (MiB) of a host pid, or empty.
apps_used() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
        awk -F', *' -v p="$1" '$1==p {print $2}'
}

# The arguments, one a line, in random order (as given without shuf).
shuffled() {
    if command -v shuf >/dev/null; then printf '%s\n' "$@" | shuf; else printf '%s\n' "$@"; fi
}

# bench N_REPS LABEL... : interleaved runs of configs defined as functions cfg_<label>;
# each round runs them in a fresh random order, so no configuration always
# runs first (on a cold GPU) or right after another one. The first LABEL is
# the baseline of the ratios.
bench_launch_configs() {
    local reps=$1
    shift
    for c in "$@"; do : >"$W/launch-$c" && : >"$W/alloc-$c"; done
    for ((i = 0; i < reps; i++)); do
        for c in $(shuffled "$@"); do
            out=$("cfg_$c")
            echo "$out" | field launch_ns_per_call >>"$W/launch-$c"
            echo "$out" | field alloc_free_ns_per_pair >>"$W/alloc-$c"
        done
    done
    local base_l base_a
    base_l=$(median <"$W/launch-$1")
    base_a=$(median <"$W/alloc-$1")
    echo "| configuration | launch ns/call (median of $reps) | ratio | alloc+free 1 MiB ns | ratio |"
    echo "|---|---|---|---|---|"
    for c in "$@"; do
        l=$(median <"$W/launch-$c")
        a=$(median <"$W/alloc-$c")
        awk -v c="$c" -v l="$l" -v a="$a" -v bl="$base_l" -v b_a="$base_a" \
            'BEGIN {printf "| %s | %.0f | %.3f | %.0f | %.3f |\n", c, l, l / bl, a, a / b_a}'
    done
}

BENCH_ARGS=${BENCH_ARGS:-200000 2000}
cfg_native() { "$W/bench_launch" $BENCH_ARGS; }
cfg_hook_memlimit() { hooked "$W/bench.cache" 4g "$W/bench_launch" $BENCH_ARGS; }
cfg_hook_nolimit() { LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/bench0.cache" "$W/bench_launch" $BENCH_ARGS; }
# A limit that does not bind (empty kernels keep the GPU well under 90 %
# busy): the limited launch path's own cost.
cfg_hook_smlimit() {
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/bench-sm.cache" \
        CUDA_DEVICE_SM_LIMIT=90 GPU_CORE_UTILIZATION_POLICY=force "$W/bench_launch" $BENCH_ARGS
}
cfg_c_shim() { LD_PRELOAD="$W/bench_shim.so" "$W/bench_launch" $BENCH_ARGS; }

# wait_line FILE PATTERN SECS
wait_line() {
    for ((t = 0; t < $3 * 10; t++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1"
    return 1
}

phase_mem() {
    say "native context size (nvidia-smi, a process holding 256 MiB)"
    sleep 8 | "$W/hook_mem" hold 268435456 >"$W/native-hold.txt" &
    wait_line "$W/native-hold.txt" held 30
    sleep 1
    np=$(pgrep -f "hook_mem hold 268435456" | head -1)
    used=$(apps_used "$np")
    echo "native process $np: nvidia-smi used ${used} MiB => context $((used - 256)) MiB"
    wait

    say "hooked process holding 256 MiB under a 1 GiB limit: hook vs nvidia-smi, and nvidia-smi inside"
    R=$W/hold.cache
    sleep 10 | hooked "$R" 1g "$W/hook_mem" hold 268435456 >"$W/hook-hold.txt" &
    wait_line "$W/hook-hold.txt" held 30
    sleep 1
    hp=$(pgrep -f "hook_mem hold 268435456" | head -1)
    echo "nvidia-smi (outside) used by $hp: $(apps_used "$hp") MiB"
    "$DIST/vgpu" inspect "$R" | sed -n 1,12p
    echo "nvidia-smi inside the hooked container (memory.total, memory.used):"
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$R" CUDA_DEVICE_MEMORY_LIMIT=1g \
        nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$R" CUDA_DEVICE_MEMORY_LIMIT=1g \
        nvidia-smi | grep -E 'MiB' | head -2
    wait

    for lim in 1g 4g; do
        say "C program (driver API), limit $lim: 64 MiB chunks until refused"
        hooked "$W/c-$lim.cache" $lim "$W/demo_workload" | grep -E 'cuMemGetInfo|allocated'
        say "PyTorch, limit $lim: 64 MiB tensors until refused"
        hooked "$W/t-$lim.cache" $lim python3 "$ROOT/scripts/gpu/torch_limit.py" 2>&1 | grep -E 'torch_limit|Error' | tail -2
    done

    say "each counted entry point at a 1 GiB limit: exact OOM edge (hook_mem limit <ep>)"
    for ep in alloc pitch managed create async pool array mipmap graph; do
        printf '%-8s ' "$ep"
        hooked "$W/ep-$ep.cache" 1g "$W/hook_mem" limit $ep 2>&1 | grep -E 'PASS|FAIL|rc' | tail -1
    done
    sleep 8 | hooked "$W/ipc-exp.cache" 1g "$W/hook_mem" ipc_export 4194304 >"$W/ipc.txt" &
    wait_line "$W/ipc.txt" '[0-9a-f]' 30
    hex=$(grep -Eo '[0-9a-f]{128}' "$W/ipc.txt" | head -1)
    printf '%-8s ' ipc
    hooked "$W/ep-ipc.cache" 1g "$W/hook_mem" limit ipc "$hex" 2>&1 | grep -E 'PASS|FAIL|rc' | tail -1
    wait
}

phase_overhead() {
    if [ -n "${VARIANTS:-}" ]; then
        # Each build with a memory limit and CUDA_DEVICE_SM_LIMIT=0, as HAMi
        # sets them, interleaved with the bare driver.
        local v names=()
        for v in $VARIANTS; do
            names+=("mem_${v%%=*}")
            eval "cfg_mem_${v%%=*}() { env LD_PRELOAD=$(realpath "${v#*=}") CUDA_DEVICE_SM_LIMIT=0 \
                CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=\$W/bench-${v%%=*}.cache \
                \"\$W/bench_launch\" \$BENCH_ARGS; }"
        done
        say "launch and alloc cost, native vs each build with a memory limit (interleaved)"
        bench_launch_configs "${REPS:-11}" native "${names[@]}"
        return
    fi
    say "launch and alloc cost, native vs hook with a memory limit (interleaved)"
    bench_launch_configs "${REPS:-11}" native c_shim hook_nolimit hook_memlimit hook_smlimit
    say "driver calls a limited launch adds (native, ns per call)"
    "$W/bench_launch" 1000 10 calls | grep _ns
}

# What cudaMemGetInfo costs under the hook: microseconds
# per call of torch.cuda.mem_get_info (MEMINFO_CALLS, 20000, calls a run),
# native, HAMi-core (HAMI_CORE) and each
# build (VARIANTS, else the dist's), interleaved in a fresh order each round;
# each hooked run has its own region, a 16 GiB limit and CUDA_DEVICE_SM_LIMIT=0
# (as HAMi sets it). The total each run was told shows the hook was in.
phase_meminfo() {
    local reps=${REPS:-5} calls=${MEMINFO_CALLS:-20000} c i v out names=(native)
    local -A lib=()
    if [ -n "${HAMI_CORE:-}" ]; then
        if [ -f "$HAMI_CORE" ]; then
            names+=(hami-core) && lib[hami-core]=$(realpath "$HAMI_CORE")
        else
            echo "HAMI_CORE=$HAMI_CORE: no such file, HAMi-core left out"
        fi
    fi
    for v in ${VARIANTS:-hook=$DIST/libvgpu.so}; do
        names+=("${v%%=*}") && lib[${v%%=*}]=$(realpath "${v#*=}")
    done
    say "cudaMemGetInfo cost (torch.cuda.mem_get_info): us per call ($calls calls, median of $reps, interleaved; hooked: CUDA_DEVICE_MEMORY_LIMIT=16g CUDA_DEVICE_SM_LIMIT=0)"
    for c in "${names[@]}"; do
        : >"$W/mi-$c" && : >"$W/mi-$c.total"
        [ "$c" = native ] || echo "$c: ${lib[$c]}"
    done
    for ((i = 0; i < reps; i++)); do
        for c in $(shuffled "${names[@]}"); do
            local env=()
            [ "$c" = native ] || env=(LD_PRELOAD="${lib[$c]}" CUDA_DEVICE_MEMORY_LIMIT=16g CUDA_DEVICE_SM_LIMIT=0
                CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/mi-$c-$i.cache")
            out=$(env "${env[@]}" python3 -c 'import sys, time, torch
n = int(sys.argv[1])
torch.zeros(1, device="cuda"); free, total = torch.cuda.mem_get_info()
t = time.perf_counter()
for _ in range(n): torch.cuda.mem_get_info()
print((time.perf_counter() - t) / n * 1e6, total >> 20)' "$calls" 2>"$W/mi-$c.err" | tail -1)
            if [[ $out =~ ^[0-9.e+-]+\ [0-9]+$ ]]; then
                echo "${out% *}" >>"$W/mi-$c" && echo "${out#* }" >>"$W/mi-$c.total"
            else
                echo "$c, round $i: no figure; its stderr ends:" && tail -5 "$W/mi-$c.err"
            fi
        done
    done
    local base
    base=$(median <"$W/mi-native")
    echo "| build | us per call (median of $reps) | ratio to native | total MiB told | runs (us) |"
    echo "|---|---|---|---|---|"
    for c in "${names[@]}"; do
        [ -s "$W/mi-$c" ] || { echo "| $c | no figure | | | |" && continue; }
        awk -v c="$c" -v m="$(median <"$W/mi-$c")" -v b="$base" -v t="$(sort -u "$W/mi-$c.total" | tr '\n' ' ')" \
            -v r="$(awk '{printf "%.2f ", $1}' "$W/mi-$c")" \
            'BEGIN {printf "| %s | %.2f | %s | %s| %s|\n", c, m, (b > 0 ? sprintf("%.2f", m / b) : "-"), t, r}'
    done
}

# NCCL's memory at rest (issue 36): two ranks, one per GPU (torch.distributed,
# NCCL, scripts/gpu/nccl_count.py --steady), all-reduce 1 float then 20 times
# STEADY_MIB (1024) MiB, then make no CUDA call at all. From outside (no
# LD_PRELOAD), STEADY_AT (0.5,2.5) s after the later rank's last call: NVML's
# used memory of each rank on its GPU against the hook's count for its slot
# (`vgpu inspect --json`), and the gap. Each build of VARIANTS (else the
# dist's), then HAMi-core (HAMI_CORE, unless STEADY_HAMI=), with NCCL's cuMem
# on (its default) and off (NCCL_CUMEM_ENABLE=0); limits as HAMi sets them
# (CUDA_DEVICE_MEMORY_LIMIT=STEADY_LIMIT, 40g; CUDA_DEVICE_SM_LIMIT=0), a
# fresh region per run, NVLink multicast off. STEADY_ROUNDS (1) repeats:
# take 3 or more to compare builds: a build that looks only when the
# application calls may count a rank's module memory in one run and not in
# the next. STEADY_CUMEM="on" (or "off") runs one of the two only.
phase_steady() {
    local gpus v name lib cm f rc i builds=()
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    [ "$gpus" -ge 2 ] || { echo "steady needs two GPUs ($gpus here)" && return 1; }
    for v in ${VARIANTS:-dist=$DIST/libvgpu.so}; do builds+=("$v"); done
    if [ -n "${HAMI_CORE:-}" ] && [ -n "${STEADY_HAMI-1}" ]; then
        if [ -f "$HAMI_CORE" ]; then builds+=("hami-core=$HAMI_CORE"); else echo "HAMI_CORE=$HAMI_CORE: no such file"; fi
    fi
    mkdir -p "$W/steady" && : >"$W/steady/all"
    for ((i = 0; i < ${STEADY_ROUNDS:-1}; i++)); do
        for cm in ${STEADY_CUMEM:-on off}; do
            for v in "${builds[@]}"; do
                name=${v%%=*} lib=$(realpath "${v#*=}")
                f=$W/steady/$name-$cm-$i
                rm -f "$f.cache"
                say "steady: $name ($lib), NCCL cuMem $cm, round $i"
                local cmenv=()
                [ $cm = off ] && cmenv=(NCCL_CUMEM_ENABLE=0)
                env -u CUDA_VISIBLE_DEVICES -u NCCL_CUMEM_ENABLE LD_PRELOAD="$lib" \
                    CUDA_DEVICE_MEMORY_SHARED_CACHE="$f.cache" CUDA_DEVICE_MEMORY_LIMIT="${STEADY_LIMIT:-40g}" \
                    CUDA_DEVICE_SM_LIMIT=0 NCCL_NVLS_ENABLE=0 "${cmenv[@]}" \
                    timeout -k 10 "${STEADY_TIMEOUT:-240}" python3 "$ROOT/scripts/gpu/nccl_count.py" \
                    "$DIST/vgpu" "$f.cache" "${STEADY_MIB:-1024}" --steady="${STEADY_AT:-0.5,2.5}" >"$f.txt" 2>&1
                rc=$?
                grep -E '^(torch|steady)' "$f.txt"
                [ $rc -eq 0 ] || { echo "rc $rc; the run's output ends:" && grep -v Warning "$f.txt" | tail -15; }
                grep '^steady rank' "$f.txt" | sed "s/^/$name $cm /" >>"$W/steady/all"
            done
        done
    done
    say "steady: NVML per-process used memory against the hook's count for the rank's slot (MiB)"
    echo "| build | cuMem | rank | s after last CUDA call | NVML | counted | gap | context | module | data | other GPUs |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    awk '{for (i = 3; i < NF; i++) v[$i] = $(i + 1)
          printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, v["rank"], v["at"],
              v["nvml"], v["counted"], v["gap"], v["context"], v["module"], v["data"], v["other_gpus"]}' \
        "$W/steady/all"
}

cfg_floor() { with_tracer --floor; }
cfg_trace_table() { with_tracer --interval 1; }
cfg_trace_events() { with_tracer --events; }
cfg_trace_json() { with_tracer --json; }
# with_tracer ARGS: run the benchmark while `vgpu trace ARGS` is attached.
with_tracer() {
    "$DIST/vgpu" trace --libcuda "$LIBCUDA" "$@" >/dev/null 2>"$W/tracer.err" &
    local tp=$!
    wait_line "$W/tracer.err" 'probes on\|attached' 30 >&2
    sleep 0.5
    "$W/bench_launch" $BENCH_ARGS
    kill -INT $tp
    wait $tp 2>/dev/null
}

phase_trace() {
    say "empty-kernel launch cost: native, bare uprobe (floor), vgpu trace views (interleaved)"
    bench_launch_configs 5 native floor trace_table trace_events trace_json

    say "PyTorch launches are all seen by vgpu trace --json"
    mkfifo "$W/go"
    python3 "$ROOT/scripts/gpu/torch_launches.py" 1000 <"$W/go" >"$W/torch.txt" 2>&1 &
    tpid=$!
    exec 9>"$W/go"
    wait_line "$W/torch.txt" ready 120
    "$DIST/vgpu" trace --libcuda "$LIBCUDA" --json --pid $tpid >"$W/torch.jsonl" 2>"$W/tracer.err" &
    trp=$!
    wait_line "$W/tracer.err" 'probes on\|attached' 30
    sleep 0.5
    echo go >&9
    exec 9>&-
    wait_line "$W/torch.txt" launched 60
    sleep 0.5
    kill -INT $trp
    wait $trp 2>/dev/null
    wait $tpid
    seen=$(grep -c '"func":"cuLaunchKernel' "$W/torch.jsonl")
    echo "torch launched $(field launched <"$W/torch.txt") kernels; vgpu trace saw $seen launch calls from pid $tpid"
    grep -o '"func":"[A-Za-z_]*"' "$W/torch.jsonl" | sort | uniq -c

    say "demo: the sample workload under the hook while vgpu trace watches"
    "$DIST/vgpu" trace --libcuda "$LIBCUDA" --json >"$W/demo.jsonl" 2>"$W/tracer.err" &
    trp=$!
    wait_line "$W/tracer.err" 'probes on\|attached' 30
    hooked "$W/demo.cache" 1g "$W/demo_workload"
    sleep 0.5
    kill -INT $trp
    wait $trp 2>/dev/null
    grep -o '"func":"[A-Za-z_0-9]*"' "$W/demo.jsonl" | sort | uniq -c
}

cfg_daemon() { "$W/bench_launch" $BENCH_ARGS; }

phase_daemon() {
    "$DIST/vgpu" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
        >"$W/daemon.log" 2>&1 &
    dp=$!
    for ((t = 0; t < 300; t++)); do
        curl -sf localhost:9396/readyz >/dev/null && break
        sleep 0.1
    done
    echo "daemon ready after ~$((t / 10)) s"

    say "8 PID-namespace containers, each a hooked CUDA program: region hostpid vs nvidia-smi"
    cpids=()
    for i in $(seq 8); do
        (sleep 12 | unshare --pid --fork --mount-proc env LD_PRELOAD="$DIST/libvgpu.so" \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/ctr$i.cache" CUDA_DEVICE_MEMORY_LIMIT=2g \
            "$W/hook_mem" hold 134217728 >"$W/ctr$i.txt" 2>&1) &
        cpids+=($!)
    done
    for i in $(seq 8); do wait_line "$W/ctr$i.txt" held 60; done
    sleep 1.5
    smi_pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | sort -n | tr '\n' ' ')
    echo "nvidia-smi compute pids: $smi_pids"
    ok=0
    for i in $(seq 8); do
        line=$("$DIST/vgpu" inspect --json "$W/ctr$i.cache" |
            python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["regions"][0] if "regions" in d else d; s=[x for x in r["slots"] if x.get("pid")][0]; print(s["pid"], s["hostpid"])')
        set -- $line
        if echo " $smi_pids " | grep -q " $2 "; then ok=$((ok + 1)); m=yes; else m=NO; fi
        echo "container $i: slot pid $1 hostpid $2 listed by nvidia-smi: $m"
    done
    echo "hostpid correct in $ok of 8 containers"
    echo "who recorded them (daemon writes / already right, learnt by the hook):"
    curl -s localhost:9396/metrics | grep -E '^vgpu_hostpid_(fills|verified)_total' 
    wait "${cpids[@]}" # not a bare wait: the daemon runs in the background too

    say "an unhooked CUDA process (no region): daemon finding vs nvidia-smi"
    sleep 12 | "$W/hook_mem" hold 1073741824 >"$W/unhooked.txt" 2>&1 &
    upipe=$!
    wait_line "$W/unhooked.txt" held 30
    up=$(pgrep -f "hook_mem hold 1073741824" | head -1)
    sleep 5 # the daemon gives a process 3 s to register a slot
    echo "nvidia-smi used by $up: $(apps_used "$up") MiB"
    curl -s localhost:9396/findings | python3 -c 'import json,sys
for f in json.load(sys.stdin)["findings"]:
    print({k: f.get(k) for k in ("kind","pid","untracked_bytes","probe_bytes","nvml_bytes","source","message")})'
    curl -s localhost:9396/metrics | grep -E "^vgpu_(untracked|findings)" | head
    wait $upipe

    say "launch cost with the daemon running vs native (interleaved)"
    kill -INT $dp
    wait $dp 2>/dev/null
    : >"$W/launch-native"
    : >"$W/launch-daemon"
    for r in 1 2 3 4 5; do
        cfg_native | field launch_ns_per_call >>"$W/launch-native"
        "$DIST/vgpu" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
            >/dev/null 2>&1 &
        dp=$!
        for ((t = 0; t < 300; t++)); do curl -sf localhost:9396/readyz >/dev/null && break; sleep 0.1; done
        cfg_daemon | field launch_ns_per_call >>"$W/launch-daemon"
        kill -INT $dp
        wait $dp 2>/dev/null
    done
    n=$(median <"$W/launch-native")
    d=$(median <"$W/launch-daemon")
    awk -v n="$n" -v d="$d" 'BEGIN {printf "native %.0f ns, daemon running %.0f ns, ratio %.3f\n", n, d, d / n}'
}

# SM_SWEEP, SM_WORKLOADS, SM_SECONDS narrow the sweep (a diagnostic run);
# LIBCUDA_LOG_LEVEL=4 adds the hook's feedback steps to stderr.
phase_sm() {
    local secs=${SM_SECONDS:-20}
    say "SM limit sweep: throughput share of unlimited and nvidia-smi utilization ($secs s runs)"
    mkdir -p "$W/sm"
    cd "$W/sm" && python3 "$ROOT/scripts/gpu/sm_bench.py" --sweep "${SM_SWEEP:-10,30,60,90}" \
        --workloads "${SM_WORKLOADS:-matmul,tiny,spin,graph}" --hook "$DIST/libvgpu.so" --seconds "$secs"
}

phase_smtiny() {
    local secs=${SM_SECONDS:-20}
    say "SM limit sweep, tiny loop, an unlimited run between limits ($secs s runs)"
    mkdir -p "$W/sm"
    local hooks=() v
    for v in ${VARIANTS:-}; do hooks+=(--hook "$v"); done
    [ ${#hooks[@]} -gt 0 ] || hooks=(--hook "$DIST/libvgpu.so")
    cd "$W/sm" && python3 "$ROOT/scripts/gpu/sm_bench.py" --sweep "${SM_SWEEP:-10,30,60,90}" \
        --workloads tiny --interleave "${hooks[@]}" --rounds "${ROUNDS:-1}" --seconds "$secs" \
        --tiny-elems "${TINY_ELEMS:-4096}"
}

phase_pair() {
    say "two containers at 30 and 70 on one GPU (bf16 matmul): throughput share of solo unlimited"
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --save "$W/base.json"
    # Each build twice: the containers taking turns through a directory
    # they share (HAMi's /tmp/vgpulock in a cluster), then without one.
    local v name lib
    for v in ${VARIANTS:-dist=$DIST/libvgpu.so}; do
        name=${v%%=*} lib=${v#*=}
        mkdir -p "$W/node-$name"
        pair_run "$name, taking turns" "$lib" "$W/node-$name"
        pair_run "$name, time-sliced" "$lib" ""
    done

    say "the same two processes without the hook (time slicing alone): throughput share of solo"
    for i in 1 2; do
        python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --no-smi \
            --baseline "$W/base.json" >"$W/pair-free-$i.txt" 2>&1 &
    done
    wait
    for i in 1 2; do grep 'of unlimited' "$W/pair-free-$i.txt"; done
}

# A container that uses little of its share is not worth taking turns with:
# confined to its turns, a launch-bound loop would lose the host time outside
# them. Each build with a shared node directory, then without one.
phase_mixed() {
    say "a busy container (matmul, limit 30) beside a light one (tiny loop, limit 70): share of solo"
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul,tiny --seconds 10 --save "$W/base.json"
    local v name lib node run
    for v in ${VARIANTS:-dist=$DIST/libvgpu.so}; do
        name=${v%%=*} lib=${v#*=}
        mkdir -p "$W/node-$name"
        for node in "$W/node-$name" ""; do
            run="$name, $([ -n "$node" ] && echo "node dir shared" || echo "no node dir")"
            say "mixed, build $run"
            mixed_one "$lib" "$node" matmul 30
            mixed_one "$lib" "$node" tiny 70
            wait
            for w in matmul tiny; do
                grep 'of unlimited' "$W/mixed-$w.txt" || tail -n 3 "$W/mixed-$w.txt"
                grep -c 'taking turns' "$W/mixed-$w.log" | sed "s/^/  $w: 'taking turns' log lines: /"
                grep 'sm feedback' "$W/mixed-$w.log" | tail -n "${MIXED_LOG_LINES:-0}"
                grep 'share over' "$W/mixed-$w.log" | head -n "${MIXED_LOG_LINES:-0}"
            done
        done
    done
}

# mixed_one LIB NODE_DIR WORKLOAD LIMIT: one container in the background, 20 s.
mixed_one() {
    LD_PRELOAD="$1" CUDA_DEVICE_SM_LIMIT=$4 GPU_CORE_UTILIZATION_POLICY=force \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$(mktemp -d "$W/mixed.XXXX")/$4.cache" \
        VGPU_SM_NODE_DIR="$2" LIBCUDA_LOG_LEVEL=4 \
        python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads "$3" --seconds 20 --no-smi \
        --baseline "$W/base.json" >"$W/mixed-$3.txt" 2>"$W/mixed-$3.log" &
}

# pair_run NAME LIB NODE_DIR: both containers under LIB, 20 s, sharing
# NODE_DIR (VGPU_SM_NODE_DIR; empty: none).
pair_run() {
    local name=$1 lib=$2 node=$3 lim
    say "pair, build $name"
    for lim in 30 70; do
        LD_PRELOAD="$lib" CUDA_DEVICE_SM_LIMIT=$lim GPU_CORE_UTILIZATION_POLICY=force \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$(mktemp -d "$W/pair.XXXX")/$lim.cache" \
            VGPU_SM_NODE_DIR="$node" LIBCUDA_LOG_LEVEL=4 \
            python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 20 --no-smi \
            --baseline "$W/base.json" >"$W/pair-$lim.txt" 2>"$W/pair-$lim.log" &
        echo "limit $lim: pid $!"
    done
    # Per-process SM % (NVML's own attribution) and the device counter, over
    # the middle of the run, for each container's pid.
    sleep 7
    timeout 10 nvidia-smi pmon -s u -d 1 >"$W/pair-pmon.txt" 2>&1 &
    timeout 10 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 \
        >"$W/pair-dev.txt" 2>&1 &
    wait
    for lim in 30 70; do
        echo "limit $lim:"
        cat "$W/pair-$lim.txt"
        grep 'sm feedback' "$W/pair-$lim.log" | tail -n "${PAIR_LOG_LINES:-40}"
        grep 'taking turns\|bucket alone' "$W/pair-$lim.log" | head -n 4
        grep 'turns: charged' "$W/pair-$lim.log" | tail -n "${PAIR_LOG_LINES:-40}"
    done
    echo "nvidia-smi pmon -s u (per process sm %), 10 s in the middle:"
    [ -n "${VARIANTS:-}" ] || cat "$W/pair-pmon.txt"
    awk '$1 == "0" && $4 ~ /^[0-9]+$/ {n[$2]++; s[$2] += $4}
        END {for (p in n) printf "pid %s: sm %% mean %.1f over %d samples\n", p, s[p] / n[p], n[p]}' \
        "$W/pair-pmon.txt"
    awk '/^[0-9]+$/ {n++; s+=$1} END {if (n) printf "device utilization mean %.1f over %d samples\n", s/n, n}' \
        "$W/pair-dev.txt"
}

# PyTorch's launch-bound loop (tiny kernels, 5 s runs, interleaved):
# native, the hook with no limit, and the hook with a limit that does not
# bind (90 %: the loop keeps the GPU ~30 % busy). Kernels/s, median.
phase_pylaunch() {
    say "PyTorch launch-bound loop: kernels/s, native vs hook (no limit, limit 90) (interleaved)"
    local rounds=${REPS:-4} names=(native nolimit limit90) v
    declare -A lib=()
    for v in ${VARIANTS:-}; do
        names+=("${v%%=*}")
        lib[${v%%=*}]=${v#*=}
    done
    for ((i = 0; i < rounds; i++)); do
        for c in $(shuffled "${names[@]}"); do
            case $c in
            native) env=() ;;
            nolimit) env=(LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/py0.cache") ;;
            limit90) env=(LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/py90-$i.cache"
                CUDA_DEVICE_SM_LIMIT=90 GPU_CORE_UTILIZATION_POLICY=force) ;;
            *) env=(LD_PRELOAD="${lib[$c]}" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/py-$c-$i.cache"
                CUDA_DEVICE_SM_LIMIT=90 GPU_CORE_UTILIZATION_POLICY=force) ;;
            esac
            env "${env[@]}" python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads tiny --seconds 5 --no-smi |
                awk '/^tiny/ {print $2}' >>"$W/py-$c"
        done
    done
    for c in "${names[@]}"; do
        printf '%-8s %s kernels/s (runs: %s)\n' "$c" "$(median <"$W/py-$c")" "$(tr '\n' ' ' <"$W/py-$c")"
    done
}

phase_pyab() {
    say "PyTorch launch-bound loop, one process, limit flipped on and off: limited / unlimited rate"
    local v name lib
    for v in "default=$DIST/libvgpu.so" ${VARIANTS:-}; do
        name=${v%%=*} lib=${v#*=}
        echo "build $name:"
        env LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/ab-$name.cache" \
            CUDA_DEVICE_SM_LIMIT=90 GPU_CORE_UTILIZATION_POLICY=force \
            python3 "$ROOT/scripts/gpu/ab_limit.py" --vgpu "$DIST/vgpu" --limits "${AB_LIMITS:-90,60,30,10}" --cycles "${AB_CYCLES:-8}" \
            --elems "${AB_ELEMS:-4096}"
    done
}

# svc_run LABEL SERVICE_ENV TRAINER_ENV: the two processes side by side
# (either env "-": that process does not run), each its own region.
# MONITOR=1: HAMi's monitor's feedback loop (scripts/gpu/hami_monitor.py) watches both.
svc_run() {
    local label=$1 senv=$2 tenv=$3 secs=${PRIO_SECONDS:-12} s="" t="" mp=""
    local sdir tdir pids=()
    sdir=$(mktemp -d "$W/svc.XXXX") tdir=$(mktemp -d "$W/svc.XXXX")
    if [ -n "${MONITOR:-}" ]; then
        python3 "$ROOT/scripts/gpu/hami_monitor.py" "$sdir/s.cache" "$tdir/t.cache" >"$W/monitor.log" 2>&1 &
        mp=$!
    fi
    if [ "$senv" != - ]; then
        env $senv CUDA_DEVICE_MEMORY_SHARED_CACHE="$sdir/s.cache" \
            python3 "$ROOT/scripts/gpu/svc_bench.py" service --seconds "$secs" >"$W/svc-s.txt" 2>"$W/svc-s.log" &
        pids+=($!)
    fi
    if [ "$tenv" != - ]; then
        env $tenv CUDA_DEVICE_MEMORY_SHARED_CACHE="$tdir/t.cache" \
            python3 "$ROOT/scripts/gpu/svc_bench.py" trainer --seconds "$secs" >"$W/svc-t.txt" 2>"$W/svc-t.log" &
        pids+=($!)
    fi
    wait "${pids[@]}"
    if [ -n "$mp" ]; then
        kill "$mp"
        wait "$mp" 2>/dev/null
        sed 's/^/    /' "$W/monitor.log" | head -n 6
    fi
    [ "$senv" != - ] && s=$(cat "$W/svc-s.txt")
    [ "$tenv" != - ] && t=$(awk '{print $2}' "$W/svc-t.txt")
    local share=""
    [ -n "$t" ] && [ -n "${SOLO:-}" ] && share=$(awk -v a="$t" -v b="$SOLO" 'BEGIN {printf "%.1f %%", 100 * a / b}')
    printf '| %s | %s | %s matmuls/s %s |\n' "$label" "${s:--}" "${t:--}" "$share"
    grep -hi 'higher priority\|not a directory\|panicked\|error' "$W/svc-s.log" "$W/svc-t.log" 2>/dev/null | sort | uniq -c | head -n 4
}

# A fresh HAMi node directory (/tmp/vgpulock, shared by both containers),
# the trainer alone (SOLO, the trainer's 100 %), the table's head, the
# service alone and both unhooked (labelled $1): the rows every priority
# table starts with.
svc_baseline() {
    rm -rf /tmp/vgpulock && mkdir -m 0777 /tmp/vgpulock
    SOLO=""
    svc_run "trainer alone" - "X=1"
    SOLO=$(awk '{print $2}' "$W/svc-t.txt")
    echo "| configuration | service | trainer (of alone) |"
    echo "|---|---|---|"
    svc_run "service alone" "X=1" -
    svc_run "$1" "X=1" "X=1"
}

phase_prio() {
    say "service (4 bf16 2048² matmuls + sync every 20 ms) beside a trainer (bf16 4096² matmuls)"
    local hook="LD_PRELOAD=$DIST/libvgpu.so GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    svc_baseline "both unlimited"
    local v name lib
    for v in "dist=$DIST/libvgpu.so" ${VARIANTS:-}; do
        name=${v%%=*} lib=${v#*=}
        hook="LD_PRELOAD=$lib GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
        svc_run "$name: 30 / 70, equal priority" "$hook CUDA_DEVICE_SM_LIMIT=30" "$hook CUDA_DEVICE_SM_LIMIT=70"
    done
    hook="LD_PRELOAD=$DIST/libvgpu.so GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    svc_run "priority 0 / 1, no limits" "$hook CUDA_TASK_PRIORITY=0" "$hook CUDA_TASK_PRIORITY=1"
    # As HAMi's device plugin sets it: 0 without `gpucores`, 100 for a whole
    # share; both mean "no cap" and priority must work as above.
    svc_run "priority 0 / 1, SM limit 0 / 0" "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=0" \
        "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=0"
    svc_run "priority 0 / 1, SM limit 100 / 100" "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=100" \
        "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=100"
    # Without the node's shared directory priority cannot work (the hook
    # warns once per process): the row shows what that looks like.
    rm -rf /tmp/vgpulock
    svc_run "priority 0 / 1, SM limit 100 / 100, no /tmp/vgpulock" \
        "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=100" "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=100"
    mkdir -m 0777 /tmp/vgpulock
    svc_run "priority 0 / 1, 30 / 70" "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=30" \
        "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=70"
    svc_run "service stops: trainer priority 1 alone" - "$hook CUDA_TASK_PRIORITY=1"
    if [ -n "${PRIO_EXTRA:-}" ]; then
        MONITOR=1 svc_run "HAMi monitor: 30 / 70, equal priority" "$hook CUDA_DEVICE_SM_LIMIT=30" \
            "$hook CUDA_DEVICE_SM_LIMIT=70"
        MONITOR=1 svc_run "HAMi monitor: priority 0 / 1, no limits" "$hook CUDA_TASK_PRIORITY=0" \
            "$hook CUDA_TASK_PRIORITY=1"
        MONITOR=1 svc_run "HAMi monitor: priority 0 / 1, 30 / 70" "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=30" \
            "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=70"
        "$DIST/vgpu" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
            >"$W/daemon.log" 2>&1 &
        local dp=$! t
        for ((t = 0; t < 300; t++)); do curl -sf localhost:9396/readyz >/dev/null && break; sleep 0.1; done
        svc_run "vgpu daemon: 30 / 70, equal priority" "$hook CUDA_DEVICE_SM_LIMIT=30" "$hook CUDA_DEVICE_SM_LIMIT=70"
        svc_run "vgpu daemon: priority 0 / 1, no limits" "$hook CUDA_TASK_PRIORITY=0" "$hook CUDA_TASK_PRIORITY=1"
        svc_run "vgpu daemon: priority 0 / 1, 30 / 70" "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=30" \
            "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=70"
        kill -INT $dp
        wait $dp 2>/dev/null
    fi
    rm -rf /tmp/vgpulock
}

# Builds side by side on the priority rule: per round, the service alone,
# then priority 0 / 1 without limits under each of VARIANTS.
phase_prioab() {
    say "priority 0 / 1 without limits, builds alternated (ROUNDS=${ROUNDS:-2})"
    rm -rf /tmp/vgpulock && mkdir -m 0777 /tmp/vgpulock
    SOLO=""
    svc_run "trainer alone" - "X=1"
    SOLO=$(awk '{print $2}' "$W/svc-t.txt")
    local r v name hook
    for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
        svc_run "round $r: service alone" "X=1" -
        for v in ${VARIANTS:-dist=$DIST/libvgpu.so}; do
            name=${v%%=*}
            hook="LD_PRELOAD=${v#*=} GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
            svc_run "round $r: $name, priority 0 / 1" "$hook CUDA_TASK_PRIORITY=0" "$hook CUDA_TASK_PRIORITY=1"
        done
    done
    rm -rf /tmp/vgpulock
}

# HAMi's device plugin always sets CUDA_DEVICE_SM_LIMIT: 0 for a pod without
# gpucores, 100 for a whole share. Both must mean "no cap", with priority kept.
phase_hamish() {
    say "service (priority 0) beside a trainer (priority 1, or none stated: HAMi's default 1) with the limit variable as HAMi sets it"
    local hook="LD_PRELOAD=$DIST/libvgpu.so GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    svc_baseline "both unhooked"
    local lim v name
    for lim in 0 100; do
        svc_run "priority 0 / 1, CUDA_DEVICE_SM_LIMIT=$lim" \
            "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=$lim" \
            "$hook CUDA_TASK_PRIORITY=1 CUDA_DEVICE_SM_LIMIT=$lim"
    done
    svc_run "priority 0 / 1, limit unset" "$hook CUDA_TASK_PRIORITY=0" "$hook CUDA_TASK_PRIORITY=1"
    svc_run "equal priority, CUDA_DEVICE_SM_LIMIT=0" "$hook CUDA_DEVICE_SM_LIMIT=0" "$hook CUDA_DEVICE_SM_LIMIT=0"
    # HAMi sets CUDA_TASK_PRIORITY only for a pod that asks nvidia.com/priority:
    # the trainer states none. VARIANTS: other builds in the same rows.
    for v in "dist=$DIST/libvgpu.so" ${VARIANTS:-}; do
        name=${v%%=*}
        hook="LD_PRELOAD=${v#*=} GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
        for lim in 0 100; do
            svc_run "$name: priority 0 / none stated, CUDA_DEVICE_SM_LIMIT=$lim" \
                "$hook CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=$lim" "$hook CUDA_DEVICE_SM_LIMIT=$lim"
        done
    done
    [ -n "${HAMISH_MIX:-1}" ] || return 0

    say "a limit-30 bf16 matmul beside a limit-0 one (another container, both hooked, /tmp/vgpulock shared)"
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --save "$W/base.json"
    for lim in 30 0; do
        LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_SM_LIMIT=$lim GPU_CORE_UTILIZATION_POLICY=force \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$(mktemp -d "$W/mix.XXXX")/$lim.cache" LIBCUDA_LOG_LEVEL=3 \
            python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 20 --no-smi \
            --baseline "$W/base.json" >"$W/mix-$lim.txt" 2>"$W/mix-$lim.log" &
    done
    wait
    for lim in 30 0; do echo "limit $lim: $(grep 'of unlimited' "$W/mix-$lim.txt")"; done
    rm -rf /tmp/vgpulock
}

# A limited process takes over the GPU from a busy one killed with work
# queued (another container, unlimited): it must get its share at once, not
# pay the dead one's queue as its own GPU time. Per 0.25 s window, its rate
# against the same process alone at the limit.
phase_stall() {
    local lim=${STALL_LIMIT:-30} secs=${STALL_SECONDS:-4} d
    d=$(mktemp -d "$W/stall.XXXX")
    local limited="LD_PRELOAD=$DIST/libvgpu.so GPU_CORE_UTILIZATION_POLICY=force CUDA_DEVICE_SM_LIMIT=$lim"
    say "stall: a process at limit $lim alone, then right after a busy neighbour is killed (kill -9)"
    touch "$d/go-alone"
    env $limited CUDA_DEVICE_MEMORY_SHARED_CACHE="$d/alone.cache" \
        python3 "$ROOT/scripts/gpu/stall_bench.py" measure "$d/go-alone" "$secs" >"$d/alone.txt"
    env $limited CUDA_DEVICE_MEMORY_SHARED_CACHE="$d/b.cache" LIBCUDA_LOG_LEVEL=3 \
        python3 "$ROOT/scripts/gpu/stall_bench.py" measure "$d/go" "$secs" >"$d/after.txt" 2>"$d/after.log" &
    local b=$!
    wait_line "$d/after.txt" ready 60
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_SM_LIMIT=0 CUDA_DEVICE_MEMORY_SHARED_CACHE="$d/a.cache" \
        python3 "$ROOT/scripts/gpu/stall_bench.py" flood >"$d/flood.txt" 2>&1 &
    local a=$!
    wait_line "$d/flood.txt" flooding 60
    sleep 3
    grep queued "$d/flood.txt" | tail -1
    kill -9 $a
    touch "$d/go"
    wait $b
    wait $a 2>/dev/null
    python3 - "$d/alone.txt" "$d/after.txt" <<'PY'
import json, statistics, sys
alone = json.loads(open(sys.argv[1]).read().splitlines()[-1])["windows"]
after = json.loads(open(sys.argv[2]).read().splitlines()[-1])["windows"]
ref = statistics.median(alone)
print(f"alone at the limit: {ref:.0f} matmuls/s (median of {len(alone)} windows of 0.25 s)")
print("after the kill, per 0.25 s window, of alone: " + " ".join(f"{100 * w / ref:.0f}%" for w in after))
print(f"first window {100 * after[0] / ref:.0f} %, first second {100 * statistics.mean(after[:4]) / ref:.0f} %, "
      f"the rest {100 * statistics.mean(after[4:]) / ref:.0f} %")
PY
    grep -hi 'panicked\|error' "$d/after.log" | head -n 3
}

# CUDA_OVERSUBSCRIBE on a nearly full GPU (docs/hook.md, "Oversubscription").
phase_oversub() {
    local free hold ov
    free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
    # The neighbour's own context is about 0.5 GiB: leave 2 GiB free in all.
    hold=$(((free - 2048 - 512) << 20))
    say "unhooked neighbour holds $((hold >> 20)) MiB (free before: $free MiB)"
    mkfifo "$W/neigh.in"
    "$W/hook_mem" hold $hold <"$W/neigh.in" >"$W/neigh.txt" &
    exec 7>"$W/neigh.in"
    wait_line "$W/neigh.txt" held 60
    cat "$W/neigh.txt"
    nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader
    for ov in true unset; do
        say "container, limit 8g, CUDA_OVERSUBSCRIBE=$ov: 6 GiB, then 4 GiB more (past the limit)"
        local R=$W/ov-$ov.cache ovenv=()
        [ "$ov" = true ] && ovenv=(CUDA_OVERSUBSCRIBE=true)
        (sleep 6; echo go; sleep 3) | env "${ovenv[@]}" LIBCUDA_LOG_LEVEL=3 LD_PRELOAD="$DIST/libvgpu.so" \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$R" CUDA_DEVICE_MEMORY_LIMIT=8g \
            "$W/hook_mem" overflow $((6 << 30)) $((4 << 30)) >"$W/ov-$ov.txt" 2>&1 &
        local job=$!
        wait_line "$W/ov-$ov.txt" held 60
        local cp
        cp=$(pgrep -f "hook_mem overflow" | head -1)
        echo "nvidia-smi used by the container ($cp): $(apps_used "$cp") MiB"
        "$DIST/vgpu" inspect --json "$R" | python3 -c 'import json,sys
for s in json.load(sys.stdin)["regions"][0]["slots"]:
    for u in s["usage"]: print("inspect: data_bytes", u["data_bytes"], "host_bytes", u["host_bytes"], "total_bytes", u["total_bytes"])'
        wait $job
        cat "$W/ov-$ov.txt"
    done
    exec 7>&-
    wait
}

# Each client under the hook (16 GiB) in its own region: NVML's figure for the
# process against the hook's count at every stage.
phase_clients() {
    local c
    for c in vllm torch-expandable cupy jax; do
        say "client: $c"
        mkdir -p "$W/clients"
        local run=(python3 "$ROOT/scripts/gpu/mem_clients.py" "$DIST/vgpu" "$W/clients/$c.cache" "$c")
        [ "$c" = vllm ] && run=(python3 "$ROOT/scripts/gpu/vllm_like.py" "$DIST/vgpu" "$W/clients/$c.cache")
        env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=16g \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/clients/$c.cache" "${run[@]}" 2>&1 | grep -v Warning | tail -25
    done
}

# Another process holds all but FREE_GIB (2) of the card; the container
# (8 GiB) trains with and without CUDA_OVERSUBSCRIBE=true. Its loss must
# match the unpressured run's; its device memory stays within what was free.
phase_gpt2oversub() {
    local steps=${GPT2_STEPS:-20}
    mkdir -p "$W/os"
    hook() { # name, extra env...
        local name=$1
        shift
        env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=8g \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/os/$name.cache" LIBCUDA_LOG_LEVEL=3 "$@" \
            python3 "$ROOT/scripts/gpu/gpt2_train.py" --steps "$steps"
    }
    # pressed NAME ENV...: the run under pressure, with its peak device memory
    # (NVML) and host-backed bytes (inspect) sampled every second.
    pressed() {
        local name=$1
        shift
        say "GPT-2 small, 8 GiB limit, under pressure: $*"
        hook "$name" "$@" >"$W/os/$name.txt" 2>&1 &
        local r=$! peak=0 host=0 u h
        while kill -0 $r 2>/dev/null; do
            u=$(apps_used "$(pgrep -f 'gpt2_train.py' | head -1)")
            [ -n "$u" ] && [ "$u" -gt "$peak" ] && peak=$u
            h=$("$DIST/vgpu" inspect --json "$W/os/$name.cache" 2>/dev/null | python3 -c 'import json,sys
d=json.load(sys.stdin); r=d["regions"][0]
print(sum(u.get("host_bytes",0) for s in r["slots"] for u in s["usage"]) >> 20)' 2>/dev/null)
            [ -n "$h" ] && [ "$h" -gt "$host" ] && host=$h
            sleep 1
        done
        grep -E '^(step|gpt2)|Error|error|vgpu' "$W/os/$name.txt" | grep -v Warning | tail -8
        echo "peak device memory of the container's process (NVML): $peak MiB; peak host-backed (inspect): $host MiB"
    }
    say "GPT-2 small under the hook (8 GiB), no pressure, CUDA_OVERSUBSCRIBE=true"
    hook calm CUDA_OVERSUBSCRIBE=true 2>&1 | grep -E '^(step|gpt2)|Error' | tail -8
    say "another process holds all but ${FREE_GIB:-2} GiB of the card"
    python3 - "$W/os/release" "${FREE_GIB:-2}" <<'PY' &
import os, sys, time, torch
free, total = torch.cuda.mem_get_info()
hold = torch.empty(free - (int(sys.argv[2]) << 30), dtype=torch.uint8, device="cuda")
print(f"holder: {hold.numel() >> 20} MiB held, {torch.cuda.mem_get_info()[0] >> 20} MiB free", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
PY
    local hp=$!
    sleep 12
    nvidia-smi --query-gpu=memory.used,memory.free,memory.total --format=csv,noheader
    pressed press CUDA_OVERSUBSCRIBE=true
    # The device filled to the brim (no reserve): what cannot go to host
    # memory has no room (cuDNN's error shows where).
    [ -n "${GPT2_BRIM:-1}" ] && pressed brim CUDA_OVERSUBSCRIBE=true VGPU_OVERSUBSCRIBE_RESERVE=0 \
        CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG=stderr
    say "the same without CUDA_OVERSUBSCRIBE"
    hook plain 2>&1 | grep -E '^(step|gpt2)|Error' | tail -4
    touch "$W/os/release"
    wait $hp
}

# ctr_exec NAME VAR=VALUE... -- CMD...: CMD in a new emulated container: a
# cgroup laid out as the kubelet lays it out (kubepods/burstable/pod<uid>/
# <64-hex id>) and its runtime spec where containerd keeps it (here under
# $W/runtime), whose environment, and CMD's, are the VAR=VALUE pairs. A stand-in
# for the kubelet and containerd; the daemon reads both as on a node.
CG_ROOT=/sys/fs/cgroup/vgpu-gpu-check
ctr_exec() {
    local name=$1 id uid cg envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    id=$(echo "$name-$$-$RANDOM-$(date +%s%N)" | sha256sum | cut -c1-64)
    uid=$(cat /proc/sys/kernel/random/uuid)
    cg="$CG_ROOT/kubepods/burstable/pod$uid/$id"
    mkdir -p "$cg" "$W/runtime/k8s.io/$id"
    python3 -c 'import json, sys; print(json.dumps({"ociVersion": "1.1.0", "process": {"args": ["/bin/app"], "env": sys.argv[1:], "cwd": "/"}, "root": {"path": "rootfs"}}))' \
        "${envs[@]}" >"$W/runtime/k8s.io/$id/config.json"
    sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" env "${envs[@]}" "$@"
}

planner_start() {
    "${PLANNER_BIN:-$DIST/vgpu}" daemon --libcuda "$LIBCUDA" --state-dir "$W/state" --listen 127.0.0.1:9396 \
        --runtime-spec "$W/runtime/*/{id}/config.json" --regions-root "$W/no-hami" --interval 0.2 \
        >"$W/planner.log" 2>&1 &
    PLANNER=$!
    local t
    for ((t = 0; t < 300; t++)); do
        curl -sf localhost:9396/readyz >/dev/null && break
        sleep 0.1
    done
    echo "daemon ready after ~$((t / 10)) s"
}

planner_stop() {
    kill "$PLANNER" 2>/dev/null
    wait "$PLANNER" 2>/dev/null
    PLANNER=""
    grep -i 'error\|panic' "$W/planner.log" | head -n 5
}

# psvc_run LABEL SERVICE_ENV TRAINER_ENV: svc_run's service and trainer, each
# in its own emulated container whose spec is its environment.
psvc_run() {
    local label=$1 secs=${PRIO_SECONDS:-12} s t share
    local sdir tdir
    sdir=$(mktemp -d "$W/psvc.XXXX") tdir=$(mktemp -d "$W/psvc.XXXX")
    local c0="" t0
    t0=$(date +%s.%N)
    [ -n "${PLANNER:-}" ] && [ -d "/proc/$PLANNER" ] && c0=$(awk '{print $14 + $15}' "/proc/$PLANNER/stat")
    ctr_exec svc $2 CUDA_DEVICE_MEMORY_SHARED_CACHE="$sdir/s.cache" -- \
        python3 "$ROOT/scripts/gpu/svc_bench.py" service --seconds "$secs" >"$W/svc-s.txt" 2>"$W/svc-s.log" &
    local a=$!
    ctr_exec trainer $3 CUDA_DEVICE_MEMORY_SHARED_CACHE="$tdir/t.cache" -- \
        python3 "$ROOT/scripts/gpu/svc_bench.py" trainer --seconds "$secs" >"$W/svc-t.txt" 2>"$W/svc-t.log" &
    local b=$!
    sleep $((secs / 2))
    "$DIST/vgpu" turns --state-dir "$W/state" | sed 's/^/    /'
    wait $a $b
    if [ -n "$c0" ]; then
        awk -v c0="$c0" -v c1="$(awk '{print $14 + $15}' "/proc/$PLANNER/stat")" -v t0="$t0" -v t1="$(date +%s.%N)" \
            'BEGIN {printf "    daemon CPU over the run: %.1f %% of a core\n", (c1 - c0) / (t1 - t0)}'
    fi
    s=$(cat "$W/svc-s.txt") t=$(awk '{print $2}' "$W/svc-t.txt")
    share=$(awk -v a="$t" -v b="$SOLO" 'BEGIN {printf "%.1f %%", 100 * a / b}')
    printf '| %s | %s | %s matmuls/s %s |\n' "$label" "${s:--}" "${t:--}" "$share"
    grep -hi 'higher priority\|plans this GPU\|panicked\|error' "$W/svc-s.log" "$W/svc-t.log" 2>/dev/null | sort | uniq -c | head -n 4
}

# planned_pair HOOK: the 30/70 pair, each in its own emulated container
# with HOOK, while a daemon plans (planner_start); `vgpu turns` half-way.
planned_pair() {
    local ppids=() lim
    for lim in 30 70; do
        ctr_exec "pair$lim" LD_PRELOAD="$1" CUDA_DEVICE_SM_LIMIT=$lim GPU_CORE_UTILIZATION_POLICY=force \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$(mktemp -d "$W/pair.XXXX")/$lim.cache" LIBCUDA_LOG_LEVEL=4 -- \
            python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 20 --no-smi \
            --baseline "$W/base.json" >"$W/pair-$lim.txt" 2>"$W/pair-$lim.log" &
        ppids+=($!)
    done
    sleep 10
    "$DIST/vgpu" turns --state-dir "$W/state" | sed 's/^/    /'
    wait "${ppids[@]}"
    for lim in 30 70; do
        echo "limit $lim: $(grep 'of unlimited' "$W/pair-$lim.txt")"
        grep 'taking turns\|bucket alone\|plans this GPU' "$W/pair-$lim.log" | head -n 3
    done
}

# The daemon before and after a change to what confirms a container's
# statement (BEFORE_VGPU, default .device/before-watch/vgpu, against the
# dist's), the same hook (the dist's) under both: the 30/70 pair and a
# priority-0 service beside a trainer at SM limit 0 and 100.
phase_witness() {
    local old=${BEFORE_VGPU:-$ROOT/.device/before-watch/vgpu} bin label lim
    [ -x "$old" ] || { echo "no BEFORE_VGPU at $old"; return 1; }
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --save "$W/base.json"
    svc_baseline "both unhooked"
    local ha="LD_PRELOAD=$DIST/libvgpu.so GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    for bin in "$old" "$DIST/vgpu"; do
        if [ "$bin" = "$old" ]; then label="daemon before"; else label="daemon after"; fi
        PLANNER_BIN=$bin planner_start
        say "the 30/70 pair, $label ($bin)"
        planned_pair "$DIST/libvgpu.so"
        for lim in 0 100; do
            psvc_run "$label: priority 0 / none, CUDA_DEVICE_SM_LIMIT=$lim" \
                "$ha CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=$lim" "$ha CUDA_DEVICE_SM_LIMIT=$lim"
        done
        planner_stop
    done
    find "$CG_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
}

# The SM sweep and the 30/70 pair (the daemon planning) for each build of
# VARIANTS ("name=path/to/libvgpu.so ..."), one build after the other.
phase_sweep() {
    local secs=${SM_SECONDS:-8} v name lib
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --save "$W/base.json"
    for v in ${VARIANTS:-dist=$DIST/libvgpu.so}; do
        name=${v%%=*} lib=${v#*=}
        say "SM limit sweep, $name ($lib, $secs s runs)"
        mkdir -p "$W/sm-$name"
        (cd "$W/sm-$name" && python3 "$ROOT/scripts/gpu/sm_bench.py" --sweep "${SM_SWEEP:-10,30,60,90}" \
            --workloads "${SM_WORKLOADS:-matmul,graph,tiny}" --hook "$lib" --seconds "$secs")
        planner_start
        say "the 30/70 pair, $name, the daemon planning"
        planned_pair "$lib"
        planner_stop
    done
    find "$CG_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
}

phase_planned() {
    local before=${BEFORE:-$ROOT/.device/final/libvgpu.so} after=$DIST/libvgpu.so lim
    [ -f "$before" ] || { echo "no BEFORE build at $before"; return 1; }
    say "the 30/70 pair (bf16 matmul): before ($before, /tmp/vgpulock shared) and after (daemon planning)"
    python3 "$ROOT/scripts/gpu/sm_bench.py" --workloads matmul --seconds 10 --save "$W/base.json"
    mkdir -p "$W/node-before"
    pair_run "before, taking turns" "$before" "$W/node-before"
    planner_start
    say "pair, build after, the daemon planning"
    planned_pair "$after"
    planner_stop

    say "service at priority 0 beside a trainer stating none (HAMi's default 1), limits as HAMi sets them"
    svc_baseline "both unhooked"
    local hb="LD_PRELOAD=$before GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    local ha="LD_PRELOAD=$after GPU_CORE_UTILIZATION_POLICY=force LIBCUDA_LOG_LEVEL=3"
    for lim in 0 100; do
        svc_run "before: priority 0 / none, CUDA_DEVICE_SM_LIMIT=$lim, /tmp/vgpulock" \
            "$hb CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=$lim" "$hb CUDA_DEVICE_SM_LIMIT=$lim"
    done
    rm -rf /tmp/vgpulock
    planner_start
    for lim in 0 100; do
        psvc_run "after: priority 0 / none, CUDA_DEVICE_SM_LIMIT=$lim, daemon planning" \
            "$ha CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=$lim" "$ha CUDA_DEVICE_SM_LIMIT=$lim"
    done
    planner_stop
    psvc_run "after, no daemon: priority 0 / none, CUDA_DEVICE_SM_LIMIT=0" \
        "$ha CUDA_TASK_PRIORITY=0 CUDA_DEVICE_SM_LIMIT=0" "$ha CUDA_DEVICE_SM_LIMIT=0"
    find "$CG_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
}

for PHASE in $PHASES; do "phase_$PHASE"; done
echo "done $(now)"
rm -rf "$W"
