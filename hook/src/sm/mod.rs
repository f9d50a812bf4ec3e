//! The SM (compute) limit: `CUDA_DEVICE_SM_LIMIT` as a share of the GPU's
//! time for the whole container (docs/sm-limit.md).
//!
//! Every launch entry point calls [`before_launch`] before forwarding to the
//! driver and [`after_launch`] with the driver's result. Each launch is
//! charged its learnt standalone GPU time against a container-wide bucket
//! refilled at `limit % × wall time` (`bucket`, shared through `sidecar`);
//! costs are learnt per launch key from sampled event timings (`cost`); the
//! region's limit, policy switch and the monitor's priority feedback are
//! re-read every 50 ms (`policy`); `control` ties it together over `sys`.
//!
//! With no limit the launch path is a coarse clock read and a few relaxed
//! loads: no lock, no syscall, no driver call. With a limit, a launch whose
//! cost is known adds two driver queries (context, capture), one clock read
//! and one CAS on the bucket, still no lock (`local`).
//!
//! Limited containers that share a GPU and each use most of their share
//! (`demand`) take turns on it (`phase`), agreed through a table in a
//! directory all containers of the node share (`node`): a GPU time-slicing
//! between two busy contexts loses device time that neither gets.

pub mod bucket;
pub mod control;
pub mod cost;
mod demand;
pub mod feedback;
mod local;
mod mapfile;
pub mod node;
pub mod phase;
pub mod policy;
mod prio;
pub mod sidecar;
pub mod sys;
#[cfg(test)]
mod tests;
mod tuning;
mod turns;

use std::ffi::c_uint;
use std::sync::OnceLock;

use crate::ffi::{CUfunction, CUresult, CUstream, CUDA_SUCCESS};

pub use control::{Controller, Ticket, Work};
pub use cost::Key;

/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;

/// Which launch entry point was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchKind {
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
pub struct Launch {
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
    /// `gridX * gridY * gridZ`.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

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

/// Starts, once per process, the thread that runs the feedback loop's
/// steps off the launch path (`Controller::background`); `false` when it
/// cannot be started (the steps then run on the launch path). Called only
/// when a step is due (every 500 ms at most); a forked child, which has no
/// copy of its parent's thread, starts its own.
fn background_started() -> bool {
    use std::sync::atomic::AtomicU32;
    use std::sync::atomic::Ordering::{Acquire, Release};
    use std::sync::Mutex;
    static OWNER: AtomicU32 = AtomicU32::new(0);
    static STARTING: Mutex<()> = Mutex::new(());
    let pid = std::process::id();
    if OWNER.load(Acquire) == pid {
        return true;
    }
    // Another thread is starting it (or a fork caught the lock held): this
    // step runs inline.
    let Ok(_g) = STARTING.try_lock() else {
        return false;
    };
    if OWNER.load(Acquire) == pid {
        return true;
    }
    let period = std::time::Duration::from_nanos(feedback::PERIOD_NS / 10);
    match std::thread::Builder::new()
        .name("vgpu-sm".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            controller().background();
        }) {
        Ok(_) => {
            OWNER.store(pid, Release);
            true
        }
        Err(e) => {
            vlog_once!(
                crate::log::WARN,
                "cannot start the SM feedback thread ({e}); its steps run on the launch path"
            );
            false
        }
    }
}

fn controller() -> &'static Controller<sys::Real> {
    static C: OnceLock<Controller<sys::Real>> = OnceLock::new();
    C.get_or_init(|| Controller::new(sys::Real::default()))
}

/// Called before every launch; may sleep (throttling, or the monitor blocks
/// the container). Hand the result to [`after_launch`].
#[inline]
pub fn before_launch(launch: &Launch) -> Option<Ticket> {
    controller().before(&launch.work())
}

/// Called after every launch with the driver's result. Returns the device
/// the limiter found the launch on, if it looked (so the caller need not
/// ask the driver again).
#[inline]
pub fn after_launch(ticket: Option<Ticket>, rc: CUresult) -> Option<usize> {
    let t = ticket?;
    let dev = t.dev();
    controller().after(t, rc == CUDA_SUCCESS);
    Some(dev)
}
