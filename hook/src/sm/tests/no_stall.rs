//! What a launch may wait (docs/sm-limit.md, "No stall"): a neighbour's
//! queue, long kernel, resumptions or context-switch storm never stall the
//! process's work longer than the bound.

use super::*;

/// The bound of docs/sm-limit.md on any wait, for `cost` ns kernels at
/// `pct`: one frame of settled debt, the kernel's own wall time at the
/// limit, the batch and the lead, and the fake host's sleep slack.
fn stall_bound(cost: u64, pct: u32) -> u64 {
    crate::sm::tuning::FRAME_NS
        + crate::sm::admission::gcra::wall_of(cost, pct)
        + crate::sm::admission::gcra::BATCH_NS
        + crate::sm::admission::gcra::LEAD_NS
        + 1_000_000
}

/// A process saturating the device is killed, and its queued
/// kernels still occupy the device when a new process at 30 % starts the
/// same loop: the new one's first timing waited behind them. It must make
/// progress at once and get its 30 %.
#[test]
fn a_killed_neighbours_queue_does_not_stall_a_new_process() {
    for queue in [50_000_000u64, 500_000_000] {
        let c = sim(Setup::new(30, policy::DEFAULT));
        let t0 = c.world.now();
        c.driver.foreign_until.store(t0 + queue, Relaxed);
        let s = run(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2 + queue);
        let gap = longest_gap(&c.driver, t0 + queue, t0 + 3 * SEC);
        eprintln!(
            "neighbour's queue {} ms: share {s:.1} %, longest gap {:.1} ms",
            queue / 1_000_000,
            gap as f64 / 1e6
        );
        assert!(
            gap <= stall_bound(2_000_000, 30),
            "neighbour's queue {} ms: no kernel of ours for {:.1} ms",
            queue / 1_000_000,
            gap as f64 / 1e6
        );
        assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
        assert_eq!(c.estimate(&kernel(1)), Some(2_000_000));
    }
}

/// A neighbour's 300 ms kernel lands just as the process starts launching
/// a new kernel (new key): that key's first timing holds the 300 ms. No
/// wait beyond the neighbour's kernel and the bound, and the share holds.
#[test]
fn a_neighbours_long_kernel_does_not_stall_a_new_key() {
    let c = sim(Setup::new(30, policy::DEFAULT));
    run(&c, kernel(1), 1_000_000, SEC, 0);
    let t1 = c.world.now();
    let long = 300_000_000;
    c.driver.foreign_until.store(t1 + long, Relaxed);
    let s = run(&c, kernel(2), 1_000_000, 3 * SEC, SEC);
    let gap = longest_gap(&c.driver, t1 + long, t1 + 3 * SEC);
    assert!(
        gap <= stall_bound(1_000_000, 30),
        "no kernel of ours for {:.1} ms",
        gap as f64 / 1e6
    );
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
    assert_eq!(c.estimate(&kernel(2)), Some(1_000_000));
}

/// A neighbour suspended and resumed every 500 ms dumps 40 ms of queued
/// work each time, just as the process moves on to a new kernel shape.
#[test]
fn a_suspended_then_resumed_neighbour_does_not_stall_new_keys() {
    let c = sim(Setup::new(30, policy::DEFAULT));
    let t0 = c.world.now();
    let burst = 40_000_000;
    for i in 0..6 {
        let at = c.world.now();
        c.driver.foreign_until.store(at + burst, Relaxed);
        run(&c, kernel(10 + i), 500_000, SEC / 2, 0);
    }
    let end = c.world.now();
    let gap = longest_gap(&c.driver, t0, end);
    assert!(
        gap <= burst + stall_bound(500_000, 30),
        "no kernel of ours for {:.1} ms",
        gap as f64 / 1e6
    );
    let s = busy_share(&c.driver, t0 + SEC / 2, end);
    // Each new key's guessed launches are settled, capped at a frame: the
    // share may exceed the limit a little, never fall far below it.
    assert!((25.0..=35.0).contains(&s), "{s:.1}%");
}

/// A context-switch storm: another context's 300 µs of work lands before
/// each of our 2 ms kernels, so every timing reads 15 % long. The charges
/// are then 15 % high (the feedback loop's to correct, with NVML), but no
/// launch waits longer than the bound.
#[test]
fn a_context_switch_storm_inflates_costs_but_never_stalls() {
    let c = sim(Setup::new(30, policy::DEFAULT));
    let t0 = c.world.now();
    let s = run_with(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2, |f| {
        let free = f.gpu.lock().unwrap().free_at.max(f.now());
        f.foreign_until.store(free + 300_000, Relaxed);
    });
    let gap = longest_gap(&c.driver, t0, t0 + 3 * SEC);
    assert!(
        gap <= stall_bound(2_300_000, 30),
        "no kernel of ours for {:.1} ms",
        gap as f64 / 1e6
    );
    let est = c.estimate(&kernel(1)).unwrap_or(0);
    assert!((2_000_000..=2_300_000).contains(&est), "{est}");
    assert!((24.0..=32.0).contains(&s), "{s:.1}%");
}
