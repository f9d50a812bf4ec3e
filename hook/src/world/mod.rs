//! The hook's one view of the outside world besides the driver (which is
//! `crate::driver`): what its policy code (the SM limiter, the memory
//! accounting) asks of the process's host, behind a few narrow traits so
//! that every part of it can be unit-tested against [`fake`] (under
//! `cfg(test)`, with the one test clock) and runs on [`host::Host`] in the
//! process.
//!
//! - [`Clock`]: clocks and sleeping.
//! - [`Identity`]: who this process is in its container: its PIDs, and
//!   what the container's configuration says of it (policy, priority).
//! - [`NodeFiles`]: the files it shares with the container and the node:
//!   the region and its slot, the sidecar (buckets, plans, measured context
//!   sizes) and the node-wide lock.
//! - [`Background`]: where work whose cost must stay off the launch and
//!   allocation paths runs (`background`, the process's one thread).
//!
//! [`World`] is all of them. The real pieces (the thread, the PID
//! namespace, the node lock) live beside the traits; `host` composes them
//! with the region's attachment (`crate::state`) and the sidecar
//! (`crate::sidecar`).

#![forbid(unsafe_code)]

pub(crate) mod background;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod host;
pub(crate) mod nodelock;
pub(crate) mod pid_namespace;

use vgpu_common::region::SharedRegion;
use vgpu_common::sidecar::SmShared;

pub(crate) use background::Job;
use nodelock::NodeLock;

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

/// Who this process is in its container.
pub(crate) trait Identity: Sync {
    /// This process's pid (as seen here; it only tells leaders apart).
    fn pid(&self) -> u32;
    /// This process's host PID when it is known without a guess (the
    /// process runs in the initial PID namespace).
    fn own_host_pid(&self) -> Option<u32>;
    /// This process's PID in its own PID namespace when that is not the
    /// initial one: the PID the driver lists it under to its own
    /// container's callers (R580 does; older drivers may list host PIDs).
    fn own_ns_pid(&self) -> Option<u32>;
    /// `GPU_CORE_UTILIZATION_POLICY`.
    fn policy(&self) -> i32;
    /// Whether the process states a priority (`CUDA_TASK_PRIORITY`): it
    /// then accounts its launches wherever a daemon plans, so that the
    /// daemon can hold lower-priority containers while it is active.
    fn priority_stated(&self) -> bool;
}

/// The files this process shares with its container and the node.
pub(crate) trait NodeFiles: Sync {
    /// The region and this process's slot.
    fn region(&self) -> Option<(&SharedRegion, usize)>;
    /// The container's buckets (the sidecar's, else private ones).
    fn buckets(&self) -> &'static SmShared;
    /// Whether [`Self::buckets`] are shared by the container's processes;
    /// false when this process limits itself on private ones (the sidecar
    /// could not be used, or was lost and could not be re-attached): it
    /// then takes only its part of the container's limit
    /// (`limit_policy::part`).
    fn buckets_shared(&self) -> bool;
    /// Re-attaches the shared files renamed over since `now` last came
    /// round (`crate::sigbus_guard::follow_replaced`: at most a `stat` each
    /// a second), so that every process of the container shares the newest
    /// sidecar.
    fn follow_files(&self, now: u64);
    /// Fills this process's slot `hostpid` when its host pid is known
    /// without a guess (it runs in the initial PID namespace).
    fn note_host_pid(&self);
    /// The context size of `dev` measured by another process of the
    /// container (the sidecar).
    fn shared_ctx_size(&self, dev: usize) -> Option<u64>;
    /// Shares an exactly measured context size with the container.
    fn set_shared_ctx_size(&self, dev: usize, bytes: u64);
    /// Serialises context measurement node-wide (`/tmp/vgpulock/lock`).
    fn node_lock(&self) -> Option<NodeLock>;
}

/// Where work whose cost must stay off the launch and allocation paths
/// runs.
pub(crate) trait Background: Sync {
    /// Has the process's background thread run `run` as `job` from now on;
    /// `false` when there is no such thread (the caller then does the work
    /// itself, or goes without). Not for the launch or allocation path in
    /// the common case: the real one reads the PID (a system call).
    fn offload(&self, job: Job, run: fn()) -> bool;
    /// Whether starting the thread failed in this process (one atomic
    /// load).
    fn offload_failed(&self) -> bool;
}

/// Everything the hook needs from the outside world besides the driver.
pub(crate) trait World: Clock + Identity + NodeFiles + Background {}

impl<T: Clock + Identity + NodeFiles + Background> World for T {}

/// The process's real world, as the entry points hand it to their policy
/// code (a unit type: each call is a direct, inlinable one).
#[inline]
pub(crate) fn live() -> &'static impl World {
    &host::Host
}
