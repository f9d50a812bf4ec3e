//! Admission: whether a launch's charge (`cost × correction`) may go now,
//! on the container's bucket (`gcra`) or, while the container takes
//! turns with others, in its turn (`phase`); and the charges made after the
//! fact (settlements of guessed costs, refunds of failed launches).

#![forbid(unsafe_code)]

pub(super) mod coast;
pub(super) mod gcra;

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

use vgpu_common::region::rules::SmLimit;
use vgpu_common::sidecar::DevBucket;

use crate::sm::correction;
use crate::sm::node_sharing::phase::{self, Gate, Phase};
use crate::sm::tuning::FRAME_NS;
use gcra::{Admit, Depth};

/// The admission of one process (the bucket's depth is its own: it follows
/// how late this host wakes).
#[derive(Debug, Default)]
pub(crate) struct Admission {
    depth: Depth,
}

impl Admission {
    /// One try at admitting `billed` GPU ns at `now` on `b`: in the turn
    /// `turn` while there is one, else on the bucket at `pct`, a frame deep
    /// when the container is `light` (it used less than most of its share,
    /// so a service's request is not held for its burst). Also says whether
    /// the container's queue had drained (taking turns).
    pub(crate) fn try_once(
        &self,
        b: &DevBucket,
        turn: Option<Phase>,
        now: u64,
        billed: u64,
        pct: SmLimit,
        light: bool,
    ) -> (Admit, bool) {
        match turn {
            Some(p) => take_turn(b, p, now, billed),
            None => {
                let depth = if light {
                    self.depth.get().max(FRAME_NS)
                } else {
                    self.depth.get()
                };
                (
                    gcra::try_admit(&b.tat, now, billed, pct.percent(), depth),
                    false,
                )
            }
        }
    }

    /// A sleep for the bucket ended `overshoot` ns late.
    pub(crate) fn woke_late(&self, overshoot: u64) {
        self.depth.observe(overshoot);
    }

    /// Charges `owed` GPU ns (negative: refunds) learnt after the fact to
    /// `b` at `pct`, with the correction; taking turns, the container's
    /// queue then drains that much later (or sooner).
    pub(crate) fn settle(
        &self,
        b: &DevBucket,
        now: u64,
        owed: i64,
        pct: SmLimit,
        taking_turns: bool,
    ) {
        let owed = correction::charge_signed(b, owed);
        // Two's complement: adding a negative amount subtracts it.
        b.charged_ns.fetch_add(owed as u64, Relaxed);
        gcra::adjust(&b.tat, now, owed, pct.percent(), self.depth.get());
        if taking_turns {
            let _ = b
                .busy_until
                .fetch_update(AcqRel, Acquire, |t| Some(t.saturating_add_signed(owed)));
        }
    }

    /// Takes back the `billed` charge of a launch that failed.
    pub(crate) fn refund(&self, b: &DevBucket, now: u64, billed: u64, pct: SmLimit) {
        b.charged_ns.fetch_sub(billed, Relaxed);
        gcra::adjust(
            &b.tat,
            now,
            -(billed as i64),
            pct.percent(),
            self.depth.get(),
        );
    }
}

/// What one key's settlement may charge at most at `pct`: a frame of wall
/// time. The estimate behind it is the minimum of agreeing samples; what
/// is over a frame is forgiven rather than made a debt that no launch could
/// pay before the next frame (a latency-bound tenant's worst wait). With
/// no limit (a ranked container's launches are accounted too) the cap is
/// that of the least limit, 1 %.
pub(crate) fn settlement_cap(owed: i64, pct: Option<SmLimit>) -> i64 {
    let pct = pct.map_or(1, SmLimit::percent);
    let cap = (FRAME_NS as u128 * u128::from(pct) / 100) as i64;
    owed.min(cap)
}

/// Admits `cost` into the container's turn `p` on a device it shares: after
/// the container's queued work, if it fits before the turn ends.
/// Also says whether the container's queue had drained (by its charges).
fn take_turn(b: &DevBucket, p: Phase, now: u64, cost: u64) -> (Admit, bool) {
    let mut busy = b.busy_until.load(Acquire);
    loop {
        match phase::gate(p, now, busy, cost) {
            Gate::Go { busy_until } => {
                match b
                    .busy_until
                    .compare_exchange_weak(busy, busy_until, AcqRel, Acquire)
                {
                    Ok(_) => {
                        if busy < now && crate::log::enabled(crate::log::DEBUG) {
                            TURN_STATS[0].fetch_add(1, Relaxed);
                            TURN_STATS[1].fetch_add(phase::into_turn(p, now), Relaxed);
                        }
                        return (Admit::Go, busy < now);
                    }
                    Err(cur) => busy = cur,
                }
            }
            Gate::WaitUntil(t) => {
                if crate::log::enabled(crate::log::DEBUG) {
                    TURN_STATS[2].fetch_add(1, Relaxed);
                    TURN_STATS[3].fetch_add(phase::into_turn(p, now), Relaxed);
                    TURN_STATS[4].fetch_add(phase::into_turn(p, busy.max(now)), Relaxed);
                }
                return (Admit::WaitUntil(t), false);
            }
        }
    }
}

/// Debug counters of the turns (`LIBCUDA_LOG_LEVEL=4` only): launches that
/// found the container's queue empty and how far into the turn they came
/// (ns, summed), waits for the next turn and how far into the turn the host
/// and its queue were then. They tell a turn the GPU left idle because the
/// host issued work more slowly than the GPU ran it from one the limiter
/// cut short.
static TURN_STATS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Takes the turns' debug counters (see `TURN_STATS`), resetting them.
pub(crate) fn take_turn_stats() -> [u64; 5] {
    std::array::from_fn(|i| TURN_STATS[i].swap(0, Relaxed))
}
