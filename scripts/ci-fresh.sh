#!/usr/bin/env bash
# `.ci/run` as CI runs it on a new machine: a fresh clone of this checkout's
# HEAD, an empty CARGO_HOME whose bin/ holds only rustup and its proxy links
# (as a new machine's ~/.cargo/bin does) first on PATH, and an empty target
# directory. It then runs `.ci/run` a second time in the same clone, which
# must pass too (setup finds everything present, the build is warm).
#
#   bash scripts/ci-fresh.sh [DIR]      # DIR defaults to a new /tmp/vgpu-fresh.*
#   RUNS=1 bash scripts/ci-fresh.sh     # only the first, fresh run
#
# What it cannot empty: packages installed system-wide (apt, pip, bpf-linker
# under /usr/local) by an earlier run on this machine, and rustup's toolchains.
# Each run's log and timing land in DIR/run1.log, DIR/run2.log.
set -euo pipefail
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
dir=${1:-$(mktemp -d /tmp/vgpu-fresh.XXXXXX)}
mkdir -p "$dir/cargo/bin"
rm -rf "$dir/repo"
git clone --quiet "$src" "$dir/repo"
rustup_bin=$(readlink -f "$(command -v rustup)")
cp "$rustup_bin" "$dir/cargo/bin/rustup"
for proxy in cargo cargo-clippy cargo-fmt cargo-miri clippy-driver rls rust-analyzer \
    rust-gdb rust-gdbgui rust-lldb rustc rustdoc rustfmt; do
    ln -sf rustup "$dir/cargo/bin/$proxy"
done
export CARGO_HOME="$dir/cargo"
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export PATH="$CARGO_HOME/bin:$PATH"
unset CARGO_TARGET_DIR
echo "fresh CI run of $(git -C "$dir/repo" rev-parse --short HEAD) in $dir"
for n in $(seq 1 "${RUNS:-2}"); do
    start=$(date +%s)
    if bash "$dir/repo/.ci/run" >"$dir/run$n.log" 2>&1; then rc=0; else rc=$?; fi
    secs=$(($(date +%s) - start))
    echo "run $n: exit $rc in ${secs} s (log: $dir/run$n.log)"
    if [ "$rc" -ne 0 ]; then
        tail -n 40 "$dir/run$n.log"
        exit "$rc"
    fi
done
