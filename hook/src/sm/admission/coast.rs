//! The launch path of a container far under its limit (docs/sm-limit.md,
//! "Far from the limit"). Accounting every launch on the bucket costs a
//! launch-bound loop a share of its rate (a context and a capture query,
//! a clock read and a CAS on the shared bucket each) though the bucket
//! never holds it. So while the container's charged rate stays under
//! `COAST_BELOW` of its limit, a launch whose cost the thread's cache knows
//! (no timing due) only adds that cost to the process's `owed` for the
//! device, within a budget per window; the first launch after the window,
//! or over the budget, or of an unknown key, or with a timing due, goes
//! the full path: it charges what is owed to the bucket (at the bucket's
//! time, as a settlement) and measures the rate again, which opens the next
//! window or not.
//!
//! The charges are exact (the same cost the full path would have charged,
//! with the correction), only late: by at most a window, and at most
//! `COAST_BELOW × limit × window` of GPU time per window, so the limit
//! over any longer time is the bucket's.

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::region::rules::SmLimit;
use vgpu_common::region::MAX_DEVICES;

use crate::sm::tuning::{COAST_BELOW, COAST_WINDOW_NS};

/// One device's coasting state in this process.
#[derive(Debug, Default)]
struct Dev {
    /// End of the open window (CLOCK_MONOTONIC ns); 0 = not coasting.
    until: AtomicU64,
    /// Uncorrected GPU ns the open window may coast.
    budget: AtomicU64,
    /// Uncorrected GPU ns coasted in the open window.
    spent: AtomicU64,
    /// Coasted GPU ns not yet charged to the bucket.
    owed: AtomicU64,
    /// When the rate was last measured, and the container's charged ns then.
    mark_at: AtomicU64,
    mark_charged: AtomicU64,
}

/// This process's coasting, per device.
#[derive(Debug, Default)]
pub(crate) struct Coast {
    devs: [Dev; MAX_DEVICES],
}

impl Coast {
    /// Whether `dev` has a window open at `now` (any clock of the launch
    /// path: the coarse one lags the window's end by at most its tick).
    pub(crate) fn open(&self, dev: usize, now: u64) -> bool {
        self.devs
            .get(dev)
            .is_some_and(|d| now < d.until.load(Relaxed))
    }

    /// Whether any device has a window open at `now`.
    pub(crate) fn any_open(&self, now: u64) -> bool {
        self.devs.iter().any(|d| now < d.until.load(Relaxed))
    }

    /// Coasts a launch of `cost` on `dev` if the window's budget has room.
    pub(crate) fn take(&self, dev: usize, cost: u64) -> bool {
        let Some(d) = self.devs.get(dev) else {
            return false;
        };
        let budget = d.budget.load(Relaxed);
        let fits = d
            .spent
            .fetch_update(Relaxed, Relaxed, |s| {
                let n = s.saturating_add(cost);
                (n <= budget).then_some(n)
            })
            .is_ok();
        if fits {
            d.owed.fetch_add(cost, Relaxed);
        }
        fits
    }

    /// A coasted launch of `cost` failed: it owes nothing.
    pub(crate) fn give_back(&self, dev: usize, cost: u64) {
        if let Some(d) = self.devs.get(dev) {
            let _ = d
                .owed
                .fetch_update(Relaxed, Relaxed, |o| Some(o.saturating_sub(cost)));
        }
    }

    /// What the coasted launches on `dev` owe (uncorrected GPU ns), handed
    /// over once.
    pub(crate) fn take_owed(&self, dev: usize) -> u64 {
        self.devs.get(dev).map_or(0, |d| d.owed.swap(0, Relaxed))
    }

    /// After a launch on the full path at `now`: measures the container's
    /// charged rate on `dev` when a window has passed since the last
    /// measurement (`charged`: the container's charged ns, corrected;
    /// `factor`: the correction) and opens the next window if the rate is
    /// far enough under `pct`. `eligible` false (the launch waited, the
    /// container takes turns or ranks by priority, no limit) closes it.
    pub(crate) fn plan(
        &self,
        dev: usize,
        now: u64,
        charged: u64,
        pct: Option<SmLimit>,
        factor: f64,
        eligible: bool,
    ) {
        let Some(d) = self.devs.get(dev) else {
            return;
        };
        let Some(pct) = pct.filter(|_| eligible) else {
            d.until.store(0, Relaxed);
            return;
        };
        let at = d.mark_at.load(Relaxed);
        if at != 0 && now < at.saturating_add(COAST_WINDOW_NS) {
            return;
        }
        // One thread measures.
        if d.mark_at
            .compare_exchange(at, now, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let before = d.mark_charged.swap(charged, Relaxed);
        if at == 0 {
            return;
        }
        let share = f64::from(pct.percent()) / 100.0;
        let rate = charged.wrapping_sub(before) as i64 as f64 / (now - at).max(1) as f64;
        if rate < share * COAST_BELOW {
            let budget =
                share * COAST_BELOW * COAST_WINDOW_NS as f64 / factor.max(f64::MIN_POSITIVE);
            d.budget.store(budget as u64, Relaxed);
            d.spent.store(0, Relaxed);
            d.until.store(now.saturating_add(COAST_WINDOW_NS), Relaxed);
        } else {
            d.until.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_window_opens_only_far_under_the_limit_and_holds_a_budget() {
        let c = Coast::default();
        let fifty = vgpu_common::region::rules::sm_limit(50);
        // The first measurement only marks.
        c.plan(0, 100 * MS, 0, fifty, 1.0, true);
        assert!(!c.open(0, 100 * MS + 1));
        // 10 % of the window charged at limit 50: far under, a window.
        c.plan(0, 110 * MS, MS, fifty, 1.0, true);
        assert!(c.open(0, 115 * MS) && !c.open(0, 120 * MS));
        assert!(c.any_open(115 * MS) && !c.open(1, 115 * MS));
        // Budget: 0.75 × 50 % × 10 ms = 3.75 ms.
        assert!(c.take(0, 3 * MS));
        assert!(!c.take(0, MS), "over the window's budget");
        assert!(c.take(0, MS / 2));
        c.give_back(0, MS / 2);
        assert_eq!(c.take_owed(0), 3 * MS);
        assert_eq!(c.take_owed(0), 0);
        // 40 % charged over the next window at limit 50: too close.
        c.plan(0, 120 * MS, 5 * MS, fifty, 1.0, true);
        assert!(!c.open(0, 121 * MS));
        // Not eligible: closed at once, whatever the rate.
        c.plan(0, 130 * MS, 5 * MS, fifty, 1.0, true);
        assert!(c.open(0, 131 * MS));
        c.plan(0, 131 * MS, 5 * MS, fifty, 1.0, false);
        assert!(!c.open(0, 132 * MS));
    }
}
