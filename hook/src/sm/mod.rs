//! The SM (compute) limit: `CUDA_DEVICE_SM_LIMIT` as a share of the GPU's
//! time for the whole container (docs/sm-limit.md).
//!
//! Every launch entry point calls [`before_launch`] before forwarding to the
//! driver and [`after_launch`] with the driver's result. `controller`
//! composes the parts, each a folder named for its concept, over the
//! driver's traits (`crate::driver`) and the world's (`crate::world`):
//!
//! - `settings`: what the region says (limits, policy, the monitor's
//!   blocking), re-read every 50 ms; `settings::limit_policy` has the rules.
//! - `cost_learning`: each launch key's standalone GPU time from sampled
//!   event timings (`cost`, the process's table; `thread_cache`, the
//!   launching thread's lock-free copy).
//! - `admission`: the charge on the container-wide bucket refilled at
//!   `limit % × wall time` (`gcra`, shared through `sidecar`) or in the
//!   container's turn, and `coast`, the path of a container far under its
//!   limit.
//! - `correction`: the one factor that corrects the learnt costs' error,
//!   from NVML (`nvml_feedback`, `nvml_share`) or from the turns' own
//!   events (`turn_measure`).
//! - `node_sharing`: the node's table (`node_mapping`), turns between
//!   containers that each use most of their share (`demand`, `phase`) and
//!   priorities (`priority`).
//! - `published_share`: the process's share in its slot, for HAMi's
//!   monitor.
//!
//! The tuned constants are in `tuning`. Only [`controller()`] names the
//! real driver and world, to build the process's one controller. With no limit the launch path is a coarse clock read and a few
//! relaxed loads: no lock, no syscall, no driver call. With a limit far from
//! binding, the same plus a lookup in the thread's cache of costs and two
//! relaxed atomics of the process. Near the limit, a launch whose cost is
//! known adds two driver queries (context, capture), one clock read and one
//! CAS on the bucket, still no lock.

#![forbid(unsafe_code)]

mod admission;
mod controller;
mod correction;
mod cost_learning;
mod node_sharing;
mod published_share;
mod settings;
#[cfg(test)]
mod tests;
pub(crate) mod tuning;

use std::ffi::c_uint;
use std::sync::OnceLock;

use crate::ffi::{CUfunction, CUresult, CUstream, CUDA_SUCCESS};

use crate::driver::native::Native;
use crate::world::host::Host;
use controller::{Controller, Ticket, Work};
use cost_learning::cost::Key;

/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;

/// Which launch entry point was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaunchKind {
    /// `cuLaunchKernel`.
    Kernel,
    /// `cuLaunchKernelEx` (grid from `CUlaunchConfig`).
    KernelEx,
    /// `cuLaunchCooperativeKernel`.
    Cooperative,
    /// `cuGraphLaunch` (`func` is the `CUgraphExec`).
    Graph,
}

/// One launch as the limiter sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub kind: LaunchKind,
    /// The `CUfunction`, or the `CUgraphExec` of a graph launch.
    pub func: CUfunction,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    /// The application's stream, unchanged.
    pub stream: CUstream,
    /// The `_ptsz` (per-thread default stream) variant was called.
    pub per_thread: bool,
}

impl Launch {
    fn work(&self) -> Work {
        let key = match self.kind {
            LaunchKind::Graph => Key::Graph {
                exec: self.func as usize,
            },
            _ => Key::Kernel {
                func: self.func as usize,
                grid: self.grid,
                block: self.block,
            },
        };
        let stream = if self.stream.is_null() && self.per_thread {
            STREAM_PER_THREAD
        } else {
            self.stream as usize
        };
        Work { key, stream }
    }
}

/// The process's limiter, over the real driver and world.
fn controller() -> &'static Controller<Native, Host> {
    static C: OnceLock<Controller<Native, Host>> = OnceLock::new();
    C.get_or_init(|| Controller::with_background(Native, Host, || controller().background()))
}

/// Called before every launch; may sleep (throttling, or the monitor blocks
/// the container). Hand the result to [`after_launch`].
#[inline]
pub(crate) fn before_launch(launch: &Launch) -> Option<Ticket> {
    controller().before(&launch.work())
}

/// Called after every launch with the driver's result. Returns the device
/// the limiter found the launch on, if it looked (so the caller need not
/// ask the driver again).
#[inline]
pub(crate) fn after_launch(ticket: Option<Ticket>, rc: CUresult) -> Option<usize> {
    let t = ticket?;
    let dev = t.dev();
    controller().after(t, rc == CUDA_SUCCESS);
    Some(dev)
}
