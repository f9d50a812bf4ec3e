#!/bin/sh
# Lays out the simulated driver as `cargo xtask build` does, for working on
# the simulator without xtask:
#   $CARGO_TARGET_DIR/dist/sim/{libcuda.so.1,libnvidia-ml.so.1,simgpu-server}
# Usage: CARGO_TARGET_DIR=target-sim tests/simgpu/make-dist.sh
set -eu
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
cargo build -p simgpu -p simgpu-cuda -p simgpu-nvml
mkdir -p "$target/dist/sim"
cp -f "$target/debug/libcuda.so" "$target/dist/sim/libcuda.so.1"
cp -f "$target/debug/libnvidia_ml.so" "$target/dist/sim/libnvidia-ml.so.1"
cp -f "$target/debug/simgpu-server" "$target/dist/sim/simgpu-server"
echo "$target/dist/sim"
