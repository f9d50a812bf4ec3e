//! The container-wide token bucket of GPU time, as one atomic word.
//!
//! It is a GCRA ("virtual scheduling"): `tat` is the CLOCK_MONOTONIC instant
//! at which everything the container was admitted so far has been paid for
//! at `limit %` of wall time. The bucket's level at `now` is
//! `(now - tat) × limit %`, capped at `depth × limit %` (`Depth`: 4 ms on a
//! host that wakes on time). A launch is admitted while the level is
//! non-negative (`tat <= now`, give or take `LEAD_NS`) and then costs its
//! standalone GPU time: `tat = max(tat, now - depth) + cost × 100 / limit`.
//! So the bucket may go negative by one launch, and the next one waits
//! until it is paid back. One CAS per admitted launch, no lock; processes of
//! the container share the word through the sidecar file.

#![forbid(unsafe_code)]

pub(crate) use crate::sm::tuning::{BATCH_NS, DEPTH_NS, LEAD_NS, MAX_DEPTH_NS};
use crate::sm::tuning::{LATE_AVG_DIV, LATE_MARGIN};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// Wall nanoseconds that `cost_ns` of GPU time buys at `pct` percent.
pub fn wall_of(cost_ns: u64, pct: u32) -> u64 {
    let pct = u64::from(pct.clamp(1, 100));
    cost_ns.saturating_mul(100) / pct
}

/// Outcome of one admission attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Charged; launch now.
    Go,
    /// The bucket is empty until this instant (nothing charged).
    WaitUntil(u64),
}

/// The bucket's depth, widened while the host's sleeps overshoot.
///
/// What a throttled container is owed accrues while it sleeps; a wake-up
/// later than the depth allows drops the rest. A loaded VM (this project's
/// CI host: 1 ms sleeps overshooting by 0.5–4 ms for seconds at a time) or
/// a CPU quota wakes late, and at a fixed 4 ms depth a 30 % container whose
/// sleeps overshot by 6 ms got 21 %. The depth is `DEPTH + 2 ×` a moving
/// average of the overshoot (per process: the host is the same for all of
/// the container's processes, and each one's floor only bounds its own
/// admissions), up to `MAX_DEPTH`. The credit it keeps is only what late
/// wake-ups were owed: the rate is unchanged.
#[derive(Debug, Default)]
pub struct Depth {
    /// Moving average of the overshoot, ns (weight 1/4 per sleep).
    late: AtomicU64,
}

impl Depth {
    /// Notes one sleep that ended `overshoot` ns after its target.
    pub fn observe(&self, overshoot: u64) {
        let o = overshoot.min(MAX_DEPTH_NS);
        let _ = self.late.fetch_update(Relaxed, Relaxed, |l| {
            Some(l - l / LATE_AVG_DIV + o / LATE_AVG_DIV)
        });
    }

    /// The depth now, ns.
    pub fn get(&self) -> u64 {
        DEPTH_NS
            .saturating_add(LATE_MARGIN * self.late.load(Relaxed))
            .min(MAX_DEPTH_NS)
    }
}

/// Tries to admit a launch of `cost_ns` GPU time at `now` from a bucket
/// `depth_ns` deep.
pub fn try_admit(tat: &AtomicU64, now: u64, cost_ns: u64, pct: u32, depth_ns: u64) -> Admit {
    let step = wall_of(cost_ns, pct);
    let floor = now.saturating_sub(depth_ns);
    let mut old = tat.load(Acquire);
    loop {
        let base = old.max(floor);
        if base > now.saturating_add(LEAD_NS) {
            return Admit::WaitUntil((base - LEAD_NS).saturating_add(BATCH_NS));
        }
        match tat.compare_exchange_weak(old, base.saturating_add(step), AcqRel, Acquire) {
            Ok(_) => return Admit::Go,
            Err(cur) => old = cur,
        }
    }
}

