#!/usr/bin/env bash
# Builds HAMi-core's libvgpu.so (https://github.com/Project-HAMi/HAMi-core) from
# its source tree, on the GPU machine, as a baseline for the benchmarks only
# (its source is never part of this repository; keep it under the ignored .device/).
#   bash scripts/gpu/build_hami_core.sh SRC OUT      -> OUT/libvgpu.so, OUT/build.txt
# The options are those of HAMi-core's build.sh, which its Dockerfile and CI
# use: DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE,
# HOOK_NVML_ENABLE, CMAKE_BUILD_TYPE=Debug (-g, no -O: what HAMi ships;
# HAMI_BUILD_TYPE=Release for -fvisibility=hidden, stripped).
# With cmake and make it configures and builds only the library's target
# (HAMI_BUILD=gcc skips that); without them, or if that fails, it compiles
# the C sources its CMakeLists name directly with the same flags, include
# directories and generated config/static_config.h, linked as its CMake
# links (-lcuda -lnvidia-ml, the toolkit's stubs) plus -ldl -lpthread.
# SRC/.hami-commit, if present, names the commit (an exported tree has no .git).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SRC OUT" >&2 && exit 2; }
SRC=$(realpath "$1")
OUT=$(realpath -m "$2")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
TYPE=${HAMI_BUILD_TYPE:-Debug}
mkdir -p "$OUT"
B=$(mktemp -d /tmp/hami-build.XXXXXX)
LOG=$OUT/build.txt
commit=$(cat "$SRC/.hami-commit" 2>/dev/null || git -C "$SRC" log -1 --format=%H 2>/dev/null || echo unknown)
# Built from a copy outside any git work tree: its CMake would otherwise take
# the enclosing repository's commit and branch for its own.
cp -a "$SRC" "$B/src"
SRC=$B/src
echo "HAMi-core $commit, $TYPE, from $1, $(date -u +%Y-%m-%dT%H:%M:%SZ)" | tee "$LOG"
echo "tools: $(for t in cmake make gcc nvcc; do printf '%s=%s ' $t "$(command -v $t || echo none)"; done)" | tee -a "$LOG"
gcc --version | head -1 | tee -a "$LOG"

# Where -lcuda and -lnvidia-ml come from: the toolkit's stubs (the CUDA devel
# image HAMi builds in puts them on LIBRARY_PATH), else the driver's own.
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || LIBCUDA=/usr/local/nvidia/lib64/libcuda.so.1
LIBDIR=$(dirname "$LIBCUDA")
STUBS=$CUDA_HOME/lib64/stubs
[ -d "$STUBS" ] || STUBS=$CUDA_HOME/targets/x86_64-linux/lib/stubs
if [ -f "$STUBS/libcuda.so" ] && [ -f "$STUBS/libnvidia-ml.so" ]; then
    LINK=(-L"$STUBS" -lcuda -lnvidia-ml)
    export LIBRARY_PATH=$STUBS${LIBRARY_PATH:+:$LIBRARY_PATH}
else
    LINK=(-L"$LIBDIR" -l:libcuda.so.1 -l:libnvidia-ml.so.1)
    export LIBRARY_PATH=$LIBDIR${LIBRARY_PATH:+:$LIBRARY_PATH}
fi

if [ "$TYPE" = Debug ]; then
    FLAGS=(-shared -fPIC -g -D_GNU_SOURCE -Wall)
else
    FLAGS=(-shared -fPIC -D_GNU_SOURCE -fvisibility=hidden -Wall)
fi

