//! The one correction of cost error (docs/sm-limit.md, "The correction"):
//! a factor per container and device that multiplies every charge, kept in
//! the sidecar (`DevBucket::gain`, `f64` bits, 0 = 1) and owned here. The
//! bucket, the turns, settlements and refunds apply it; the demand measure
//! reads it; only this module writes it.
//!
//! The learnt costs (`cost`) are recent minima of event timings, each per
//! launch key. What they get wrong is the same error for every key of the
//! container: a timing that includes the host's launch latency (a tiny
//! kernel read 2.5× long), a minimum from the GPU's faster moments (a
//! matmul read ~10 % short under a power cap), time slicing with other
//! contexts. The factor corrects that average error from one of two pieces
//! of evidence, whichever measures the container's real GPU time:
//!
//! - on the bucket, the feedback loop's NVML measurement of the container's
//!   share against what it was charged (`from_nvml`, `nvml_feedback`);
//! - while taking turns, a turn's own events (its GPU time, exact since a
//!   turn is exclusive) against the charges admitted in it (`from_turn`,
//!   `turn_measure`); NVML cannot split a device passed between contexts every few
//!   ms, so the loop does not step then.
//!
//! Both steer the factor a fraction of the log-error per step, bounded per
//! step and to [`FACTOR_MIN`, `FACTOR_MAX`].

#![forbid(unsafe_code)]

pub(super) mod nvml_feedback;
pub(super) mod nvml_share;
pub(super) mod turn_measure;

use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::region::rules::SmLimit;
use vgpu_common::sidecar::DevBucket;

use crate::sm::tuning::{
    DEAD_BAND, FEEDBACK_K, FEEDBACK_K_SHARED, FEEDBACK_MAX_STEP, MIN_CHARGED, TURN_DEAD_BAND,
    TURN_K, TURN_RATIO_MAX, TURN_RATIO_MIN,
};
pub(crate) use crate::sm::tuning::{FACTOR_MAX, FACTOR_MIN};

/// The factor on the charges of the device `b` is the bucket of (1: none
/// learnt, open loop).
pub(crate) fn factor(b: &DevBucket) -> f64 {
    decode(b.gain.load(Relaxed))
}

/// The charge for `cost` GPU ns on `b`: `cost × factor`, exact when the
/// factor is 1. Every charge goes through here (admissions, settlements,
/// refunds take back what was charged).
#[inline]
pub(crate) fn charge(b: &DevBucket, cost: u64) -> u64 {
    apply(cost, factor(b))
}

/// [`charge`] for an amount learnt after the fact (negative: a refund).
pub(crate) fn charge_signed(b: &DevBucket, owed: i64) -> i64 {
    let c = charge(b, owed.unsigned_abs()) as i64;
    if owed < 0 {
        -c
    } else {
        c
    }
}

/// `cost × factor`, exact when the factor is 1.
fn apply(cost: u64, factor: f64) -> u64 {
    if factor == 1.0 {
        cost
    } else {
        (cost as f64 * factor) as u64
    }
}

/// No evidence to be had (host pids unknown, NVML missing or blind): the
/// charges stand as learnt.
pub(crate) fn open(b: &DevBucket) {
    b.gain.store(0, Relaxed);
}

/// How much device time one charged ns stands for, as the demand measure
/// may trust it (`demand`): a factor under 1 says the charges overstate the
/// kernels and is applied; one over 1 is taken back out on the bucket,
/// since NVML over-attributes a device it shares (a container charged right
/// reads 5–20 % over beside a busy neighbour). Taking turns the factor came
/// from the turns' own events, which are exact: the charges stand.
pub(crate) fn demand_rate(b: &DevBucket, taking_turns: bool) -> f64 {
    if taking_turns {
        1.0
    } else {
        1.0 / factor(b).max(1.0)
    }
}

/// One feedback period's reading of the container on a device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// Percent of the device's time the container's processes used.
    pub measured: f64,
    /// Percent of the period the container was charged (factor included).
    pub charged: f64,
    /// `measured` is the container's split of a device shared with others
    /// (noisier than the device's own counter).
    pub shared: bool,
}

