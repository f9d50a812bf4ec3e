//! The slow outer loop: corrects the charges of a device by a gain from the
//! container's measured utilization (docs/sm-limit.md, "Feedback").
//!
//! The bucket charges each launch `cost × gain`; over a period the container
//! was charged `charged` % of wall time and the device measured `measured` %.
//! Their ratio is the error of the charges: the right gain is
//! `gain × measured / charged`, whether the bucket held the container (then
//! `charged` is the limit) or not (its charges were too low to ever empty
//! the bucket, or the application used less than its limit). Each period
//! the gain moves a fixed fraction of the way there in the log domain
//! (`gain × r^K`): an integral step that converges geometrically and never
//! overshoots (no oscillation), bounded per step and overall. A period in
//! which almost nothing was charged says nothing, and the gain holds
//! (anti-windup: an idle container never drives it to a bound).

use super::tuning::{
    DEAD_BAND, FEEDBACK_K as K, FEEDBACK_K_SHARED as K_SHARED, FEEDBACK_MAX_STEP as MAX_STEP,
    MIN_CHARGED,
};
pub use super::tuning::{GAIN_MAX, GAIN_MIN, MAX_GAP_NS, PERIOD_NS, SHARED_PERIOD_NS};
/// One period's reading of the container on a device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Percent of the device's time the container's processes used.
    pub measured: f64,
    /// Percent of the period the container was charged (gain included):
    /// the GPU time the bucket believes it used.
    pub charged: f64,
    /// `measured` is the container's split of a device shared with others
    /// (noisier than the device's own counter).
    pub shared: bool,
}

/// The next gain after a period at `limit` percent.
pub fn step(gain: f64, limit: u32, r: Reading) -> f64 {
    let gain = if gain.is_finite() {
        gain.clamp(GAIN_MIN, GAIN_MAX)
    } else {
        1.0
    };
    if limit == 0
        || limit >= 100
        || !r.measured.is_finite()
        || !r.charged.is_finite()
        || r.charged < MIN_CHARGED
    {
        return gain;
    }
    let ratio = r.measured.max(0.0) / r.charged;
    if (ratio - 1.0).abs() <= DEAD_BAND {
        return gain;
    }
    // A zero reading (NVML lost the samples) must not slam the gain down:
    // the per-step bound limits it.
    let k = if r.shared { K_SHARED } else { K };
    let f = ratio.max(1e-3).powf(k).clamp(1.0 / MAX_STEP, MAX_STEP);
    (gain * f).clamp(GAIN_MIN, GAIN_MAX)
}

/// The gain as stored in the sidecar (`f64` bits; 0 = never set = 1).
pub fn decode(bits: u64) -> f64 {
    if bits == 0 {
        return 1.0;
    }
    let g = f64::from_bits(bits);
    if g.is_finite() {
        g.clamp(GAIN_MIN, GAIN_MAX)
    } else {
        1.0
    }
}

pub fn encode(gain: f64) -> u64 {
    gain.clamp(GAIN_MIN, GAIN_MAX).to_bits()
}

/// Per-process samples `(host pid, sm %)` summed over `pids`: each pid's
/// samples are averaged (NVML returns one per internal sample period since
/// the last poll), then the container's pids are added up.
pub fn container_share(samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    pid_sum(samples, pids).min(100.0)
}

/// The container's part of the device's utilization `device`: its
/// per-process samples over all processes' samples, times `device`. NVML's
/// per-process figures do not add up to the device counter (a lone process
/// reads below the device), but their proportions attribute it.
/// `None` without any sample.
pub fn attributed_share(samples: &[(u32, u32)], pids: &[u32], device: f64) -> Option<f64> {
    let mut all: Vec<u32> = samples.iter().map(|(p, _)| *p).collect();
    all.sort_unstable();
    all.dedup();
    let total = pid_sum(samples, &all);
    (total > 0.0).then(|| (pid_sum(samples, pids) / total * device.clamp(0.0, 100.0)).min(100.0))
}

