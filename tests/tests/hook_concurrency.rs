//! Several processes sharing one limit, and processes killed at any instant.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_common::region::MAX_DEVICES;
use vgpu_tests::hook::{field, run, HookEnv, Running};

const G: u64 = 1 << 30;

fn region_used(env: &HookEnv, dev: usize) -> u64 {
    let f = env.region();
    let r = f.region();
    assert!(dev < MAX_DEVICES);
    r.active_slots()
        .iter()
        .filter(|s| s.pid.load(Ordering::SeqCst) != 0)
        .map(|s| s.used[dev].total.load(Ordering::SeqCst))
        .sum()
}

/// Eight processes allocating and freeing random sizes at once never hold
/// more than the limit in sum: not in the region, not on the (simulated)
/// device as NVML sees it.
#[test]
fn eight_processes_never_pass_the_limit() {
    let env = HookEnv::new("eight", "2g").env("SIMGPU_CONTEXT_BYTES", "64m");
    let exe = env.build("hook_mem");
    let nvml = env.build("hook_nvml");
    let mut procs: Vec<Running> = (0..8)
        .map(|_| Running::start(env.hooked(&exe, &["stress", "2"])))
        .collect();
    for p in &mut procs {
        assert_eq!(p.wait_for("ready"), "ready");
    }
    let watcher = Running::start(env.unhooked(&nvml, &["watch", "2500"]));
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        let path = env.region_path();
        std::thread::spawn(move || {
            let f = vgpu_common::view::RegionFile::open(&path, vgpu_common::view::Access::ReadOnly)
                .expect("region");
            while !stop.load(Ordering::Relaxed) {
                let used: u64 = f
                    .region()
                    .active_slots()
                    .iter()
                    .filter(|s| s.pid.load(Ordering::SeqCst) != 0)
                    .map(|s| s.used[0].total.load(Ordering::SeqCst))
                    .sum();
                peak.fetch_max(used, Ordering::Relaxed);
            }
        })
    };
    for p in &mut procs {
        let _ = writeln!(p.child.stdin.as_mut().expect("stdin"), "go");
    }
    let mut total_ok = 0;
    for p in &mut procs {
        let l = p.wait_for("ok");
        total_ok += field(&l, "ok").unwrap_or(0);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut watcher = watcher;
    let w = watcher.wait_for("max_used");
    let nvml_peak = field(&w, "max_used").expect("nvml watcher output");
    assert!(total_ok > 0, "no allocation succeeded");
    assert!(
        peak.load(Ordering::Relaxed) <= 2 * G,
        "region peak {}",
        peak.load(Ordering::Relaxed)
    );
    assert!(nvml_peak <= 2 * G, "device peak per NVML {nvml_peak}");
    assert!(nvml_peak > 0, "{w}");
}

/// Processes SIGKILLed in the middle of registration or of an alloc/free
/// loop never wedge the region: the next process starts and allocates all
/// of the limit within a second.
#[test]
fn sigkill_at_any_instant_never_wedges_the_region() {
    let env = HookEnv::new("sigkill", "1g");
    let exe = env.build("hook_mem");
    for i in 0..12u64 {
        let mut p = Running::start(env.hooked(&exe, &["loop"]));
        if i % 2 == 0 {
            // During start-up: registration, context creation.
            std::thread::sleep(Duration::from_millis(i * 3));
        } else {
            let _ = p.wait_for("looping");
            std::thread::sleep(Duration::from_millis(i));
        }
        p.kill9();
    }
    let t0 = Instant::now();
    let (ok, out, err) = run(env.hooked(&exe, &["fill"]));
    let took = t0.elapsed();
    assert!(ok, "{out}{err}");
    assert!(took < Duration::from_secs(1), "took {took:?}: {out}");
    assert_eq!(
        region_used(&env, 0),
        0,
        "the filler exited; nothing left counted"
    );
}
