//! What the region says, as the launch path reads it: the limits, whether
//! they are enforced, the monitor's blocking and the container's priority,
//! re-read at most every `REFRESH_NS` by one thread (`policy` has the
//! rules). A refresh also marks the container's activity for HAMi's
//! monitor and notes the host pid once a device is limited.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64};

use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use super::policy;
use super::sys::{Clock, Container, NodeTable};
use super::tuning::{BLOCK_SLEEP_NS, REFRESH_NS};

/// The settings in force, shared by the launching threads.
#[derive(Debug)]
pub(crate) struct Settings {
    next_refresh: AtomicU64,
    refreshing: AtomicBool,
    /// Bit per device with a limit, or every device when ranked (its
    /// launches are accounted).
    limited: AtomicU32,
    enforce: AtomicBool,
    blocked: AtomicBool,
    limits: [AtomicU32; MAX_DEVICES],
    /// Unix seconds of this process's last `last_kernel_time` write.
    last_secs: AtomicU64,
    host_pid_noted: AtomicBool,
    /// Takes part in the node's priorities without a limit
    /// (`NodeTable::ranked`).
    ranked: AtomicBool,
    /// The region's `priority` (HAMi's; 0 high).
    priority: AtomicI32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            next_refresh: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            limited: AtomicU32::new(0),
            enforce: AtomicBool::new(false),
            blocked: AtomicBool::new(false),
            limits: std::array::from_fn(|_| AtomicU32::new(0)),
            last_secs: AtomicU64::new(0),
            host_pid_noted: AtomicBool::new(false),
            ranked: AtomicBool::new(false),
            priority: AtomicI32::new(1),
        }
    }
}

impl Settings {
    /// Whether a refresh is due at `now`.
    pub(crate) fn due(&self, now: u64) -> bool {
        now >= self.next_refresh.load(Relaxed)
    }

    /// Re-reads the region (one thread at a time) and marks activity; then
    /// hands the region and this process's slot to `also` (publishing).
    pub(crate) fn refresh<S: Container + Clock + NodeTable>(
        &self,
        sys: &S,
        now: u64,
        also: impl FnOnce(&SharedRegion, usize, u32),
    ) {
        if self.refreshing.swap(true, Acquire) {
            return;
        }
        self.next_refresh
            .store(now.saturating_add(REFRESH_NS), Relaxed);
        if let Some((region, slot)) = sys.region() {
            let s = policy::read(region, sys.policy());
            for (d, l) in s.limits.iter().enumerate() {
                self.limits[d].store(*l, Relaxed);
            }
            self.enforce.store(s.enforce, Relaxed);
            let ranked = sys.ranked();
            self.ranked.store(ranked, Relaxed);
            self.priority.store(region.priority.load(Relaxed), Relaxed);
            // Ranked without a limit, every device is accounted: its launches
            // are published to (or held by) the node's other containers.
            let all = (1u32 << MAX_DEVICES) - 1;
            let mask = s.limited_mask() | if ranked { all } else { 0 };
            self.limited.store(mask, Relaxed);
            if s.limited_mask() != 0 && !self.host_pid_noted.swap(true, Relaxed) {
                sys.note_host_pid();
            }
            self.blocked.store(s.blocked, Relaxed);
            if !s.blocked {
                policy::mark_activity(region, sys.unix_secs(), &self.last_secs);
            }
            also(region, slot, mask);
        }
        self.refreshing.store(false, Release);
    }

    /// Sleeps while the monitor blocks the container (`recent_kernel < 0`),
    /// if the last refresh found it blocked.
    pub(crate) fn wait_unblocked<S: Container + Clock>(&self, sys: &S) {
        if !self.blocked.load(Relaxed) {
            return;
        }
        while let Some((region, _)) = sys.region() {
            if region.recent_kernel.load(Relaxed) >= 0 {
                policy::unblocked(region);
                break;
            }
            sys.sleep_until(sys.now().saturating_add(BLOCK_SLEEP_NS));
        }
        self.blocked.store(false, Relaxed);
    }

    /// Bit per accounted device.
    pub(crate) fn limited(&self) -> u32 {
        self.limited.load(Relaxed)
    }

    /// The limit on `dev` (0: none).
    pub(crate) fn limit(&self, dev: usize) -> u32 {
        self.limits[dev].load(Relaxed)
    }

    /// The limit on `dev` while it is enforced (0: none or not enforced).
    pub(crate) fn enforced(&self, dev: usize) -> u32 {
        let pct = self.limit(dev);
        if pct != 0 && self.enforce.load(Relaxed) {
            pct
        } else {
            0
        }
    }

    pub(crate) fn ranked(&self) -> bool {
        self.ranked.load(Relaxed)
    }

    pub(crate) fn priority(&self) -> i32 {
        self.priority.load(Relaxed)
    }
}