/// Each pid's samples averaged, then added up over `pids` (uncapped).
fn pid_sum(samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    pids.iter()
        .map(|p| {
            let (n, sum) = samples
                .iter()
                .filter(|(q, _)| q == p)
                .fold((0u32, 0u64), |(n, s), (_, u)| (n + 1, s + u64::from(*u)));
            if n == 0 {
                0.0
            } else {
                sum as f64 / f64::from(n)
            }
        })
        .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plant: a container that would use `demand` % of the device,
    /// whose launches really cost `truth` × their estimate and are charged
    /// `gain` × it. The bucket admits `limit` % of charges; the device
    /// saturates at 100. Returns (measured, charged).
    fn plant(limit: u32, demand: f64, truth: f64, gain: f64) -> (f64, f64) {
        let wanted = demand * gain / truth;
        let charged = wanted.min(f64::from(limit)).min(100.0 * gain / truth);
        ((charged * truth / gain).min(100.0), charged)
    }

    fn reading((measured, charged): (f64, f64)) -> Reading {
        Reading {
            measured,
            charged,
            shared: false,
        }
    }

    fn run_with(limit: u32, demand: f64, truth: f64, periods: usize) -> Vec<f64> {
        let mut g = 1.0;
        let mut out = vec![g];
        for _ in 0..periods {
            g = step(g, limit, reading(plant(limit, demand, truth, g)));
            out.push(g);
        }
        out
    }

    fn run(limit: u32, truth: f64, periods: usize) -> Vec<f64> {
        run_with(limit, 100.0, truth, periods)
    }

    fn monotone(v: &[f64]) -> bool {
        v.windows(2).all(|w| w[1] >= w[0]) || v.windows(2).all(|w| w[1] <= w[0])
    }

    #[test]
    fn converges_on_an_under_estimate_without_oscillating() {
        // Kernels cost 10 % more than learnt (the min-filter at limit 60).
        let g = run(60, 1.1, 8);
        assert!(monotone(&g), "{g:?}");
        let (m, _) = plant(60, 100.0, 1.1, g[5]);
        assert!((m - 60.0).abs() < 1.5, "{g:?} → {m}");
        assert!(g.iter().all(|x| *x <= 1.1 + 1e-9), "overshoot {g:?}");
    }

    #[test]
    fn converges_on_a_double_over_estimate_without_oscillating() {
        // Tiny kernels charged twice their real time (launch latency).
        let g = run(30, 0.5, 8);
        assert!(monotone(&g), "{g:?}");
        let (m, _) = plant(30, 100.0, 0.5, g[5]);
        assert!((m - 30.0).abs() < 1.5, "{g:?} → {m}");
        assert!(g.iter().all(|x| *x >= 0.5 - 1e-9), "overshoot {g:?}");
    }

    #[test]
    fn a_container_charged_too_little_to_be_held_is_corrected() {
        // At 90 % with costs learnt at 60 % of the truth the bucket never
        // empties: the device saturates (measured 100) while the charges
        // say 60. The ratio, not the limit, drives the step.
        let g = run(90, 1.0 / 0.6, 12);
        assert!(monotone(&g), "{g:?}");
        let (m, _) = plant(90, 100.0, 1.0 / 0.6, g[8]);
        assert!((m - 90.0).abs() < 2.0, "{g:?} → {m}");
        assert!(g.iter().all(|x| *x <= 1.0 / 0.6 + 1e-9), "overshoot {g:?}");
    }

    #[test]
    fn an_application_below_its_limit_corrects_without_moving_its_share() {
        // A launch-bound application using 20 % of the device under a 60 %
        // limit, its launches charged 2.5× their time (launch latency): the
        // gain learns the error while the share stays the application's own.
        let g = run_with(60, 20.0, 0.4, 10);
        assert!(monotone(&g), "{g:?}");
        assert!((g[10] - 0.4).abs() < 0.02, "{g:?}");
        for x in &g {
            let (m, _) = plant(60, 20.0, 0.4, *x);
            assert!((m - 20.0).abs() < 1e-9, "{g:?}");
        }
    }

    #[test]
    fn holds_when_idle_or_in_the_dead_band() {
        let idle = Reading {
            measured: 0.0,
            charged: 0.0,
            shared: false,
        };
        let nearly_idle = Reading {
            measured: 3.0,
            charged: 0.5,
            shared: false,
        };
        let mut g = 1.7;
        for _ in 0..100 {
            g = step(g, 30, idle);
            g = step(g, 30, nearly_idle);
        }
        assert_eq!(g, 1.7);
        let close = Reading {
            measured: 50.5,
            charged: 50.0,
            shared: false,
        };
        assert_eq!(step(0.8, 50, close), 0.8);
        // No limit: nothing to correct.
        let off = Reading {
            measured: 90.0,
            charged: 30.0,
            shared: false,
        };
        assert_eq!(step(0.8, 0, off), 0.8);
        assert_eq!(step(0.8, 100, off), 0.8);
    }

    #[test]
    fn bounded_per_step_and_overall() {
        let zero = Reading {
            measured: 0.0,
            charged: 30.0,
            shared: false,
        };
        assert!((step(1.0, 30, zero) - 1.0 / MAX_STEP).abs() < 1e-12);
        let mut g = 1.0;
        for _ in 0..50 {
            g = step(g, 30, zero);
        }
        assert_eq!(g, GAIN_MIN);
        let full = Reading {
            measured: 100.0,
            charged: 10.0,
            shared: false,
        };
        for _ in 0..50 {
            g = step(g, 10, full);
        }
        assert_eq!(g, GAIN_MAX);
        assert_eq!(step(f64::NAN, 30, full), step(1.0, 30, full));
        assert_eq!(decode(0), 1.0);
        assert_eq!(decode(encode(2.5)), 2.5);
        assert_eq!(decode(f64::NAN.to_bits()), 1.0);
    }

    #[test]
    fn share_sums_pid_averages() {
        let s = [(10, 20), (10, 40), (11, 5), (99, 90)];
        assert_eq!(container_share(&s, &[10, 11]), 35.0);
        assert_eq!(container_share(&s, &[12]), 0.0);
    }

    #[test]
    fn the_device_counter_is_split_by_the_samples_proportions() {
        // Two samples of pid 1 (avg 20), one of pid 2 (40), one of pid 3 (0):
        // pid 1 has a third of the attributed 90.
        let s = [(1, 18), (1, 22), (2, 40), (3, 0)];
        let a = attributed_share(&s, &[1], 90.0).unwrap();
        assert!((a - 30.0).abs() < 1e-9, "{a}");
        let a = attributed_share(&s, &[1, 2], 90.0).unwrap();
        assert!((a - 90.0).abs() < 1e-9, "{a}");
        assert_eq!(attributed_share(&s, &[7], 90.0), Some(0.0));
        assert_eq!(attributed_share(&[], &[1], 90.0), None);
        assert_eq!(attributed_share(&[(1, 0)], &[1], 90.0), None);
    }
}