built=
if [ "${HAMI_BUILD:-auto}" != gcc ] && command -v cmake >/dev/null && command -v make >/dev/null; then
    echo "building with cmake (target vgpu)" | tee -a "$LOG"
    # CMAKE_POLICY_VERSION_MINIMUM: cmake 4 refuses its cmake_minimum_required(2.8.11) otherwise.
    if (mkdir -p "$B/cmake" && cd "$B/cmake" && cmake "$SRC" -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 \
        -DHOOK_NVML_ENABLE=1 -DCMAKE_BUILD_TYPE="$TYPE" -DTEST_DEVICE_ID=0 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
        make -j"$(nproc)" vgpu) >>"$LOG" 2>&1 && [ -f "$B/cmake/libvgpu.so" ]; then
        built=$B/cmake/libvgpu.so
    else
        echo "cmake build failed (its log above in $LOG); compiling directly" | tee -a "$LOG"
        tail -20 "$LOG"
    fi
fi

if [ -z "$built" ]; then
    echo "building with gcc directly" | tee -a "$LOG"
    D=$B/direct
    mkdir -p "$D/config" "$D/obj"
    # config/static_config.h as cmake's configure_file writes it for build.sh's options.
    sed -E -e 's/^#cmakedefine (MULTIPROCESS_LIMIT_ENABLE|DLSYM_HOOK_ENABLE|HOOK_MEMINFO_ENABLE|HOOK_NVML_ENABLE)$/#define \1/' \
        -e 's/^#cmakedefine ([A-Za-z0-9_]+)$/\/* #undef \1 *\//' \
        -e 's/@GIT_HASH@//' -e 's/@GIT_BRANCH@/unknown/' \
        "$SRC/src/static_config.h.in" >"$D/config/static_config.h"
    cat "$D/config/static_config.h" >>"$LOG"
    # The sources: the library's own (src/CMakeLists.txt) and its OBJECT modules.
    srcs=()
    for f in $(sed -n 's/^add_library(${LIBVGPU} SHARED \([^$]*\).*/\1/p' "$SRC/src/CMakeLists.txt"); do
        srcs+=("src/$f")
    done
    for m in multiprocess allocator cuda nvml; do
        for f in $(sed -n 's/^add_library([a-z_]* OBJECT \(.*\))/\1/p' "$SRC/src/$m/CMakeLists.txt" | tr ' ' '\n' | awk 'NF && !s[$0]++'); do
            srcs+=("src/$m/$f")
        done
    done
    [ ${#srcs[@]} -gt 8 ] || { echo "could not read the source list from its CMakeLists (${srcs[*]})" | tee -a "$LOG" && exit 1; }
    echo "sources: ${srcs[*]}" | tee -a "$LOG"
    objs=()
    for f in "${srcs[@]}"; do
        o=$D/obj/$(echo "$f" | tr / _).o
        (cd "$SRC" && gcc "${FLAGS[@]}" -I"$CUDA_HOME/include" -I"$SRC/src" -I"$D/config" -c "$f" -o "$o") >>"$LOG" 2>&1 &
        objs+=("$o")
    done
    fail=0
    for j in $(jobs -p); do wait "$j" || fail=1; done
    if [ $fail -ne 0 ]; then
        echo "compile failed:" && grep -E 'error|Error' "$LOG" | head -30
        exit 1
    fi
    gcc "${FLAGS[@]}" -o "$D/libvgpu.so" "${objs[@]}" "${LINK[@]}" -ldl -lpthread >>"$LOG" 2>&1 ||
        { echo "link failed:" && tail -20 "$LOG" && exit 1; }
    [ "$TYPE" = Debug ] || strip -x "$D/libvgpu.so"
    built=$D/libvgpu.so
fi

cp "$built" "$OUT/libvgpu.so"
echo "warnings: $(grep -c 'warning:' "$LOG" || true)" | tee -a "$LOG"
ls -l "$OUT/libvgpu.so" | tee -a "$LOG"
echo "needs: $(readelf -d "$OUT/libvgpu.so" | awk '/NEEDED/ {printf "%s ", $NF}')" | tee -a "$LOG"
echo "exports cuMemGetInfo_v2: $(nm -D --defined-only "$OUT/libvgpu.so" | grep -c ' cuMemGetInfo_v2$')" | tee -a "$LOG"
rm -rf "$B"
