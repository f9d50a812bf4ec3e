//! Exported control and introspection functions for tests (not part of the
//! CUDA API; resolve them with `dlsym`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::state::with;

static KERNEL_NS: AtomicU64 = AtomicU64::new(0);

/// The per-process kernel duration override (0 = none).
pub(crate) fn kernel_ns_override() -> u64 {
    KERNEL_NS.load(Ordering::Relaxed)
}

/// `simgpu_set_kernel_ns(ns)`: from now on every kernel of this process
/// lasts `ns` nanoseconds (unless its name is `busy_<N>…`); 0 restores the
/// model (`SIMGPU_KERNEL_NS` or geometry).
#[no_mangle]
pub extern "C" fn simgpu_set_kernel_ns(ns: u64) {
    KERNEL_NS.store(ns, Ordering::Relaxed);
}

/// `simgpu_launch_count(dev)`: kernels this process launched on `dev`
/// (graph kernel nodes count one each); 0 before `cuInit`.
#[no_mangle]
pub extern "C" fn simgpu_launch_count(dev: u32) -> u64 {
    slot_counter(dev, |s, d| s.launches[d].load(Ordering::Relaxed))
}

/// `simgpu_busy_ns(dev)`: kernel nanoseconds this process queued on `dev`.
#[no_mangle]
pub extern "C" fn simgpu_busy_ns(dev: u32) -> u64 {
    slot_counter(dev, |s, d| s.busy_ns[d].load(Ordering::Relaxed))
}

/// Driver entry points this process called (every `cu…` export that runs
/// through `guard`).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Counts one driver call (`guard`).
pub(crate) fn count_call() {
    CALLS.fetch_add(1, Ordering::Relaxed);
}

/// `simgpu_driver_calls()`: the driver API calls this process made so far,
/// the application's and any interposer's alike (what a hook adds per
/// launch is the difference from a run without it).
#[no_mangle]
pub extern "C" fn simgpu_driver_calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// `simgpu_host_pid()`: this process's PID as the simulated driver (and
/// NVML) reports it, i.e. the host PID; 0 before `cuInit`.
#[no_mangle]
pub extern "C" fn simgpu_host_pid() -> u32 {
    std::panic::catch_unwind(|| with(|d| Ok(d.client.host_pid())).unwrap_or(0)).unwrap_or(0)
}

fn slot_counter(dev: u32, f: impl Fn(&simgpu::shm::Slot, usize) -> u64) -> u64 {
    if dev >= simgpu::config::MAX_DEVICES {
        return 0;
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        with(|d| Ok(d.shm().slot(d.slot).map_or(0, |s| f(s, dev as usize)))).unwrap_or(0)
    }))
    .unwrap_or(0)
}
