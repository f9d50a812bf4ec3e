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

use crate::driver;
use crate::driver::Context;
use crate::ffi::*;
use crate::sm::{after_launch, before_launch, Launch, LaunchKind};
use crate::state::Process;

/// Runs `call` between the limiter's two hook points.
#[inline]
fn limited(launch: Launch, call: impl FnOnce() -> CUresult) -> CUresult {
    crate::suspend::ensure_running();
    let ticket = before_launch(&launch);
    let rc = call();
    let limited_on = after_launch(ticket, rc);
    launched(driver::live(), crate::state::attached(), limited_on, rc);
    rc
}

/// After a launch that returned `rc`: a process that only launches (it
/// allocated once) publishes its usage again after a truncation of the
/// region (two relaxed loads), and a successful launch is counted in the
/// slot of `p` (this process's state, if attached) on the device the
/// limiter found it on (`limited_on`), else the one `d` names.
#[inline]
fn launched(d: &impl Context, p: Option<&Process>, limited_on: Option<usize>, rc: CUresult) {
    let slot = p.and_then(|p| {
        p.att.republish_if_wiped();
        p.att.slot()
    });
    count_launch(rc, slot, || limited_on.or_else(|| d.launch_device()));
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
    ($name:ident, $kind:expr, $per_thread:expr $(, $extra:ident)?) => {
        #[expect(clippy::too_many_arguments, reason = "the C signature of a grid launch")]
        pub fn $name(
            forward: impl FnOnce() -> CUresult,
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            _shmem: c_uint,
            stream: CUstream,
            _params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            let l = kernel($kind, f, [gx, gy, gz], [bx, by, bz], stream, $per_thread);
            limited(l, forward)
        }
    };
}

grid_launch!(launch_kernel, LaunchKind::Kernel, false, _extra);
grid_launch!(launch_kernel_ptsz, LaunchKind::Kernel, true, _extra);
grid_launch!(launch_cooperative, LaunchKind::Cooperative, false);
grid_launch!(launch_cooperative_ptsz, LaunchKind::Cooperative, true);

/// `cuLaunchKernelEx` and its `_ptsz` twin differ only in the
/// per-thread-stream flag.
macro_rules! ex_launch {
    ($name:ident, $per_thread:expr) => {
        pub fn $name(
            forward: impl FnOnce() -> CUresult,
            config: *const c_void,
            f: CUfunction,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            limited(ex(config, f, $per_thread), forward)
        }
    };
}

ex_launch!(launch_kernel_ex, false);
ex_launch!(launch_kernel_ex_ptsz, true);

/// `cuGraphLaunch` and its `_ptsz` twin, likewise.
macro_rules! graph_launch {
    ($name:ident, $per_thread:expr) => {
        pub fn $name(
            forward: impl FnOnce() -> CUresult,
            exec: CUgraphExec,
            stream: CUstream,
        ) -> CUresult {
            let l = kernel(LaunchKind::Graph, exec, [0; 3], [0; 3], stream, $per_thread);
            limited(l, forward)
        }
    };
}

graph_launch!(graph_launch, false);
graph_launch!(graph_launch_ptsz, true);

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

    /// A launch is counted on the device the limiter found it on, else the
    /// process's only device, else the current context's (the driver's
    /// answers); a failed one, or one without process state, counts nothing.
    #[test]
    fn a_launch_is_counted_on_the_device_the_driver_names() {
        use crate::driver::fake::FakeDriver;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache").display().to_string();
        let cfg = crate::config::Config::from_lookup(move |k| {
            (k == "CUDA_DEVICE_MEMORY_SHARED_CACHE").then(|| path.clone())
        });
        let p = Process::new(&cfg, std::process::id() as i32, 0).unwrap();
        let slot = p.att.slot().unwrap();
        let launches = |dev: usize| slot.used[dev].launches.load(SeqCst);
        let on_two = FakeDriver::on(2);
        launched(&on_two, Some(&p), None, CUDA_SUCCESS);
        launched(&on_two, Some(&p), Some(1), CUDA_SUCCESS);
        let only_three = FakeDriver {
            only: Some(3),
            ..FakeDriver::on(2)
        };
        launched(&only_three, Some(&p), None, CUDA_SUCCESS);
        assert_eq!((launches(1), launches(2), launches(3)), (1, 1, 1));
        launched(&on_two, Some(&p), None, 1);
        launched(&FakeDriver::default(), Some(&p), None, CUDA_SUCCESS);
        launched(&on_two, None, None, CUDA_SUCCESS);
        assert_eq!(
            (launches(0), launches(1), launches(2), launches(3)),
            (0, 1, 1, 1)
        );
    }
}
