//! What the limiter needs from the outside world, behind narrow traits so
//! the controller can be tested with a fake clock and a fake GPU, and each
//! part asks only for what it uses: `Clock` (clocks and sleeping),
//! `Events` (the current context's device and timing events, always the
//! real driver's, never the hooked exports; all that `turns` and `prio`
//! need), `Container` (the region, policy and buckets), `Nvml` (the
//! feedback loop's measurements, and where its steps run) and `NodeTable`
//! (the node's table and how this process uses it). Each part of the
//! controller asks for the few it uses; `Sys` is all of them, for the
//! controller that composes the parts. The process's real world is `live`.

#![forbid(unsafe_code)]

use vgpu_common::node::NodeFile;
use vgpu_common::region::SharedRegion;
use vgpu_common::sidecar::SmShared;

/// An event's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    Ready,
    NotReady,
    /// Destroyed context, driver error: drop the sample.
    Failed,
}

/// Clocks and sleeping.
pub(crate) trait Clock: Sync {
    /// CLOCK_MONOTONIC, ns.
    fn now(&self) -> u64;
    /// A cheaper clock of a few ms resolution (same epoch as `now`).
    fn coarse(&self) -> u64;
    fn unix_secs(&self) -> u64;
    /// Sleeps until `now() >= t` (or a little past it).
    fn sleep_until(&self, t: u64);
    /// CLOCK_REALTIME, µs (NVML's sample time base).
    fn unix_us(&self) -> u64 {
        self.unix_secs().saturating_mul(1_000_000)
    }
}

/// The current context and the real driver's timing events.
pub(crate) trait Events: Sync {
    /// The current context (as an opaque key) and its device's container
    /// index (`crate::devices`).
    fn current(&self) -> Option<(usize, usize)>;
    /// The process's only device, when it sees one (no driver query).
    fn only_device(&self) -> Option<usize> {
        None
    }
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

/// The container's shared state: its region, policy and buckets.
pub(crate) trait Container: Sync {
    /// The region and this process's slot.
    fn region(&self) -> Option<(&SharedRegion, usize)>;
    /// `GPU_CORE_UTILIZATION_POLICY`.
    fn policy(&self) -> i32;
    /// The container's buckets.
    fn buckets(&self) -> &'static SmShared;
    /// Whether [`Self::buckets`] are shared by the container's processes;
    /// false when this process limits itself on private ones (the sidecar
    /// could not be used, or was lost and could not be re-attached): it
    /// then takes only its part of the container's limit (`limit_policy::part`).
    fn buckets_shared(&self) -> bool {
        true
    }
    /// This process's pid (as seen here; it only tells leaders apart).
    fn pid(&self) -> u32 {
        std::process::id()
    }
    /// Re-attaches the shared files renamed over since `now` last came
    /// round (`crate::sigbus_guard::follow_replaced`: at most a `stat` each a
    /// second), so that every process of the container shares the newest
    /// sidecar.
    fn follow_files(&self, _now: u64) {}
    /// Fills this process's slot `hostpid` when its host pid is known
    /// without a guess (it runs in the initial PID namespace).
    fn note_host_pid(&self) {}
}

/// What NVML measures (the feedback loop).
pub(crate) trait Nvml: Sync {
    /// NVML's per-process SM samples `(host pid, sm %)` of CUDA device
    /// `dev` since `since_us` (Unix µs; 0 = all it has); `None` when NVML
    /// cannot say (the loop then stays open).
    fn proc_util(&self, _dev: usize, _since_us: u64) -> Option<Vec<(u32, u32)>> {
        None
    }
    /// The device's own utilization since `since_us` (percent of the time
    /// a kernel ran, what `nvidia-smi` shows) and the host pids of every
    /// compute process on it; `None` when NVML cannot say.
    fn device_busy(&self, _dev: usize, _since_us: u64) -> Option<(f64, Vec<u32>)> {
        None
    }
    /// Whether a background thread runs the feedback steps
    /// (`Controller::background`), so that its NVML calls (milliseconds
    /// each) never delay a launch; else they run on the launch path.
    fn offload(&self) -> bool {
        false
    }
}

/// The node's table of containers on a GPU, and how this process uses it.
pub(crate) trait NodeTable: Sync {
    /// The node's table of limited containers on CUDA device `dev`, shared
    /// with the other containers of the node; `None` when there is none.
    fn node(&self, _dev: usize) -> Option<&'static NodeFile> {
        None
    }
    /// Whether limited containers take turns in the node's table (else it
    /// only ranks them by priority).
    fn turns(&self) -> bool {
        true
    }
    /// Whether the process takes part in the node's priorities even
    /// without a limit (`CUDA_TASK_PRIORITY` set and a node directory).
    fn ranked(&self) -> bool {
        false
    }
}

/// Everything the controller needs from the outside world.
pub(crate) trait Sys: Clock + Events + Container + Nvml + NodeTable {}

impl<T: Clock + Events + Container + Nvml + NodeTable> Sys for T {}