/// Steps the factor of `b` from an NVML reading at `limit`; returns
/// (before, after).
pub(crate) fn from_nvml(b: &DevBucket, limit: SmLimit, r: Reading) -> (f64, f64) {
    let was = factor(b);
    let next = step(was, Some(limit), r);
    b.gain.store(encode(next), Relaxed);
    (was, next)
}

/// Steps the factor of `b` from a measured turn: it took `took` GPU ns for
/// `charged` ns of charges (factor included). A turn that implies a factor
/// (the current one times its ratio) outside [`TURN_RATIO_MIN`,
/// `TURN_RATIO_MAX`] is no cost error but a turn that was not what it
/// seemed (the first ones, charged guesses that can be several times what
/// they took, or spanning a neighbour's late start) and is not used: judged
/// against the ratio alone, a run of such turns would walk the factor away
/// step by step. Returns the new factor when it moved.
pub(crate) fn from_turn(b: &DevBucket, took: u64, charged: u64) -> Option<f64> {
    if charged == 0 {
        return None;
    }
    let r = took as f64 / charged as f64;
    let implied = factor(b) * r;
    if !(TURN_RATIO_MIN..=TURN_RATIO_MAX).contains(&implied) || (r - 1.0).abs() <= TURN_DEAD_BAND {
        return None;
    }
    let f = r.powf(TURN_K);
    let next = b
        .gain
        .fetch_update(Relaxed, Relaxed, |w| {
            Some(encode((decode(w) * f).clamp(FACTOR_MIN, FACTOR_MAX)))
        })
        .map_or(1.0, |w| decode(w) * f);
    Some(next.clamp(FACTOR_MIN, FACTOR_MAX))
}

/// The feedback law: the next factor after a period at `limit` (`None`:
/// no limit, nothing to correct).
///
/// Over a period the container was charged `charged` % of wall time and
/// measured `measured` %; the right factor is `factor × measured /
/// charged`, whether the bucket held the container or not (its charges too
/// low to ever empty it, or the application under its limit). The factor
/// moves a fixed fraction of the way there in the log domain: an integral
/// step that converges geometrically and never overshoots, bounded per
/// step and overall. A period with almost nothing charged says nothing and
/// the factor holds (an idle container never drives it to a bound).
pub(crate) fn step(factor: f64, limit: Option<SmLimit>, r: Reading) -> f64 {
    let factor = if factor.is_finite() {
        factor.clamp(FACTOR_MIN, FACTOR_MAX)
    } else {
        1.0
    };
    if limit.is_none()
        || !r.measured.is_finite()
        || !r.charged.is_finite()
        || r.charged < MIN_CHARGED
    {
        return factor;
    }
    let ratio = r.measured.max(0.0) / r.charged;
    if (ratio - 1.0).abs() <= DEAD_BAND {
        return factor;
    }
    // A zero reading (NVML lost the samples) must not slam the factor
    // down: the per-step bound limits it.
    let k = if r.shared {
        FEEDBACK_K_SHARED
    } else {
        FEEDBACK_K
    };
    let f = ratio
        .max(1e-3)
        .powf(k)
        .clamp(1.0 / FEEDBACK_MAX_STEP, FEEDBACK_MAX_STEP);
    (factor * f).clamp(FACTOR_MIN, FACTOR_MAX)
}

/// The factor as stored in the sidecar (`f64` bits; 0 = never set = 1).
pub(crate) fn decode(bits: u64) -> f64 {
    if bits == 0 {
        return 1.0;
    }
    let g = f64::from_bits(bits);
    if g.is_finite() {
        g.clamp(FACTOR_MIN, FACTOR_MAX)
    } else {
        1.0
    }
}

pub(crate) fn encode(factor: f64) -> u64 {
    factor.clamp(FACTOR_MIN, FACTOR_MAX).to_bits()
}

#[cfg(test)]
mod tests;
