//! What the region says, as the launch path reads it: the limits, whether
//! they are enforced, the monitor's blocking and the container's priority,
//! re-read at most every `REFRESH_NS` by one thread (`limit_policy` has the
//! rules). A refresh also marks the container's activity for HAMi's
//! monitor and notes the host pid once a device is limited.
//!
//! A container that states a priority is ranked (its launches accounted,
//! its activity stated in its plan line) wherever the daemon plans its
//! GPUs. One that states none (HAMi sets `CUDA_TASK_PRIORITY` only for a
//! pod that asks `nvidia.com/priority`) is ranked while the daemon's plan
//! holds it for a higher one: then its launches are held; otherwise they
//! keep the unlimited path, with nothing published.

#![forbid(unsafe_code)]

pub(super) mod limit_policy;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

use vgpu_common::region::rules::{self, SmLimit};
use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use crate::sm::node_sharing::Sharing;
use crate::sm::tuning::{BLOCK_SLEEP_NS, REFRESH_NS};
use crate::world::{Clock, NodeFiles, World};

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
    /// Per device, as `rules::sm_limit_cell` encodes it.
    limits: [AtomicU32; MAX_DEVICES],
    /// Unix seconds of this process's last `last_kernel_time` write.
    last_secs: AtomicU64,
    host_pid_noted: AtomicBool,
    /// Takes part in the node's priorities without a limit: stated where a
    /// daemon plans, or held by the plan now.
    ranked: AtomicBool,
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
    pub(crate) fn refresh(
        &self,
        world: &impl World,
        now: u64,
        also: impl FnOnce(&SharedRegion, usize, u32),
    ) {
        if self.refreshing.swap(true, Acquire) {
            return;
        }
        self.next_refresh
            .store(now.saturating_add(REFRESH_NS), Relaxed);
        world.follow_files(now);
        if let Some((region, slot)) = world.region() {
            let mut s = limit_policy::read(region, world.policy());
            if !world.buckets_shared() {
                // Private buckets limit this process alone: fail closed,
                // each of the container's live processes takes its part.
                let n = limit_policy::live_processes(region);
                for l in s.limits.iter_mut() {
                    *l = limit_policy::part(*l, n);
                }
            }
            for (d, l) in s.limits.iter().enumerate() {
                self.limits[d].store(rules::sm_limit_cell(*l), Relaxed);
            }
            self.enforce.store(s.enforce, Relaxed);
            let (planned, held) = Sharing::plan_state(world, now);
            let ranked = (world.priority_stated() && planned) || held;
            self.ranked.store(ranked, Relaxed);
            // Ranked without a limit, every device is accounted: its launches
            // are published to (or held by) the node's other containers.
            let all = (1u32 << MAX_DEVICES) - 1;
            let mask = s.limited_mask() | if ranked { all } else { 0 };
            self.limited.store(mask, Relaxed);
            if s.limited_mask() != 0 && !self.host_pid_noted.swap(true, Relaxed) {
                world.note_host_pid();
            }
            self.blocked.store(s.blocked, Relaxed);
            if !s.blocked {
                limit_policy::mark_activity(region, world.unix_secs(), &self.last_secs);
            }
            also(region, slot, mask);
        }
        self.refreshing.store(false, Release);
    }

    /// Sleeps while the monitor blocks the container (`recent_kernel < 0`),
    /// if the last refresh found it blocked.
    pub(crate) fn wait_unblocked(&self, world: &(impl NodeFiles + Clock)) {
        if !self.blocked.load(Relaxed) {
            return;
        }
        while let Some((region, _)) = world.region() {
            if region.recent_kernel.load(Relaxed) >= 0 {
                limit_policy::unblocked(region);
                break;
            }
            world.sleep_until(world.now().saturating_add(BLOCK_SLEEP_NS));
        }
        self.blocked.store(false, Relaxed);
    }

    /// Bit per accounted device.
    pub(crate) fn limited(&self) -> u32 {
        self.limited.load(Relaxed)
    }

    /// The limit on `dev`.
    pub(crate) fn limit(&self, dev: usize) -> Option<SmLimit> {
        rules::sm_limit(u64::from(self.limits[dev].load(Relaxed)))
    }

    /// The limit on `dev` while it is enforced (`None`: none or not
    /// enforced).
    pub(crate) fn enforced(&self, dev: usize) -> Option<SmLimit> {
        self.limit(dev).filter(|_| self.enforce.load(Relaxed))
    }

    pub(crate) fn ranked(&self) -> bool {
        self.ranked.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::world::fake::FakeWorld;

    /// A world (`world::fake`) whose sleeps the monitor answers after
    /// three of them, and whether the process states a priority.
    fn world(ranked: bool) -> FakeWorld {
        let w = FakeWorld::at(1);
        w.shm().utilization_switch.store(1, Relaxed);
        w.unblock_after.store(3, Relaxed);
        w.ranked.store(ranked, Relaxed);
        w
    }

    /// What the daemon writes into device `dev`'s plan.
    fn plan(p: &FakeWorld, dev: usize, until: u64, hold_until: u64) {
        let w = &p.buckets.plans[dev];
        w.planned_until.store(until, Relaxed);
        w.hold_until.store(hold_until, Relaxed);
    }

    #[test]
    fn limits_are_read_when_due_and_enforced_by_the_switch() {
        let p = world(false);
        let r = p.shm();
        r.sm_limit[1].store(30, Relaxed);
        r.sm_limit[2].store(100, Relaxed);
        let s = Settings::default();
        let mut published = None;
        assert!(s.due(0));
        s.refresh(&p, 5, |_, slot, mask| published = Some((slot, mask)));
        assert_eq!(published, Some((0, 0b10)), "100 % is no limit");
        let pct = |l: Option<SmLimit>| l.map(SmLimit::percent);
        assert_eq!(
            (pct(s.limit(1)), pct(s.enforced(1)), s.limit(2)),
            (Some(30), Some(30), None)
        );
        assert!(!s.due(5 + REFRESH_NS - 1) && s.due(5 + REFRESH_NS));
        // The monitor switches enforcement off: still accounted, not held.
        r.utilization_switch.store(0, Relaxed);
        s.refresh(&p, 5 + REFRESH_NS, |_, _, _| {});
        assert_eq!((s.limited(), s.enforced(1)), (0b10, None));
        assert_eq!(r.recent_kernel.load(Relaxed), limit_policy::ACTIVE);
    }

    #[test]
    fn a_ranked_process_is_accounted_everywhere_and_a_blocked_one_waits() {
        let p = world(true);
        p.shm().recent_kernel.store(-1, Relaxed);
        p.shm().priority.store(0, Relaxed);
        let s = Settings::default();
        s.refresh(&p, 1, |_, _, _| {});
        assert!(!s.ranked(), "no daemon plans: no priorities, no accounting");
        plan(&p, 3, 1_000, 0);
        s.refresh(&p, 2, |_, _, _| {});
        assert_eq!(s.limited(), (1 << MAX_DEVICES) - 1);
        assert!(s.ranked());
        s.wait_unblocked(&p);
        assert_eq!(p.clock.sleeps(), 3, "slept until the monitor let go");
        assert_eq!(p.now(), 1 + 3 * BLOCK_SLEEP_NS);
        // Not blocked any more: no sleep.
        s.wait_unblocked(&p);
        assert_eq!(p.clock.sleeps(), 3);
    }

    #[test]
    fn a_process_stating_no_priority_is_ranked_while_the_plan_holds_it() {
        let p = world(false);
        // What the region's creator writes when no priority is stated.
        p.shm().priority.store(1, Relaxed);
        let s = Settings::default();
        let now = 1_000_000_000;
        plan(&p, 1, now + 1_000, 0);
        s.refresh(&p, now, |_, _, _| {});
        assert!(
            !s.ranked() && s.limited() == 0,
            "a plan that holds nothing ranks nobody"
        );
        // The daemon sees a priority-0 service active on device 1.
        plan(&p, 1, now + 1_000, now + 500);
        s.refresh(&p, now + 1, |_, _, _| {});
        assert!(s.ranked(), "HAMi's default priority 1 is held by a 0");
        assert_eq!(s.limited(), (1 << MAX_DEVICES) - 1);
        // The hold runs out: the unlimited path again.
        s.refresh(&p, now + 501, |_, _, _| {});
        assert!(!s.ranked() && s.limited() == 0);
        // A hold in a plan the daemon stopped renewing holds nothing.
        plan(&p, 1, now + 600, now + 5_000);
        s.refresh(&p, now + 601, |_, _, _| {});
        assert!(!s.ranked());
    }
}
