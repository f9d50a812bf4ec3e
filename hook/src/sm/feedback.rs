//! The slow outer loop: corrects the charges of a device by a gain from the
//! container's measured utilization (docs/sm-limit.md, "Feedback").
//!
//! The bucket charges each launch `cost × gain`. The container's real share
//! is `limit × true cost / (cost × gain)`, so with `r = measured / limit`
//! the right gain is `gain × r`. Each period the gain moves a fixed fraction
//! of the way there in the log domain (`gain × r^K`): an integral step that
//! converges geometrically and never overshoots (no oscillation), bounded
//! per step and overall. It only moves when the measurement means something:
//! the container was throttled during the whole period (the bucket, not the
//! application, set its pace) or measured above its limit; otherwise the
//! gain holds (anti-windup: an idle or under-using container never drives it
//! to a bound).

/// How often the loop runs (at most).
pub const PERIOD_NS: u64 = 500_000_000;
/// A period longer than this since the previous step (the leader was not
/// throttled in between): re-baseline, do not step.
pub const MAX_GAP_NS: u64 = 2 * PERIOD_NS;
pub const GAIN_MIN: f64 = 0.25;
pub const GAIN_MAX: f64 = 4.0;
/// Fraction of the log-error corrected per period.
const K: f64 = 0.5;
/// Largest factor applied in one period.
const MAX_STEP: f64 = 1.5;
/// |measured / limit − 1| below this: hold (measurement noise).
const DEAD_BAND: f64 = 0.02;

/// One period's reading of the container on a device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Percent of the device's time the container's processes used.
    pub measured: f64,
    /// The container's launches waited for the bucket during the period.
    pub throttled: bool,
}

/// The next gain after a period at `limit` percent.
pub fn step(gain: f64, limit: u32, r: Reading) -> f64 {
    let gain = if gain.is_finite() {
        gain.clamp(GAIN_MIN, GAIN_MAX)
    } else {
        1.0
    };
    if limit == 0 || limit >= 100 || !r.measured.is_finite() {
        return gain;
    }
    let ratio = r.measured.max(0.0) / f64::from(limit);
    let over = ratio > 1.0 + DEAD_BAND;
    let under = ratio < 1.0 - DEAD_BAND && r.throttled;
    if !over && !under {
        return gain;
    }
    // A zero reading while throttled (NVML lost the samples) must not slam
    // the gain down: the per-step bound limits it.
    let f = ratio.max(1e-3).powf(K).clamp(1.0 / MAX_STEP, MAX_STEP);
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
/// per-process figures do not add up to the device counter (on an H100 a
/// lone matmul read 25 against 31), but their proportions attribute it.
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

    /// The plant: the container's share when each launch really costs
    /// `truth` × its estimate, charged `gain` × its estimate.
    fn plant(limit: u32, truth: f64, gain: f64) -> f64 {
        (f64::from(limit) * truth / gain).min(100.0)
    }

    fn run(limit: u32, truth: f64, periods: usize) -> Vec<f64> {
        let mut g = 1.0;
        let mut out = vec![g];
        for _ in 0..periods {
            let m = plant(limit, truth, g);
            g = step(
                g,
                limit,
                Reading {
                    measured: m,
                    throttled: true,
                },
            );
            out.push(g);
        }
        out
    }

    fn monotone(v: &[f64]) -> bool {
        v.windows(2).all(|w| w[1] >= w[0]) || v.windows(2).all(|w| w[1] <= w[0])
    }

    #[test]
    fn converges_on_an_under_estimate_without_oscillating() {
        // Kernels cost 10 % more than learnt (the min-filter at limit 60).
        let g = run(60, 1.1, 8);
        assert!(monotone(&g), "{g:?}");
        let m = plant(60, 1.1, g[5]);
        assert!((m - 60.0).abs() < 1.5, "{g:?} → {m}");
        assert!(g.iter().all(|x| *x <= 1.1 + 1e-9), "overshoot {g:?}");
    }

    #[test]
    fn converges_on_a_double_over_estimate_without_oscillating() {
        // Tiny kernels charged twice their real time (launch latency).
        let g = run(30, 0.5, 8);
        assert!(monotone(&g), "{g:?}");
        let m = plant(30, 0.5, g[5]);
        assert!((m - 30.0).abs() < 1.5, "{g:?} → {m}");
        assert!(g.iter().all(|x| *x >= 0.5 - 1e-9), "overshoot {g:?}");
    }

    #[test]
    fn saturated_measurement_still_raises_the_gain() {
        // At 90 % an under-estimate shows as 100 % (NVML caps it).
        let g = run(90, 1.3, 12);
        assert!(monotone(&g), "{g:?}");
        assert!(plant(90, 1.3, g[12]) < 92.0, "{g:?}");
    }

    #[test]
    fn holds_when_idle_or_not_throttled() {
        let idle = Reading {
            measured: 0.0,
            throttled: false,
        };
        let under = Reading {
            measured: 12.0,
            throttled: false,
        };
        let mut g = 1.7;
        for _ in 0..100 {
            g = step(g, 30, idle);
            g = step(g, 30, under);
        }
        assert_eq!(g, 1.7);
        // In the dead band: hold too.
        assert_eq!(
            step(
                0.8,
                50,
                Reading {
                    measured: 50.5,
                    throttled: true
                }
            ),
            0.8
        );
    }

    #[test]
    fn bounded_per_step_and_overall() {
        let zero = Reading {
            measured: 0.0,
            throttled: true,
        };
        assert!((step(1.0, 30, zero) - 1.0 / MAX_STEP).abs() < 1e-12);
        let mut g = 1.0;
        for _ in 0..50 {
            g = step(g, 30, zero);
        }
        assert_eq!(g, GAIN_MIN);
        let full = Reading {
            measured: 100.0,
            throttled: true,
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
