//! Whether a container wants its share of a device: the signal that puts
//! it in the node's plan of turns (`node_mapping::Member::wants`, docs/sm-limit.md,
//! "Time division between containers").
//!
//! Turns cost a container latency (a launch outside its turn waits for the
//! next one) and leave a turn idle when its owner has nothing queued, so
//! they are only worth it between containers that each use most of their
//! share. A container that uses little of it (a service between requests)
//! is neither waited for nor kept waiting; the GPU's own time-slicing costs
//! little when one side is mostly idle.
//!
//! The measure is the container's charges (its processes' summed kernel
//! time estimates, `DevBucket::charged_ns`) over a window: while taking
//! turns with the correction factor the turns' own events gave, else with a
//! factor over 1 taken back out (`correction::demand_rate`). It is not
//! NVML's: NVML cannot split a device passed between contexts every few
//! ms, and a container held back by time-slicing is under its limit while
//! it still wants more.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};

pub use crate::sm::tuning::{DEMAND_WINDOW_NS as WINDOW_NS, WANT_FRACTION};
use vgpu_common::region::MAX_DEVICES;

/// Per device: the start of the current window, the container's charges
/// then, and the verdict of the last whole window.
#[derive(Debug, Default)]
pub struct Demand {
    since: [AtomicU64; MAX_DEVICES],
    charged: [AtomicU64; MAX_DEVICES],
    wants: [AtomicBool; MAX_DEVICES],
    /// A whole window was measured (the verdict is not the default).
    known: [AtomicBool; MAX_DEVICES],
}

impl Demand {
    /// Whether the container wanted its `share` (0–1) of `dev` in the last
    /// whole window, given its charges counter `charged` (wrapping; settled
    /// guesses may subtract) and the device time per ns charged at `now`.
    /// Called by one thread at a time (the re-plan); another thread's call
    /// is harmless but may cut a window short.
    pub fn observe(
        &self,
        dev: usize,
        now: u64,
        charged: u64,
        per_charged: f64,
        share: f64,
    ) -> bool {
        let since = self.since[dev].load(Relaxed);
        if since == 0 || now < since {
            self.restart(dev, now, charged);
            return self.wants[dev].load(Relaxed);
        }
        let span = now - since;
        if span < WINDOW_NS {
            return self.wants[dev].load(Relaxed);
        }
        let used = charged.wrapping_sub(self.charged[dev].load(Relaxed)) as i64;
        let used = used.max(0) as f64 * per_charged;
        let wants = used >= WANT_FRACTION * share * span as f64;
        self.known[dev].store(true, Relaxed);
        if self.wants[dev].swap(wants, Relaxed) != wants {
            vlog!(
                crate::log::DEBUG,
                "sm dev {dev}: used {:.0} % of its {:.0} % share over {} ms: {}",
                used * 100.0 / (share * span as f64),
                share * 100.0,
                span / 1_000_000,
                if wants {
                    "wants it"
                } else {
                    "does not want it"
                }
            );
        }
        self.restart(dev, now, charged);
        wants
    }

    /// Whether a whole window was measured on `dev` and found the
    /// container using less than most of its share.
    pub fn light(&self, dev: usize) -> bool {
        self.known[dev].load(Relaxed) && !self.wants[dev].load(Relaxed)
    }

    fn restart(&self, dev: usize, now: u64, charged: u64) {
        self.since[dev].store(now, Relaxed);
        self.charged[dev].store(charged, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_container_wants_its_share_when_it_uses_most_of_it() {
        let d = Demand::default();
        let t0 = 1_000 * MS;
        // The first call only starts the window.
        assert!(!d.observe(0, t0, 5, 1.0, 0.3));
        // 30 % share over 100 ms is 30 ms; 70 % of that is 21 ms.
        assert!(
            !d.observe(0, t0 + 50 * MS, 5 + 40 * MS, 1.0, 0.3),
            "too early"
        );
        assert!(d.observe(0, t0 + 100 * MS, 5 + 21 * MS, 1.0, 0.3));
        // The verdict holds until the next window ends.
        assert!(d.observe(0, t0 + 150 * MS, 5 + 21 * MS, 1.0, 0.3));
        assert!(!d.observe(0, t0 + 200 * MS, 5 + 41 * MS, 1.0, 0.3));
        // Charges with a correction of 2 count half.
        assert!(!d.observe(0, t0 + 300 * MS, 5 + 81 * MS, 0.5, 0.3));
        assert!(d.observe(0, t0 + 400 * MS, 5 + 123 * MS, 0.5, 0.3));
        // A settled guess that took back more than was charged: no use.
        assert!(!d.observe(0, t0 + 500 * MS, 5 + 100 * MS, 1.0, 0.3));
        // Turns measured at 1.25 ns per ns charged: 17 ms count 21.25.
        assert!(d.observe(0, t0 + 600 * MS, 5 + 117 * MS, 1.25, 0.3));
        // Devices are separate.
        assert!(!d.observe(1, t0, 0, 1.0, 0.3));
    }
}
