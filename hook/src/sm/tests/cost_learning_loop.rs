//! Costs learnt while the controller runs: an under-using container learns
//! without being held, one never held by its charges is measured and held,
//! known costs charged from the thread's cache while still sampled.

use super::*;

#[test]
fn an_under_using_container_learns_its_costs_without_being_held() {
    // Costs read 2× long, but the application itself only uses 10 % of a
    // 60 % limit: never throttled, its share stays its own while the correction
    // learns the error, so a later burst is held at the limit at once.
    let c = closed_loop(60, 200, NVML_PID as i32);
    let f = &c.driver;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let start = f.now();
    while f.now() < start + 4 * SEC {
        launch_once(&c, &w, 1_000_000, 10_000_000);
    }
    assert_eq!(
        c.world.clock.sleeps(),
        0,
        "an application under its limit waited"
    );
    let s = busy_share(f, start + SEC, start + 4 * SEC);
    assert!((s - 10.0).abs() < 0.5, "{s:.1}%");
    let g = c.factor(0);
    assert!((0.45..0.56).contains(&g), "correction {g:.3}");
    let s = run(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 2);
    assert!(
        (s - 60.0).abs() < 3.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
}

#[test]
fn a_container_never_held_by_its_charges_is_measured_and_held() {
    // Costs learnt at 60 % of the truth at a 90 % limit: the charges never
    // empty the bucket (the device saturates first), so only a measurement
    // on the unthrottled path can find the error.
    let c = closed_loop(90, 60, NVML_PID as i32);
    *c.driver.device.lock().unwrap() = Some(vec![NVML_PID]);
    let s = run(&c, kernel(1), 1_000_000, 8 * SEC, 5 * SEC);
    assert!(
        (s - 90.0).abs() < 2.5,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
}

#[test]
fn a_known_cost_is_charged_from_the_threads_cache_and_still_sampled() {
    // Once a kernel's cost is learnt, its launches are charged from the
    // thread's cache (no lock); the cache reports them, so the occasional
    // timing still comes every `SAMPLE_EVERY` launches and every launch is
    // charged.
    let c = sim(Setup::new(90, policy::FORCE));
    let f = &c.driver;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let launch = || launch_once(&c, &w, 10_000, 1_000_000);
    for _ in 0..crate::sm::cost_learning::cost::EARLY_SAMPLES * 2 {
        launch();
    }
    assert_eq!(c.estimate(&kernel(1)), Some(10_000));
    let (records, charged) = (f.records.load(Relaxed), c.charged_ns(0));
    let n = 20 * crate::sm::cost_learning::cost::SAMPLE_EVERY;
    for _ in 0..n {
        launch();
    }
    let samples = (f.records.load(Relaxed) - records) / 2;
    assert!((19..=21).contains(&samples), "{samples} samples");
    assert_eq!(c.charged_ns(0) - charged, n as i64 * 10_000);
}
