//! Launch entry points: each waits while the process is suspended
//! (`suspend::ensure_running`), asks the SM limiter (`sm::before_launch`,
//! which may sleep), forwards, and reports the result
//! (`sm::after_launch`, which closes a timing sample). A successful launch
//! is counted in the process's slot on its device (`vgpu top`'s
//! launches/s): one relaxed increment, nothing without a slot; the device
//! is the one the limiter found, or without asking the driver the only one
//! when the process sees one device, else the current context's.

#![forbid(unsafe_code)]

use std::ffi::{c_uint, c_void};

use vgpu_common::region::ProcSlot;

use crate::ffi::*;
use crate::real::cuda::{launch as real, status};
use crate::sm::{after_launch, before_launch, Launch, LaunchKind};

/// Runs `call` between the limiter's two hook points.
fn limited(launch: Launch, call: impl FnOnce() -> CUresult) -> CUresult {
    crate::suspend::ensure_running();
    let ticket = before_launch(&launch);
    let rc = call();
    let limited_on = after_launch(ticket, rc);
    // A process that only launches (it allocated once) publishes its usage
    // again here after a truncation of the region: two relaxed loads.
    let slot = crate::state::attached().and_then(|p| {
        p.att.republish_if_wiped();
        p.att.slot()
    });
    count_launch(rc, slot, || limited_on.or_else(launch_device));
    rc
}

/// The device a launch runs on: the only one when the process sees one (a
/// container is most often given one GPU: no driver query), else the
/// current context's.
#[inline]
fn launch_device() -> Option<usize> {
    if let Some(i) = crate::sm::single_device() {
        return Some(i);
    }
    crate::sm::current_context_device().map(|(_, dev)| dev)
}

/// Counts a successful launch in `slot` (this process's, if it has one) on
/// the device `device` names (`launch_device`; a test's own).
#[inline]
fn count_launch(rc: CUresult, slot: Option<&ProcSlot>, device: impl FnOnce() -> Option<usize>) {
    if rc != CUDA_SUCCESS {
        return;
    }
    if let (Some(slot), Some(dev)) = (slot, device()) {
        crate::region::usage::count_launch(slot, dev);
    }
}

fn kernel(
    kind: LaunchKind,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    per_thread: bool,
) -> Launch {
    Launch {
        kind,
        func: f,
        grid,
        block,
        stream,
        per_thread,
    }
}

/// `CUlaunchConfig`: grid, block and stream of `cuLaunchKernelEx`.
#[derive(Clone, Copy)]
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
}

fn ex(config: *const c_void, f: CUfunction, per_thread: bool) -> Launch {
    let (grid, block, stream) = read(config as *const LaunchConfig)
        .map_or(([0; 3], [0; 3], std::ptr::null_mut()), |c| {
            (c.grid, c.block, c.stream)
        });
    kernel(LaunchKind::KernelEx, f, grid, block, stream, per_thread)
}

/// The grid launches (`cuLaunchKernel`, `cuLaunchCooperativeKernel` and
/// their `_ptsz` twins) differ only in the driver symbol, the kind, the
/// per-thread-stream flag and `cuLaunchKernel`'s trailing `extra`.
macro_rules! grid_launch {
    ($name:ident => $real:ident, $kind:expr, $per_thread:expr $(, $extra:ident)?) => {
        #[expect(clippy::too_many_arguments, reason = "the C signature of a grid launch")]
        pub fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shmem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            let l = kernel($kind, f, [gx, gy, gz], [bx, by, bz], stream, $per_thread);
            limited(l, || {
                real::$real(f, [gx, gy, gz], [bx, by, bz], shmem, stream, params $(, $extra)?)
            })
        }
    };
}

grid_launch!(launch_kernel => kernel, LaunchKind::Kernel, false, extra);
grid_launch!(launch_kernel_ptsz => kernel_ptsz, LaunchKind::Kernel, true, extra);
grid_launch!(launch_cooperative => cooperative, LaunchKind::Cooperative, false);
grid_launch!(
    launch_cooperative_ptsz => cooperative_ptsz,
    LaunchKind::Cooperative,
    true
);

pub fn launch_kernel_ex(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    limited(ex(config, f, false), || {
        real::kernel_ex(config, f, params, extra)
    })
}

pub fn launch_kernel_ex_ptsz(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    limited(ex(config, f, true), || {
        real::kernel_ex_ptsz(config, f, params, extra)
    })
}

fn graph(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Launch {
    kernel(LaunchKind::Graph, exec, [0; 3], [0; 3], stream, per_thread)
}

pub fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limited(graph(exec, stream, false), || {
        status(real::graph(exec, stream))
    })
}

pub fn graph_launch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limited(graph(exec, stream, true), || {
        status(real::graph_ptsz(exec, stream))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use vgpu_common::view::RegionFile;

    use super::*;

    #[test]
    fn successful_launches_count_per_device_failed_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        let slot = &f.region().procs[3];
        let launches = |dev: usize| slot.used[dev].launches.load(SeqCst);
        for _ in 0..5 {
            count_launch(CUDA_SUCCESS, Some(slot), || Some(1));
        }
        count_launch(CUDA_SUCCESS, Some(slot), || Some(0));
        // A failed launch, or one with no current device, counts nothing.
        count_launch(1, Some(slot), || Some(0));
        count_launch(CUDA_SUCCESS, Some(slot), || None);
        assert_eq!((launches(0), launches(1), launches(2)), (1, 5, 0));
        // An out-of-range device, or no slot, neither counts nor panics.
        count_launch(CUDA_SUCCESS, Some(slot), || Some(usize::MAX));
        count_launch(CUDA_SUCCESS, None, || Some(0));
        assert_eq!(launches(0), 1);
        // Other slots and the usage counters stay untouched.
        assert_eq!(f.region().procs[2].used[1].launches.load(SeqCst), 0);
        assert_eq!(slot.used[1].total.load(SeqCst), 0);
    }
}
