//! What the limiter needs from the outside world besides the driver, behind
//! narrow traits so the controller can be tested with a fake clock and a
//! fake GPU, and each part asks only for what it uses: `Clock` (clocks and
//! sleeping), `Container` (the region, policy, buckets and the daemon's
//! plan in them) and `Background` (where the feedback steps run). The driver's part (the current context, timing
//! events, NVML's measurements) is `crate::driver`, shared with the rest of
//! the hook. `Sys` is all of them, for the controller that composes the
//! parts. The process's real world is `live`.

#![forbid(unsafe_code)]

use vgpu_common::region::SharedRegion;
use vgpu_common::sidecar::SmShared;

use crate::driver::{Events, Nvml};

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
    /// Whether the process states a priority (`CUDA_TASK_PRIORITY`): it
    /// then accounts its launches wherever a daemon plans, so that the
    /// daemon can hold lower-priority containers while it is active.
    fn priority_stated(&self) -> bool {
        false
    }
    /// Fills this process's slot `hostpid` when its host pid is known
    /// without a guess (it runs in the initial PID namespace).
    fn note_host_pid(&self) {}
}

/// Where the feedback loop's steps run.
pub(crate) trait Background: Sync {
    /// Whether a background thread runs the feedback steps
    /// (`Controller::background`), so that its NVML calls (milliseconds
    /// each) never delay a launch; else they run on the launch path.
    fn offload(&self) -> bool {
        false
    }
}

/// Everything the controller needs from the outside world.
pub(crate) trait Sys: Clock + Events + Nvml + Container + Background {}

impl<T: Clock + Events + Nvml + Container + Background> Sys for T {}
