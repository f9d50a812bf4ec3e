//! The process's real world behind the traits of `crate::world`: the OS
//! clocks, this process's PID namespace, the region it attached
//! (`crate::state`), the container's sidecar (with the daemon's plan), the
//! node lock and the background thread.

use std::sync::OnceLock;

use vgpu_common::clock::{clock_ns, sleep_until_monotonic};
use vgpu_common::region::SharedRegion;

use super::nodelock::NodeLock;
use super::{background, pid_namespace, Background, Clock, Identity, Job, NodeFiles};
use crate::sidecar::{self, SmShared};

/// The process's real world.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Host;

impl Clock for Host {
    #[inline]
    fn now(&self) -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC)
    }

    #[inline]
    fn coarse(&self) -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC_COARSE)
    }

    fn unix_secs(&self) -> u64 {
        clock_ns(libc::CLOCK_REALTIME) / 1_000_000_000
    }

    fn sleep_until(&self, t: u64) {
        sleep_until_monotonic(t);
    }

    fn unix_us(&self) -> u64 {
        clock_ns(libc::CLOCK_REALTIME) / 1_000
    }
}

impl Identity for Host {
    fn pid(&self) -> u32 {
        std::process::id()
    }

    fn own_host_pid(&self) -> Option<u32> {
        pid_namespace::own_host_pid()
    }

    fn own_ns_pid(&self) -> Option<u32> {
        pid_namespace::own_ns_pid()
    }

    fn policy(&self) -> i32 {
        crate::config::get().policy
    }

    fn priority_stated(&self) -> bool {
        crate::config::get().priority_stated
    }
}

/// The buckets the process limits itself on, chosen once.
static BUCKETS: OnceLock<&'static SmShared> = OnceLock::new();

impl NodeFiles for Host {
    fn region(&self) -> Option<(&SharedRegion, usize)> {
        let p = crate::state::process()?;
        Some((p.att.region(), p.att.slot_index()))
    }

    fn buckets(&self) -> &'static SmShared {
        BUCKETS.get_or_init(|| {
            // The configuration names the sidecar (`sidecar::set_region_path`).
            let _ = crate::config::get();
            sidecar::shared().unwrap_or_else(|| {
                vlog!(
                    crate::log::ERROR,
                    "the sidecar above cannot be used: each process of the container takes its part of the SM limit (limit / live processes)"
                );
                sidecar::private()
            })
        })
    }

    fn buckets_shared(&self) -> bool {
        let b = self.buckets();
        sidecar::shared().is_some_and(|s| std::ptr::eq(s, b))
            && !crate::sigbus_guard::is_lost(b as *const SmShared as *const u8)
    }

    fn follow_files(&self, now: u64) {
        crate::sigbus_guard::follow_replaced(now);
    }

    fn note_host_pid(&self) {
        if pid_namespace::in_initial_pid_ns() {
            if let Some(p) = crate::state::process() {
                p.att.set_host_pid(std::process::id());
            }
        }
    }

    fn shared_ctx_size(&self, dev: usize) -> Option<u64> {
        sidecar::shared()?.devs.get(dev)?.ctx_bytes()
    }

    fn set_shared_ctx_size(&self, dev: usize, bytes: u64) {
        if let Some(d) = sidecar::shared().and_then(|s| s.devs.get(dev)) {
            d.set_ctx_bytes(bytes);
        }
    }

    fn node_lock(&self) -> Option<NodeLock> {
        NodeLock::take()
    }
}

impl Background for Host {
    fn offload(&self, job: Job, run: fn()) -> bool {
        background::ensure(job, run)
    }

    #[inline]
    fn offload_failed(&self) -> bool {
        background::failed()
    }
}
