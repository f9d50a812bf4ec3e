//! The correction's laws against a model of the container (the feedback
//! law's plant) and a sidecar word (the turns' law).

use super::*;
use crate::sm::tuning::{FEEDBACK_MAX_STEP, TURN_RATIO_MAX};
use vgpu_common::region::rules::sm_limit;

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
        g = step(
            g,
            sm_limit(u64::from(limit)),
            reading(plant(limit, demand, truth, g)),
        );
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
        g = step(g, sm_limit(30), idle);
        g = step(g, sm_limit(30), nearly_idle);
    }
    assert_eq!(g, 1.7);
    let close = Reading {
        measured: 50.5,
        charged: 50.0,
        shared: false,
    };
    assert_eq!(step(0.8, sm_limit(50), close), 0.8);
    // No limit: nothing to correct.
    let off = Reading {
        measured: 90.0,
        charged: 30.0,
        shared: false,
    };
    assert_eq!(step(0.8, sm_limit(0), off), 0.8);
    assert_eq!(step(0.8, sm_limit(100), off), 0.8);
}

#[test]
fn bounded_per_step_and_overall() {
    let zero = Reading {
        measured: 0.0,
        charged: 30.0,
        shared: false,
    };
    assert!((step(1.0, sm_limit(30), zero) - 1.0 / FEEDBACK_MAX_STEP).abs() < 1e-12);
    let mut g = 1.0;
    for _ in 0..50 {
        g = step(g, sm_limit(30), zero);
    }
    assert_eq!(g, FACTOR_MIN);
    let full = Reading {
        measured: 100.0,
        charged: 10.0,
        shared: false,
    };
    for _ in 0..50 {
        g = step(g, sm_limit(10), full);
    }
    assert_eq!(g, FACTOR_MAX);
    assert_eq!(
        step(f64::NAN, sm_limit(30), full),
        step(1.0, sm_limit(30), full)
    );
    assert_eq!(decode(0), 1.0);
    assert_eq!(decode(encode(2.5)), 2.5);
    assert_eq!(decode(f64::NAN.to_bits()), 1.0);
}

#[test]
fn a_turn_moves_the_factor_half_its_log_error_within_bounds() {
    let b = DevBucket::default();
    // Took 10 % more than charged: half the log-error.
    let f = from_turn(&b, 1_100_000, 1_000_000).unwrap();
    assert!((f - 1.1f64.sqrt()).abs() < 1e-9, "{f}");
    assert_eq!(factor(&b), f);
    // Repeated, it converges on the error and stays there.
    let charged = |f: f64| (1_000_000.0 * f) as u64;
    for _ in 0..20 {
        let c = charged(factor(&b));
        let _ = from_turn(&b, 1_100_000, c);
    }
    assert!((factor(&b) - 1.1).abs() < 0.02, "{}", factor(&b));
    // Within 1 %: no change. Outside [TURN_RATIO_MIN, TURN_RATIO_MAX]: not
    // a cost error, not used.
    let was = factor(&b);
    assert_eq!(from_turn(&b, charged(was) + 1, charged(was)), None);
    assert_eq!(from_turn(&b, 3_000_000, 1_000_000), None);
    assert_eq!(from_turn(&b, 100_000, 1_000_000), None);
    assert_eq!(from_turn(&b, 1, 0), None);
    assert_eq!(factor(&b), was);
}

#[test]
fn turns_that_always_read_long_do_not_walk_the_factor_away() {
    // Each turn reads 1.6× whatever it was charged (its events span time
    // that is not the container's work): judged by the ratio alone, every
    // one would be believed and the factor would climb to its bound.
    let b = DevBucket::default();
    for _ in 0..50 {
        let c = (1_000_000.0 * factor(&b)) as u64;
        let _ = from_turn(&b, c * 16 / 10, c);
    }
    let f = factor(&b);
    assert!(f <= TURN_RATIO_MAX, "factor {f:.3}");
    assert!(f > 1.0, "one turn is believed: {f:.3}");
}

#[test]
fn the_demand_measure_trusts_a_factor_under_one_only_on_the_bucket() {
    let b = DevBucket::default();
    assert_eq!(demand_rate(&b, false), 1.0);
    b.gain.store(encode(0.5), Relaxed);
    assert_eq!(demand_rate(&b, false), 1.0);
    b.gain.store(encode(1.25), Relaxed);
    assert_eq!(demand_rate(&b, false), 0.8);
    assert_eq!(demand_rate(&b, true), 1.0);
    open(&b);
    assert_eq!(factor(&b), 1.0);
    assert_eq!(apply(1000, 1.0), 1000);
    assert_eq!(apply(1000, 0.5), 500);
}
