//! The hook's one view of the driver: what its policy code (the memory
//! accounting, the SM limiter, the entry points' routing) asks the real
//! CUDA driver and NVML on its own behalf, behind a few narrow traits so
//! that every part of it can be unit-tested against [`fake`] (under
//! `cfg(test)`) and runs on [`native::Native`] (over the safe wrappers of
//! `crate::real`) in the process.
//!
//! - [`Context`]: the calling thread's current context and its device, the
//!   one place the hook computes "the current device".
//! - [`Events`]: timing events and stream capture (the SM limiter).
//! - [`Memory`]: the frees the hook makes on its own behalf, memory info,
//!   and the size of an allocation (the calls the entry points forward
//!   come from the exports, one closure each).
//! - [`Nvml`]: what NVML measures (used memory, processes, utilization).
//! - [`DeviceIds`]: the devices CUDA and NVML list, by UUID (what the
//!   container's device table, `crate::devices`, is built from; in `ids`,
//!   which imports nothing of the driver, since `native` translates each
//!   device through that table).
//! - [`Contexts`]: taking back a context the hook could not count.
//!
//! Each user asks for the few it needs: the SM limiter for `Context`,
//! `Events` and `Nvml` (with the outside world besides the driver:
//! `crate::world`), the memory accounting for `Context`, `Memory` and
//! `Nvml`, the launch entry points for `Context`. The entry points hand
//! their policy code [`live()`], the process's driver; only the SM
//! limiter's one controller names its type.

#![forbid(unsafe_code)]

#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod ids;
pub(crate) mod native;

use crate::ffi::{CUcontext, CUdevice, CUdeviceptr, CUresult};
pub(crate) use ids::DeviceIds;
/// The driver's error, as the real layer names it (one exhaustive map).
pub(crate) use native::{see_single_device, CuError};

/// An event's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    Ready,
    NotReady,
    /// Destroyed context, driver error: drop the sample.
    Failed,
}

/// The calling thread's current context and its device.
pub(crate) trait Context: Sync {
    /// The container index (`crate::devices`) of the current context's
    /// device, asked of the driver.
    fn current_device(&self) -> Option<usize>;
    /// The current context (as an opaque key) and its device's container
    /// index; the device may be remembered per thread while the context
    /// stays the same (the launch path's query: no syscall).
    fn current(&self) -> Option<(usize, usize)>;
    /// The current context alone, as the same opaque key (`None`: no
    /// context): what an object made now dies with (`cuCtxDestroy`).
    fn context(&self) -> Option<usize> {
        self.current().map(|(ctx, _)| ctx)
    }
    /// The process's only device, when it sees one (no driver query).
    fn only_device(&self) -> Option<usize> {
        None
    }
    /// The device a launch runs on: the only one when the process sees one
    /// (a container is most often given one GPU), else the current
    /// context's.
    fn launch_device(&self) -> Option<usize> {
        self.only_device()
            .or_else(|| self.current().map(|(_, dev)| dev))
    }
}

/// The real driver's timing events, in the current context; never the
/// hooked exports.
pub(crate) trait Events: Context {
    /// A timing event in the current context.
    fn create_event(&self) -> Option<usize>;
    fn destroy_event(&self, ev: usize);
    /// Two timing events (start, end) in the current context, or none.
    fn create_pair(&self) -> Option<(usize, usize)> {
        let a = self.create_event()?;
        match self.create_event() {
            Some(b) => Some((a, b)),
            None => {
                self.destroy_event(a);
                None
            }
        }
    }
    fn record(&self, ev: usize, stream: usize) -> bool;
    fn query(&self, ev: usize) -> Poll;
    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64>;
    /// `stream` is being captured into a graph (or the driver cannot say):
    /// its launches do not run now, and an event recorded into it would
    /// become part of the graph.
    fn capturing(&self, _stream: usize) -> bool {
        false
    }
}

/// Device memory the hook frees or measures on its own behalf (taking back
/// what it could not count, the room left on the device). The calls the
/// entry points forward are not here: each export passes its policy
/// function the call that forwards it (`crate::exports`).
pub(crate) trait Memory: Sync {
    /// `cuMemFree_v2`.
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult;
    /// `cuIpcCloseMemHandle`.
    fn ipc_close(&self, ptr: CUdeviceptr) -> CUresult;
    /// `(free, total)` bytes of the current context's device
    /// (`cuMemGetInfo_v2`); `None` when the driver cannot say.
    fn mem_info(&self) -> Option<(usize, usize)>;
    /// The size of the allocation that contains `ptr`.
    fn allocation_size(&self, ptr: CUdeviceptr) -> Option<u64>;
    /// Pinned host memory of `bytes` mapped into the device's address
    /// space (portable), as an address.
    fn host_alloc_mapped(&self, bytes: usize) -> Result<usize, CuError>;
    /// The device address of mapped host memory at `host`.
    fn host_device_pointer(&self, host: usize) -> Result<CUdeviceptr, CuError>;
    /// Frees host memory from [`Memory::host_alloc_mapped`].
    fn free_host(&self, host: usize) -> Result<(), CuError>;
}

/// Taking back a context the hook could not count (the driver made it, the
/// limit refused it).
pub(crate) trait Contexts: Sync {
    /// `cuCtxDestroy_v2` of `ctx`.
    fn destroy_context(&self, ctx: CUcontext) -> CUresult;
    /// `cuDevicePrimaryCtxRelease_v2` of `dev`'s primary context.
    fn release_primary(&self, dev: CUdevice) -> CUresult;
}

/// What NVML measures.
pub(crate) trait Nvml: Sync {
    /// Device-wide used memory of container device `dev`.
    fn device_used(&self, _dev: usize) -> Option<u64> {
        None
    }
    /// `(host pid, used bytes)` of the processes NVML lists on `dev`;
    /// entries whose memory is not available are left out.
    fn processes(&self, _dev: usize) -> Option<Vec<(u32, u64)>> {
        None
    }
    /// NVML's per-process SM samples `(host pid, sm %)` of `dev` since
    /// `since_us` (Unix µs; 0 = all it has); `None` when NVML cannot say.
    fn proc_util(&self, _dev: usize, _since_us: u64) -> Option<Vec<(u32, u32)>> {
        None
    }
    /// The device's own utilization since `since_us` (percent of the time
    /// a kernel ran, what `nvidia-smi` shows) and the host pids of every
    /// compute process on it; `None` when NVML cannot say.
    fn device_busy(&self, _dev: usize, _since_us: u64) -> Option<(f64, Vec<u32>)> {
        None
    }
}

/// Everything the hook asks the driver.
pub(crate) trait Driver: Context + Events + Memory + Nvml + DeviceIds + Contexts {}

impl<T: Context + Events + Memory + Nvml + DeviceIds + Contexts> Driver for T {}

/// The process's real driver, as the entry points hand it to their policy
/// code (a unit type: each call is a direct, inlinable one).
#[inline]
pub(crate) fn live() -> &'static impl Driver {
    &native::Native
}