/// Charges (`delta > 0`) or refunds (`delta < 0`) GPU time after the fact
/// (a launch that failed, or a cost learnt after a launch was charged a
/// guess). A charge is added to `tat` where it is, not first raised to
/// `now - depth`: it is owed for launches already admitted, which were
/// paid from `tat` as it stood then, so a container that was idle since
/// owes only what it used beyond its idle time. A refund never moves `tat`
/// below `now - depth`.
pub fn adjust(tat: &AtomicU64, now: u64, delta_ns: i64, pct: u32, depth_ns: u64) {
    let step = wall_of(delta_ns.unsigned_abs(), pct);
    let floor = now.saturating_sub(depth_ns);
    let _ = tat.fetch_update(AcqRel, Relaxed, |old| {
        Some(if delta_ns >= 0 {
            old.saturating_add(step)
        } else {
            old.max(floor).saturating_sub(step).max(floor)
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Back-to-back launches of `cost` on an ideal GPU under the bucket:
    /// the share of GPU time over a long run is the limit.
    fn share(pct: u32, cost: u64, host_gap: u64) -> f64 {
        let tat = AtomicU64::new(0);
        let mut now = 1_000_000_000u64;
        let start = now;
        let mut gpu_free = now;
        let mut busy = 0u64;
        let end = start + 2_000_000_000;
        while now < end {
            match try_admit(&tat, now, cost, pct, DEPTH_NS) {
                Admit::Go => {
                    let s = gpu_free.max(now);
                    gpu_free = s + cost;
                    busy += cost;
                    now += host_gap;
                }
                // Sleeps overshoot by 60 µs (timer slack and wake-up).
                Admit::WaitUntil(t) => now = t + 60_000,
            }
        }
        busy as f64 / (end - start) as f64 * 100.0
    }

    #[test]
    fn long_and_tiny_kernels_get_the_limit() {
        for pct in [10, 30, 60, 90] {
            for (cost, gap) in [(5_000_000, 2_000), (10_000, 2_000), (2_000, 500)] {
                let s = share(pct, cost, gap);
                assert!((s - f64::from(pct)).abs() < 1.0, "{pct}% cost {cost}: {s}");
            }
        }
    }

    #[test]
    fn burst_is_bounded_by_the_depth() {
        let tat = AtomicU64::new(0);
        let now = 10_000_000_000;
        let mut n = 0;
        while try_admit(&tat, now, 10_000, 50, DEPTH_NS) == Admit::Go {
            n += 1;
        }
        // (DEPTH + LEAD) × 50 % = 2.5 ms of GPU time = 250 launches of
        // 10 µs (+1: the bucket may go negative by one launch).
        assert_eq!(n, 251);
        // Empty: wait until a batch's worth has refilled, then a batch of
        // BATCH × 50 % = 1 ms of GPU time (100 launches, +1) goes at once.
        let wake = now + 20_000 + BATCH_NS;
        assert_eq!(
            try_admit(&tat, now, 10_000, 50, DEPTH_NS),
            Admit::WaitUntil(wake)
        );
        let mut batch = 0;
        while try_admit(&tat, wake, 10_000, 50, DEPTH_NS) == Admit::Go {
            batch += 1;
        }
        assert_eq!(batch, 101);
    }

    #[test]
    fn adjust_charges_and_refunds() {
        let tat = AtomicU64::new(0);
        let now = 10_000_000_000;
        assert_eq!(try_admit(&tat, now, 1_000_000, 50, DEPTH_NS), Admit::Go);
        assert_eq!(tat.load(Relaxed), now - DEPTH_NS + 2_000_000);
        adjust(&tat, now, 3_000_000, 50, DEPTH_NS);
        assert_eq!(tat.load(Relaxed), now + 4_000_000);
        adjust(&tat, now, -1_000_000, 50, DEPTH_NS);
        assert_eq!(tat.load(Relaxed), now + 2_000_000);
        adjust(&tat, now, -100_000_000, 50, DEPTH_NS);
        assert_eq!(tat.load(Relaxed), now - DEPTH_NS);
        // Owed for launches admitted 20 ms ago by a container idle since:
        // charged where `tat` stood, so only what exceeds the idle time
        // is a debt now.
        let tat = AtomicU64::new(now - 20_000_000);
        adjust(&tat, now, 6_000_000, 50, DEPTH_NS);
        assert_eq!(tat.load(Relaxed), now - 8_000_000);
        assert_eq!(try_admit(&tat, now, 1_000_000, 50, DEPTH_NS), Admit::Go);
        adjust(&tat, now, 12_000_000, 50, DEPTH_NS);
        assert_eq!(tat.load(Relaxed), now + 22_000_000);
    }

    #[test]
    fn the_depth_follows_the_hosts_lateness() {
        let d = Depth::default();
        assert_eq!(d.get(), DEPTH_NS);
        for _ in 0..40 {
            d.observe(6_000_000);
        }
        let g = d.get();
        assert!((15_900_000..=16_000_000).contains(&g), "{g}");
        // A host back on time: the depth returns to the floor.
        for _ in 0..80 {
            d.observe(50_000);
        }
        assert!(d.get() < DEPTH_NS + 200_000, "{}", d.get());
        // One sleep of a second does not take it past the cap.
        d.observe(1_000_000_000);
        assert!(d.get() <= MAX_DEPTH_NS);
        for _ in 0..10 {
            d.observe(1_000_000_000);
        }
        assert_eq!(d.get(), MAX_DEPTH_NS);
    }
}
