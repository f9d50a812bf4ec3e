//! Priorities between containers: a low-priority trainer beside a
//! service, equal priorities, a busy high-priority neighbour, a light
//! service's bursts.

use super::*;

/// A trainer of priority 1, no limit, beside a service of priority 0
/// (another container, the daemon planning for both) that
/// sends a request of `req` GPU ns every 20 ms until `until`: the request
/// queues behind whatever the trainer has queued (one FIFO device).
/// Returns, per request, what it found queued ahead of it.
fn trainer_beside_service(
    c: &Sim,
    service: &Neighbour,
    req: u64,
    dur: u64,
    until: u64,
) -> Vec<u64> {
    let mut next_req = c.world.now();
    let mut ahead = Vec::new();
    let start = c.world.now();
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    while c.world.now() < start + dur {
        let f = &c.driver;
        let q = f.gpu.lock().unwrap().free_at;
        if q > f.now() + QUEUE_NS {
            f.clock.set(q - QUEUE_NS);
        }
        let now = f.now();
        if now >= next_req && now < until {
            // The service's request: queued on the device after the
            // trainer's work, published as in flight.
            let g = f.gpu.lock().unwrap();
            let s = g.free_at.max(now).max(f.foreign_until.load(Relaxed));
            ahead.push(s - now);
            f.foreign_until.store(s + req, Relaxed);
            drop(g);
            service.touch(now, 0);
            service.queued(now, req);
            next_req += 20_000_000;
        }
        launch_once(c, &w, 200_000, 1_500);
    }
    ahead
}

fn ranked_trainer() -> (Sim, &'static Neighbour) {
    let (f, node) = on_node(Setup::new(0, policy::DEFAULT));
    f.world.ranked.store(true, Relaxed);
    f.world.shm().priority.store(1, Relaxed);
    let c = sim(f);
    let service = neighbour(node, c.world.now(), 0);
    service.set_priority(Some(0));
    (c, service)
}

/// Beside an active service of higher priority, the trainer keeps at most
/// `LOW_QUEUE_NS` queued, so each request finds at most that ahead of it
/// (not the driver's whole 50 ms queue), while the trainer keeps the device busy. When the service stops, the
/// trainer is free again within a frame.
#[test]
fn a_low_priority_trainer_keeps_its_queue_short_beside_a_service() {
    let (c, service) = ranked_trainer();
    let t0 = c.world.now();
    let stop = t0 + 2 * SEC;
    let ahead = trainer_beside_service(&c, service, 500_000, 3 * SEC, stop);
    // The first request comes before the trainer has seen the service.
    let worst = ahead.iter().skip(2).max().copied().unwrap_or(0);
    assert!(ahead.len() > 90, "{} requests", ahead.len());
    assert!(
        worst <= crate::sm::tuning::LOW_QUEUE_NS + 100_000,
        "a request found {:.2} ms queued ahead of it",
        worst as f64 / 1e6
    );
    // The trainer still keeps the device busy: all but the service's 2.5 %.
    let s = busy_share(&c.driver, t0 + SEC / 2, stop);
    assert!(s > 92.0, "trainer {s:.1}%");
    // A frame after the service's last request the trainer queues freely
    // again (the driver's 50 ms).
    let q = c.driver.gpu.lock().unwrap().free_at - c.world.now();
    assert!(q > 40_000_000, "queue {:.1} ms", q as f64 / 1e6);
    let free = busy_share(&c.driver, stop + crate::sm::tuning::FRAME_NS, c.world.now());
    assert!(free > 99.0, "{free:.1}%");
}

/// Equal priorities (or none stated) hold nothing: the service's requests
/// find the trainer's whole queue, as on a time-sliced GPU without vgpu.
#[test]
fn equal_priorities_hold_nothing() {
    let (c, service) = ranked_trainer();
    service.set_priority(Some(1));
    let until = c.world.now() + SEC;
    let ahead = trainer_beside_service(&c, service, 500_000, SEC, until);
    assert!(ahead.len() > 40, "{} requests", ahead.len());
    let worst = ahead.iter().skip(2).max().copied().unwrap_or(0);
    assert!(worst > 40_000_000, "{:.1} ms", worst as f64 / 1e6);
    assert_eq!(c.world.clock.sleeps(), 0);
}

/// A service of higher priority that keeps the GPU busy does not starve the
/// low one: it waits for the other's work in flight at most a frame at a
/// time, then goes with its short queue.
#[test]
fn a_busy_high_priority_container_does_not_starve_the_low_one() {
    let (c, service) = ranked_trainer();
    let t0 = c.world.now();
    let s = run_with(&c, kernel(1), 200_000, 2 * SEC, SEC / 2, |f| {
        let now = f.now();
        service.touch(now, 0);
        // Always 100 ms of work in flight.
        service.inflight_until.store(now + 100_000_000, Relaxed);
    });
    let gap = longest_gap(&c.driver, t0 + SEC / 2, t0 + 2 * SEC);
    assert!(s > 1.0, "low-priority share {s:.2}%");
    assert!(
        gap <= crate::sm::tuning::YIELD_MAX_NS + 2_000_000,
        "no kernel of the low one for {:.1} ms",
        gap as f64 / 1e6
    );
}

/// Equal priority at 30 %: a light service (4 kernels of 0.25 ms every
/// 20 ms, 5 % of the device) whose timings read 3× long (they waited
/// behind a trainer's queue on a time-sliced GPU) is charged 15 %, half its
/// share: once that is measured its bucket holds a frame, and no request
/// is held. With the 4 ms bucket the fourth kernel of each request waited
/// about 4 ms.
#[test]
fn a_light_service_is_not_held_for_its_bursts() {
    let c = sim(Setup::new(30, policy::DEFAULT));
    c.driver.skew_pct.store(300, Relaxed);
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let start = c.world.now();
    let mut took = Vec::new();
    while c.world.now() < start + 2 * SEC {
        let at = c.world.now();
        for _ in 0..4 {
            launch_once(&c, &w, 250_000, 1_500);
        }
        // Synchronize: the request ends when its kernels do.
        let end = c.driver.gpu.lock().unwrap().free_at;
        if at > start + 300_000_000 {
            took.push(end - at);
        }
        c.world.clock.set(at + 20_000_000);
    }
    let worst = took.iter().max().copied().unwrap_or(0);
    assert!(
        worst <= 1_100_000,
        "a request took {:.2} ms",
        worst as f64 / 1e6
    );
}
