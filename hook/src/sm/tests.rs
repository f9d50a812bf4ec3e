//! The controller against a fake clock and a fake GPU: a single queue that
//! runs kernels back to back, events completing when the queue reaches
//! them, and a host that launches in a loop (blocking, like a driver, once
//! the queue is 50 ms ahead).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;

use vgpu_common::region::{policy, SharedRegion};
use vgpu_common::view::RegionFile;

use super::control::{Controller, Work};
use super::cost::Key;
use super::node::NodeFile;
use super::phase;
use super::sys::{Clock, Container, Events, NodeTable, Nvml, Poll};
use crate::sidecar::{self, SmShared};

const QUEUE_NS: u64 = 50_000_000;
const SLACK_NS: u64 = 60_000;

#[derive(Default)]
struct Gpu {
    free_at: u64,
    intervals: Vec<(u64, u64)>,
    events: HashMap<usize, u64>,
    next: usize,
}

struct Fake {
    now: AtomicU64,
    gpu: Mutex<Gpu>,
    file: RegionFile,
    _dir: tempfile::TempDir,
    policy: i32,
    buckets: &'static SmShared,
    sleeps: AtomicU32,
    /// Unblock the container after this many sleeps (0: never).
    unblock_after: AtomicU32,
    /// Timings read back as this percent of the real ones (a wrongly learnt
    /// cost); 100 = exact.
    skew_pct: AtomicU64,
    /// Fake NVML: per-process utilization over the last 200 ms, reported
    /// as host pid `NVML_PID`.
    nvml: std::sync::atomic::AtomicBool,
    /// Per-process samples read as this percent of the truth (100 = exact).
    proc_pct: AtomicU64,
    /// Another container's process (`OTHER_PID`) keeps the device busy
    /// this percent of the time, as NVML sees it (0: no such process).
    other_pct: AtomicU64,
    /// Fake NVML also reports the device's utilization, with these host
    /// pids running on it.
    device: Mutex<Option<Vec<u32>>>,
    /// Stream 0 is being captured into a graph.
    capturing: std::sync::atomic::AtomicBool,
    /// Events recorded so far.
    records: AtomicU32,
    /// NVML's per-process samples as on a real GPU: one per process per
    /// second, each covering that second (ours on the second, the other
    /// process's half a second later), instead of one each per query.
    sparse: std::sync::atomic::AtomicBool,
    /// Fake ns at which the other container's process exited (0: it has
    /// not); NVML then lists only ours, and its device utilization since a
    /// time before that still holds the other's busy time.
    other_exit: AtomicU64,
    /// Until this fake ns the device counter reads half the truth (NVML's
    /// samples lagging a start).
    lag_until: AtomicU64,
    /// The node's table of limited containers (none: the container is
    /// alone on the node).
    node: Option<&'static NodeFile>,
    /// Every sleep overshoots by this much more (a host whose timers run
    /// late: a loaded VM, a CPU quota).
    late_ns: AtomicU64,
    /// Another context's work occupies the device until this fake ns: our
    /// kernels start after it, our events (recorded on our own stream)
    /// do not wait for it.
    foreign_until: AtomicU64,
    /// Takes part in the node's priorities without a limit.
    ranked: std::sync::atomic::AtomicBool,
    /// Feedback steps are left to `Controller::background`.
    offload: std::sync::atomic::AtomicBool,
    /// This process's pid as it sees it (0: the test process's own).
    own_pid: AtomicU32,
    /// The buckets are this process's own, not the container's.
    private_buckets: std::sync::atomic::AtomicBool,
    /// Context and capture queries made (driver calls of the launch path).
    queries: AtomicU32,
}

/// `Fake::unix_us` at fake time 0.
const UNIX_BASE_US: u64 = 1_700_000_000_000_000;

const NVML_PID: u32 = 4242;
const OTHER_PID: u32 = 9999;

impl Fake {
    fn new(pct: u64, policy_: i32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        let r = file.region();
        r.sm_limit[0].store(pct, Relaxed);
        r.utilization_switch.store(1, Relaxed);
        r.recent_kernel.store(2, Relaxed);
        Fake {
            now: AtomicU64::new(1_000_000_000),
            gpu: Mutex::new(Gpu::default()),
            file,
            _dir: dir,
            policy: policy_,
            buckets: sidecar::private(),
            sleeps: AtomicU32::new(0),
            unblock_after: AtomicU32::new(0),
            skew_pct: AtomicU64::new(100),
            nvml: std::sync::atomic::AtomicBool::new(false),
            proc_pct: AtomicU64::new(100),
            other_pct: AtomicU64::new(0),
            device: Mutex::new(None),
            capturing: std::sync::atomic::AtomicBool::new(false),
            records: AtomicU32::new(0),
            sparse: std::sync::atomic::AtomicBool::new(false),
            other_exit: AtomicU64::new(0),
            lag_until: AtomicU64::new(0),
            node: None,
            late_ns: AtomicU64::new(0),
            foreign_until: AtomicU64::new(0),
            ranked: std::sync::atomic::AtomicBool::new(false),
            offload: std::sync::atomic::AtomicBool::new(false),
            own_pid: AtomicU32::new(0),
            private_buckets: std::sync::atomic::AtomicBool::new(false),
            queries: AtomicU32::new(0),
        }
    }

    fn advance(&self, ns: u64) {
        self.now.fetch_add(ns, Relaxed);
    }
}

impl Clock for Fake {
    fn now(&self) -> u64 {
        self.now.load(Relaxed)
    }

    fn coarse(&self) -> u64 {
        self.now()
    }

    fn unix_secs(&self) -> u64 {
        self.unix_us() / 1_000_000
    }

    fn sleep_until(&self, t: u64) {
        let n = self.sleeps.fetch_add(1, Relaxed) + 1;
        if n == self.unblock_after.load(Relaxed) {
            self.file.region().recent_kernel.store(0, Relaxed);
        }
        self.now
            .fetch_max(t + SLACK_NS + self.late_ns.load(Relaxed), Relaxed);
    }

    fn unix_us(&self) -> u64 {
        UNIX_BASE_US + self.now() / 1_000
    }
}

impl Events for Fake {
    fn current(&self) -> Option<(usize, usize)> {
        self.queries.fetch_add(1, Relaxed);
        Some((7, 0))
    }

    fn only_device(&self) -> Option<usize> {
        Some(0)
    }

    fn create_event(&self) -> Option<usize> {
        let mut g = self.gpu.lock().unwrap();
        g.next += 1;
        Some(g.next)
    }

    fn destroy_event(&self, ev: usize) {
        self.gpu.lock().unwrap().events.remove(&ev);
    }

    fn record(&self, ev: usize, _stream: usize) -> bool {
        self.records.fetch_add(1, Relaxed);
        let mut g = self.gpu.lock().unwrap();
        let t = g.free_at.max(self.now());
        g.events.insert(ev, t);
        true
    }

    fn query(&self, ev: usize) -> Poll {
        match self.gpu.lock().unwrap().events.get(&ev) {
            Some(&t) if t <= self.now() => Poll::Ready,
            Some(_) => Poll::NotReady,
            None => Poll::Failed,
        }
    }

    fn elapsed_ns(&self, a: usize, b: usize) -> Option<u64> {
        let g = self.gpu.lock().unwrap();
        Some((g.events.get(&b)? - g.events.get(&a)?) * self.skew_pct.load(Relaxed) / 100)
    }

    fn capturing(&self, _stream: usize) -> bool {
        self.queries.fetch_add(1, Relaxed);
        self.capturing.load(Relaxed)
    }
}

impl Container for Fake {
    fn region(&self) -> Option<(&SharedRegion, usize)> {
        Some((self.file.region(), 0))
    }

    fn policy(&self) -> i32 {
        self.policy
    }

    fn buckets(&self) -> &'static SmShared {
        self.buckets
    }

    fn buckets_shared(&self) -> bool {
        !self.private_buckets.load(Relaxed)
    }

    fn pid(&self) -> u32 {
        match self.own_pid.load(Relaxed) {
            0 => std::process::id(),
            p => p,
        }
    }
}

impl Nvml for Fake {
    fn proc_util(&self, _dev: usize, since_us: u64) -> Option<Vec<(u32, u32)>> {
        if !self.nvml.load(Relaxed) {
            return None;
        }
        let now = self.now();
        let skew = self.proc_pct.load(Relaxed) as f64 / 100.0;
        let other = self.other_pct.load(Relaxed);
        let exit = self.other_exit.load(Relaxed);
        let other_at = |t: u64| other > 0 && (exit == 0 || t <= exit);
        if self.sparse.load(Relaxed) {
            let since = since_us.saturating_sub(UNIX_BASE_US).saturating_mul(1_000);
            let mut v = Vec::new();
            let mut t = since / SEC * SEC;
            while t <= now {
                if t > since && t >= SEC {
                    let u = busy_share(self, t - SEC, t);
                    v.push((NVML_PID, (u * skew).round() as u32));
                }
                if other_at(t + SEC / 2) && t + SEC / 2 > since && t + SEC / 2 <= now {
                    v.push((OTHER_PID, (other as f64 * skew).round() as u32));
                }
                t += SEC;
            }
            return Some(v);
        }
        let u = busy_share(self, now.saturating_sub(200_000_000), now);
        let mut v = vec![(NVML_PID, (u * skew).round() as u32)];
        if other_at(now) {
            v.push((OTHER_PID, (other as f64 * skew).round() as u32));
        }
        Some(v)
    }

    fn device_busy(&self, _dev: usize, since_us: u64) -> Option<(f64, Vec<u32>)> {
        let pids = self.device.lock().unwrap().clone()?;
        let now = self.now();
        let exit = self.other_exit.load(Relaxed);
        if exit != 0 && now >= exit {
            // The mean since `since_us`, as NVML's samples give it.
            let since = since_us.saturating_sub(UNIX_BASE_US).saturating_mul(1_000);
            let since = since.clamp(now.saturating_sub(10 * SEC), now.saturating_sub(1));
            let other = self.other_pct.load(Relaxed) as f64 * exit.saturating_sub(since) as f64
                / (now - since) as f64;
            let u = busy_share(self, since, now) + other;
            let ours = pids.into_iter().filter(|&p| p != OTHER_PID).collect();
            return Some((u.min(100.0), ours));
        }
        let mut u = busy_share(self, now.saturating_sub(200_000_000), now);
        if now < self.lag_until.load(Relaxed) {
            u /= 2.0;
        }
        Some(((u + self.other_pct.load(Relaxed) as f64).min(100.0), pids))
    }

    fn offload(&self) -> bool {
        self.offload.load(Relaxed)
    }
}

impl NodeTable for Fake {
    fn node(&self, _dev: usize) -> Option<&'static NodeFile> {
        self.node
    }

    fn ranked(&self) -> bool {
        self.ranked.load(Relaxed)
    }
}

/// Runs launches of `cost` (key `key`) for `dur` of fake time; returns the
/// GPU's busy share (percent) over the last `dur - warmup`.
fn run(c: &Controller<Fake>, key: Key, cost: u64, dur: u64, warmup: u64) -> f64 {
    run_with(c, key, cost, dur, warmup, |_| {})
}

/// `run`, calling `each` before every launch.
fn run_with(
    c: &Controller<Fake>,
    key: Key,
    cost: u64,
    dur: u64,
    warmup: u64,
    mut each: impl FnMut(&Fake),
) -> f64 {
    let f = &c.sys;
    let start = f.now();
    let w = Work { key, stream: 0 };
    while f.now() < start + dur {
        // The driver blocks while the queue is too far ahead.
        let ahead = f.gpu.lock().unwrap().free_at;
        if ahead > f.now() + QUEUE_NS {
            f.now.store(ahead - QUEUE_NS, Relaxed);
        }
        each(f);
        launch_once(c, &w, cost, 1_500);
    }
    busy_share(f, start + warmup, start + dur)
}

/// One launch of `cost` GPU ns through the controller, then `gap` of host
/// time before the next.
fn launch_once(c: &Controller<Fake>, w: &Work, cost: u64, gap: u64) {
    let f = &c.sys;
    let t = c.before(w);
    {
        let mut g = f.gpu.lock().unwrap();
        let s = g.free_at.max(f.now()).max(f.foreign_until.load(Relaxed));
        g.free_at = s + cost;
        g.intervals.push((s, s + cost));
    }
    c.after_opt(t, true);
    f.advance(gap);
}

fn busy_share(f: &Fake, from: u64, to: u64) -> f64 {
    let g = f.gpu.lock().unwrap();
    let busy: u64 = g
        .intervals
        .iter()
        .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
        .sum();
    busy as f64 * 100.0 / (to - from) as f64
}

impl Controller<Fake> {
    fn after_opt(&self, t: Option<super::Ticket>, ok: bool) {
        if let Some(t) = t {
            self.after(t, ok);
        }
    }
}

const SEC: u64 = 1_000_000_000;

fn kernel(func: usize) -> Key {
    Key::Kernel {
        func,
        grid: [1, 1, 1],
        block: [128, 1, 1],
    }
}

#[test]
fn long_and_tiny_kernels_get_their_share() {
    for pct in [10u64, 30, 60, 90] {
        for cost in [2_000_000u64, 10_000] {
            let c = Controller::new(Fake::new(pct, policy::DEFAULT));
            let s = run(&c, kernel(1), cost, 3 * SEC, SEC / 2);
            assert!(
                (s - pct as f64).abs() < 2.0,
                "limit {pct}, kernel {cost} ns: {s:.1}%"
            );
            assert_eq!(c.estimate(&kernel(1)), Some(cost));
        }
    }
}

/// Buckets the container's processes cannot share (its sidecar lost or
/// unusable) fail closed: each of its 4 live processes takes a quarter of
/// the limit, so that together they stay within it.
#[test]
fn private_buckets_take_a_part_of_the_limit() {
    let f = Fake::new(40, policy::DEFAULT);
    f.private_buckets.store(true, Relaxed);
    let r = f.file.region();
    for (i, s) in r.procs.iter().take(4).enumerate() {
        s.pid.store(100 + i as i32, Relaxed);
    }
    r.proc_num.store(4, Relaxed);
    let c = Controller::new(f);
    let s = run(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2);
    assert!((s - 10.0).abs() < 2.0, "limit 40 over 4 processes: {s:.1}%");
    // Alone in the container, the process takes the whole limit.
    let f = Fake::new(40, policy::DEFAULT);
    f.private_buckets.store(true, Relaxed);
    let c = Controller::new(f);
    let s = run(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2);
    assert!((s - 40.0).abs() < 2.0, "limit 40 alone: {s:.1}%");
}

#[test]
fn graphs_are_limited() {
    let c = Controller::new(Fake::new(30, policy::DEFAULT));
    let s = run(&c, Key::Graph { exec: 5 }, 400_000, 3 * SEC, SEC / 2);
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
}

#[test]
fn no_limit_and_disable_do_not_throttle() {
    for (pct, pol, switch) in [
        (100, policy::DEFAULT, 1),
        (0, policy::FORCE, 1),
        (30, policy::DISABLE, 1),
        (30, policy::DEFAULT, 0),
    ] {
        let f = Fake::new(pct, pol);
        f.file.region().utilization_switch.store(switch, Relaxed);
        let c = Controller::new(f);
        let s = run(&c, kernel(1), 100_000, SEC, SEC / 4);
        assert!(
            s > 99.0,
            "limit {pct} policy {pol} switch {switch}: {s:.1}%"
        );
        assert_eq!(c.sys.sleeps.load(Relaxed), 0);
    }
    // Force ignores the switch.
    let f = Fake::new(30, policy::FORCE);
    f.file.region().utilization_switch.store(0, Relaxed);
    let c = Controller::new(f);
    let s = run(&c, kernel(1), 100_000, 2 * SEC, SEC / 2);
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
}

#[test]
fn a_runtime_change_is_followed() {
    let c = Controller::new(Fake::new(80, policy::DEFAULT));
    let s = run(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 2);
    assert!((s - 80.0).abs() < 2.0, "{s:.1}%");
    c.sys.file.region().sm_limit[0].store(20, Relaxed);
    let t0 = c.sys.now();
    let s = run(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 5);
    assert!((s - 20.0).abs() < 2.0, "{s:.1}%");
    // Within 200 ms of the change the share was already down.
    assert!(busy_share(&c.sys, t0 + SEC / 5, t0 + SEC) < 22.0);
}

#[test]
fn a_first_guess_is_settled() {
    // Kernels of 5 ms: the first launches are charged the 20 µs default,
    // the debt is charged once the first timing lands.
    let c = Controller::new(Fake::new(50, policy::DEFAULT));
    let s = run(&c, kernel(2), 5_000_000, 2 * SEC, 0);
    assert!((s - 50.0).abs() < 3.0, "{s:.1}%");
}

#[test]
fn activity_is_marked_and_blocking_obeyed() {
    let c = Controller::new(Fake::new(100, policy::DEFAULT));
    let r = c.sys.file.region();
    r.recent_kernel.store(1, Relaxed);
    run(&c, kernel(1), 10_000, SEC / 10, 0);
    assert_eq!(r.recent_kernel.load(Relaxed), 2);
    assert!(r.last_kernel_time.load(Relaxed) >= 1_700_000_000);
    // Blocked: the next launches wait until the monitor unblocks.
    r.recent_kernel.store(-1, Relaxed);
    c.sys.advance(super::tuning::REFRESH_NS);
    c.sys
        .unblock_after
        .store(c.sys.sleeps.load(Relaxed) + 5, Relaxed);
    let before = c.sys.now();
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let t = c.before(&w);
    c.after_opt(t, true);
    assert!(c.sys.now() - before >= 500_000_000);
    assert_eq!(r.recent_kernel.load(Relaxed), 2);
}

#[test]
fn share_is_published_and_failed_launches_refunded() {
    let c = Controller::new(Fake::new(40, policy::DEFAULT));
    run(&c, kernel(1), 100_000, 3 * SEC, 0);
    let u = c.sys.file.region().procs[0].device_util[0]
        .sm_util
        .load(Relaxed);
    assert!((38..=42).contains(&u), "sm_util {u}");
    let charged = c.charged_ns(0);
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let t = c.before(&w);
    c.after_opt(t, false);
    assert_eq!(c.charged_ns(0), charged);
}

/// A container of one process whose host pid is known (`hostpid`), with
/// NVML, at `pct`, whose timings read `skew` % of the truth.
fn closed_loop(pct: u64, skew: u64, hostpid: i32) -> Controller<Fake> {
    Controller::new(nvml_on(Fake::new(pct, policy::DEFAULT), skew, hostpid))
}

/// `f` with one process in its region (GPU memory held, host pid
/// `hostpid`), its timings read as `skew` % of the truth, and NVML on.
fn nvml_on(f: Fake, skew: u64, hostpid: i32) -> Fake {
    let r = f.file.region();
    r.proc_num.store(1, Relaxed);
    r.procs[0].pid.store(77, Relaxed);
    r.procs[0].hostpid.store(hostpid, Relaxed);
    r.procs[0].used[0].total.store(500 << 20, Relaxed);
    f.skew_pct.store(skew, Relaxed);
    f.nvml.store(true, Relaxed);
    f
}

/// `closed_loop` at 30 % on a device shared with another container's
/// process (40 % busy), NVML sampling each process once a second.
fn shared_loop(skew: u64) -> Controller<Fake> {
    let c = closed_loop(30, skew, NVML_PID as i32);
    c.sys.sparse.store(true, Relaxed);
    c.sys.other_pct.store(40, Relaxed);
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID, OTHER_PID]);
    c
}

#[test]
fn feedback_corrects_an_under_estimate() {
    // Costs learnt 10 % short (as the min-filter does for matmuls): open
    // loop gives limit × 1.1.
    let c = closed_loop(60, 91, NVML_PID as i32);
    let s = run(&c, kernel(1), 2_000_000, 6 * SEC, 4 * SEC);
    let g = c.factor(0);
    assert!((s - 60.0).abs() < 2.0, "{s:.1}% (correction {g:.3})");
    assert!((1.05..1.15).contains(&g), "correction {g:.3}");
    let u = c.sys.file.region().procs[0].device_util[0]
        .sm_util
        .load(Relaxed);
    assert!((55..=65).contains(&u), "published sm_util {u}");
}

#[test]
fn feedback_corrects_a_double_over_estimate() {
    let c = closed_loop(30, 200, NVML_PID as i32);
    let s = run(&c, kernel(1), 100_000, 6 * SEC, 4 * SEC);
    let g = c.factor(0);
    assert!((s - 30.0).abs() < 2.0, "{s:.1}% (correction {g:.3})");
    assert!((0.45..0.55).contains(&g), "correction {g:.3}");
}

#[test]
fn feedback_stays_open_without_host_pids_or_nvml() {
    // The slot's host pid is unknown: correction 1, today's open loop.
    let c = closed_loop(60, 91, 0);
    let s = run(&c, kernel(1), 2_000_000, 3 * SEC, SEC);
    assert_eq!(c.factor(0), 1.0);
    assert!(s > 63.0, "{s:.1}%");
    let c = closed_loop(60, 91, NVML_PID as i32);
    c.sys.nvml.store(false, Relaxed);
    run(&c, kernel(1), 2_000_000, 3 * SEC, SEC);
    assert_eq!(c.factor(0), 1.0);
}

#[test]
fn the_loop_closes_promptly_once_host_pids_are_known() {
    // Open loop while the host pid is unknown; once the daemon fills it,
    // the leader (still holding its lease) re-baselines at its next call,
    // discards the window after it (settling) and steps at the one after:
    // within about 1.5 s, not after its own lease has run out (2 s more).
    let c = closed_loop(60, 91, 0);
    run(&c, kernel(1), 2_000_000, SEC, 0);
    assert_eq!(c.factor(0), 1.0);
    c.sys.file.region().procs[0]
        .hostpid
        .store(NVML_PID as i32, Relaxed);
    run(&c, kernel(1), 2_000_000, 1_700_000_000, 0);
    assert!(c.factor(0) > 1.0, "correction {:.3}", c.factor(0));
}

#[test]
fn feedback_follows_the_device_counter_when_alone() {
    // NVML's per-process samples read 80 % of the truth (as on real GPUs)
    // but the container is alone on the device: the device's utilization
    // is what the loop steers by, so the share stays at the limit.
    let c = closed_loop(30, 100, NVML_PID as i32);
    c.sys.proc_pct.store(80, Relaxed);
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID]);
    let s = run(&c, kernel(1), 1_000_000, 6 * SEC, 4 * SEC);
    assert!(
        (s - 30.0).abs() < 2.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
    // Another container's process keeps the device 40 % busy: the device
    // counter is split by the per-process samples' proportions, which are
    // right even though each reads low, so the share stays at the limit.
    let c = closed_loop(30, 100, NVML_PID as i32);
    c.sys.proc_pct.store(80, Relaxed);
    c.sys.other_pct.store(40, Relaxed);
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID, OTHER_PID]);
    let s = run(&c, kernel(1), 1_000_000, 6 * SEC, 4 * SEC);
    assert!(
        (s - 30.0).abs() < 2.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
    // Without the device counter the container's own samples are taken as
    // read: they read low, so the loop lets the share rise above the limit.
    let c = closed_loop(30, 100, NVML_PID as i32);
    c.sys.proc_pct.store(80, Relaxed);
    c.sys.other_pct.store(40, Relaxed);
    let s = run(&c, kernel(1), 1_000_000, 6 * SEC, 4 * SEC);
    assert!(s > 33.0, "{s:.1}% (correction {:.3})", c.factor(0));
}

#[test]
fn a_shared_device_is_split_over_windows_that_hold_every_process() {
    // Another container keeps the device 40 % busy; NVML has one sample
    // per process per second. Half-second windows would see only one of the
    // two processes and give it the whole device; the loop measures over
    // eight-second windows when the device is shared.
    let c = shared_loop(100);
    let s = run(&c, kernel(1), 1_000_000, 40 * SEC, 10 * SEC);
    let g = c.factor(0);
    assert!((s - 30.0).abs() < 2.0, "{s:.1}% (correction {g:.3})");
    assert!((0.9..1.1).contains(&g), "correction {g:.3}");
    // A real error is still corrected on a shared device: costs learnt 25 %
    // short, as a power-capped device's kernels can be.
    let c = shared_loop(75);
    let s = run(&c, kernel(1), 1_000_000, 80 * SEC, 60 * SEC);
    assert!(
        (s - 30.0).abs() < 2.5,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
}

#[test]
fn on_a_shared_device_the_first_step_comes_after_one_wide_window() {
    // The settling window is one period even on a shared device: the
    // first step comes one 8 s window after it, not two.
    let c = shared_loop(75);
    run(&c, kernel(1), 1_000_000, 10 * SEC, 0);
    assert!(c.factor(0) > 1.05, "correction {:.3}", c.factor(0));
}

#[test]
fn a_window_that_began_shared_and_ended_alone_is_discarded() {
    // The other container exits: NVML now lists only ours, but its device
    // utilization over the (8 s) window still holds the other's busy time.
    // Read as "alone", that was the whole device's, and the correction would
    // step far up at the other's exit.
    let c = shared_loop(100);
    run(&c, kernel(1), 1_000_000, 20 * SEC, 0);
    let g0 = c.factor(0);
    c.sys.other_exit.store(c.sys.now(), Relaxed);
    run(&c, kernel(1), 1_000_000, 1_200_000_000, 0);
    let g = c.factor(0);
    assert!((g / g0 - 1.0).abs() < 0.03, "correction {g0:.3} -> {g:.3}");
    let s = run(&c, kernel(1), 1_000_000, 6 * SEC, 2 * SEC);
    assert!(
        (s - 30.0).abs() < 2.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
}

#[test]
fn the_first_window_after_a_baseline_is_discarded() {
    // NVML's samples lag a start: the first half second reads low, about
    // half of what later windows read.
    // The loop waits a window before its first step.
    let c = closed_loop(30, 100, NVML_PID as i32);
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID]);
    c.sys.lag_until.store(c.sys.now() + 600_000_000, Relaxed);
    run(&c, kernel(1), 1_000_000, 1_200_000_000, 0);
    let g = c.factor(0);
    assert!(
        (0.95..1.05).contains(&g),
        "stepped on the first window: correction {g:.3}"
    );
    let s = run(&c, kernel(1), 1_000_000, 4 * SEC, SEC);
    assert!(
        (s - 30.0).abs() < 2.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
}

#[test]
fn a_process_without_gpu_memory_does_not_open_the_loop() {
    // `nvidia-smi` in the container: a slot, no host pid, no memory.
    let c = closed_loop(60, 91, NVML_PID as i32);
    let r = c.sys.file.region();
    r.proc_num.store(2, Relaxed);
    r.procs[1].pid.store(78, Relaxed);
    let s = run(&c, kernel(1), 2_000_000, 6 * SEC, 4 * SEC);
    assert!(
        (s - 60.0).abs() < 2.0,
        "{s:.1}% (correction {:.3})",
        c.factor(0)
    );
    // Once it holds memory, its unknown host pid opens the loop.
    let c = closed_loop(60, 91, NVML_PID as i32);
    let r = c.sys.file.region();
    r.proc_num.store(2, Relaxed);
    r.procs[1].pid.store(78, Relaxed);
    r.procs[1].used[0].total.store(1 << 20, Relaxed);
    run(&c, kernel(1), 2_000_000, 3 * SEC, SEC);
    assert_eq!(c.factor(0), 1.0);
}

#[test]
fn captured_launches_are_neither_charged_nor_timed() {
    // A stream capture at a 10 % limit: nothing runs on the GPU, so no
    // launch may sleep, be charged, or record an event into the graph.
    let f = Fake::new(10, policy::FORCE);
    f.capturing.store(true, Relaxed);
    let c = Controller::new(f);
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    for _ in 0..1000 {
        assert!(c.before(&w).is_none());
        c.sys.advance(1_000);
    }
    assert_eq!(c.sys.sleeps.load(Relaxed), 0);
    assert_eq!(c.sys.records.load(Relaxed), 0);
    assert_eq!(c.charged_ns(0), 0);
    // After the capture, launches are limited again.
    c.sys.capturing.store(false, Relaxed);
    let s = run(&c, kernel(1), 1_000_000, 3 * SEC, SEC);
    assert!((s - 10.0).abs() < 2.0, "{s:.1}%");
    assert!(c.sys.records.load(Relaxed) > 0);
}

#[test]
fn an_under_using_container_learns_its_costs_without_being_held() {
    // Costs read 2× long, but the application itself only uses 10 % of a
    // 60 % limit: never throttled, its share stays its own while the correction
    // learns the error, so a later burst is held at the limit at once.
    let c = closed_loop(60, 200, NVML_PID as i32);
    let f = &c.sys;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let start = f.now();
    while f.now() < start + 4 * SEC {
        launch_once(&c, &w, 1_000_000, 10_000_000);
    }
    assert_eq!(
        f.sleeps.load(Relaxed),
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
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID]);
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
    let c = Controller::new(Fake::new(90, policy::FORCE));
    let f = &c.sys;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let launch = || launch_once(&c, &w, 10_000, 1_000_000);
    for _ in 0..super::cost::EARLY_SAMPLES * 2 {
        launch();
    }
    assert_eq!(c.estimate(&kernel(1)), Some(10_000));
    let (records, charged) = (f.records.load(Relaxed), c.charged_ns(0));
    let n = 20 * super::cost::SAMPLE_EVERY;
    for _ in 0..n {
        launch();
    }
    let samples = (f.records.load(Relaxed) - records) / 2;
    assert!((19..=21).contains(&samples), "{samples} samples");
    assert_eq!(c.charged_ns(0) - charged, n as i64 * 10_000);
}

/// `f` on a node whose table of limited containers on the GPU is shared.
fn on_node(mut f: Fake) -> (Fake, &'static NodeFile) {
    let node: &'static NodeFile = Box::leak(Box::default());
    node.init_or_check().unwrap();
    f.node = Some(node);
    (f, node)
}

/// Another container's member on `node`, limited to `pct`, as of `now`.
fn neighbour(node: &'static NodeFile, now: u64, pct: u32) -> &'static super::node::Member {
    let m = node.join(0x5555_0000_0000_0000, now).unwrap();
    m.touch(now, pct);
    m
}

/// The neighbour `m` launches at `now` and uses most of its share.
fn busy(m: &super::node::Member, now: u64) {
    m.touch(now, 70);
    m.want(now);
}

/// A container at 30 % on a GPU where another limited container (70 %)
/// uses most of its share takes turns: every kernel of ours runs inside our
/// phase of each frame, and the share is still the limit. When the other
/// goes quiet, the bucket alone limits again.
#[test]
fn limited_containers_on_one_gpu_take_turns() {
    let (f, node) = on_node(Fake::new(30, policy::DEFAULT));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    let other = m.owner.load(Relaxed);
    let ours = c.sys.buckets.container_id();
    let p = phase::plan(&[(ours, 30), (other, 70)], ours).unwrap();
    assert_eq!(p.len, phase::FRAME_NS * 30 / 100);

    let start = c.sys.now();
    let s = run_with(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 2, |f| {
        busy(m, f.now())
    });
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
    // The last kernel of a turn may overrun it by half its time.
    let inside = |(a, e): (u64, u64)| phase::into_turn(p, a) + (e - a) <= p.len + 500_000;
    let g = c.sys.gpu.lock().unwrap().intervals.clone();
    // The first kernels run before the plan is read (the first launch
    // reads it) and while the cost is a guess.
    let late: Vec<_> = g
        .iter()
        .copied()
        .filter(|i| i.0 > start + SEC / 2)
        .collect();
    assert!(late.len() > 300, "{}", late.len());
    let out = late.iter().filter(|i| !inside(**i)).count();
    assert_eq!(
        out,
        0,
        "{out} of {} kernels outside the phase {p:?}",
        late.len()
    );

    // The other container stops: within ACTIVE_NS and a re-plan, the bucket
    // alone limits, and our kernels run anywhere in the frame.
    let quiet = c.sys.now();
    let s = run(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 2);
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
    let g = c.sys.gpu.lock().unwrap().intervals.clone();
    let outside = g
        .iter()
        .filter(|i| i.0 > quiet + phase::ACTIVE_NS + SEC / 10 && !inside(**i))
        .count();
    assert!(outside > 100, "{outside}");
}

/// While containers take turns the feedback loop does not step: NVML's
/// per-process split of a device passed between contexts is no measure, and
/// the share is the turn's length whatever the charges. Here the costs are
/// learnt at half their time, which the loop would correct on a shared
/// device within two 8 s windows; the turns' own events read with the same
/// error as the costs (every timing reads half), so they agree with the
/// charges and leave the correction where it is.
#[test]
fn the_correction_holds_while_taking_turns() {
    let (f, node) = on_node(nvml_on(Fake::new(30, policy::DEFAULT), 50, NVML_PID as i32));
    f.sparse.store(true, Relaxed);
    f.other_pct.store(40, Relaxed);
    *f.device.lock().unwrap() = Some(vec![NVML_PID, OTHER_PID]);
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    run_with(&c, kernel(1), 1_000_000, 30 * SEC, SEC / 2, |f| {
        busy(m, f.now())
    });
    assert_eq!(c.factor(0), 1.0);
}

/// Charges 10 % short of what the kernels take (a correction learnt elsewhere, or
/// a cost minimum from faster moments) would fill each turn to 110 % and
/// run into the neighbour's: the turns' own events (one before a turn's
/// first launch, one after its last) measure what they really took, and
/// the correction factor follows them back to 1.
#[test]
fn short_charges_are_corrected_by_measuring_the_turns() {
    let (f, node) = on_node(Fake::new(30, policy::DEFAULT));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    let start = c.sys.now();
    // The factor is set once the turns begin (the feedback loop does not
    // step while they last): before, the loop runs, and with no NVML here
    // it opens (factor 1).
    let mut short = false;
    let s = run_with(&c, kernel(1), 500_000, 3 * SEC, 2 * SEC, |f| {
        busy(m, f.now());
        if !short && c.turn(0).is_some() {
            f.buckets.devs[0]
                .gain
                .store(super::correction::encode(0.9), Relaxed);
            short = true;
        }
    });
    assert!(short, "never took turns");
    let k = c.factor(0);
    assert!((k - 1.0).abs() < 0.03, "correction {k:.3}");
    assert!((s - 30.0).abs() < 1.5, "{s:.1}%");
    let ours = c.sys.buckets.container_id();
    let p = phase::plan(&[(ours, 30), (m.owner.load(Relaxed), 70)], ours).unwrap();
    let g = c.sys.gpu.lock().unwrap().intervals.clone();
    let spill = g
        .iter()
        .filter(|i| i.0 > start + 2 * SEC)
        .filter(|&&(a, e)| phase::into_turn(p, a) + (e - a) > p.len + 250_000)
        .count();
    assert_eq!(spill, 0, "kernels running past the turn");
}

/// A neighbour that launches but uses little of its share (a service
/// between requests) is not waited for: our kernels run anywhere in the
/// frame, under the bucket. And a container of ours that uses little of
/// its own share does not claim turns.
#[test]
fn containers_that_use_little_of_their_share_do_not_take_turns() {
    let (f, node) = on_node(Fake::new(30, policy::DEFAULT));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    let ours = c.sys.buckets.container_id();
    let p = phase::plan(&[(ours, 30), (m.owner.load(Relaxed), 70)], ours).unwrap();
    let start = c.sys.now();
    let s = run_with(&c, kernel(1), 1_000_000, 2 * SEC, SEC / 2, |f| {
        m.touch(f.now(), 70)
    });
    assert!((s - 30.0).abs() < 2.0, "{s:.1}%");
    assert_eq!(c.turn(0), None, "no turns");
    let g = c.sys.gpu.lock().unwrap().intervals.clone();
    let late: Vec<u64> = g
        .iter()
        .map(|i| i.0)
        .filter(|&a| a > start + SEC / 2)
        .collect();
    let outside = late
        .iter()
        .filter(|&&a| phase::into_turn(p, a) >= p.len)
        .count();
    // Spread over the frame, 70 % start outside the 15 ms turn; held to
    // turns, none would.
    assert!(late.len() > 300, "{}", late.len());
    assert!(
        outside * 10 > late.len() * 6,
        "{outside} of {} kernels outside the would-be turn",
        late.len()
    );
    // Ours used its share, so it wants it: were the neighbour busy too,
    // they would take turns.
    let me = node.join(ours, c.sys.now()).unwrap();
    assert!(me.wants.load(Relaxed) + phase::ACTIVE_NS > c.sys.now());

    // Now ours launches a 1 ms kernel every 20 ms (5 % of the device)
    // beside a busy neighbour: once its last window of use has passed
    // (`demand::WINDOW_NS`, then `ACTIVE_NS`), it is out of the plan, and
    // its launches are not held for a turn.
    let t0 = c.sys.now() + phase::ACTIVE_NS + 2 * super::demand::WINDOW_NS;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    while c.sys.now() < t0 + 2 * SEC {
        busy(m, c.sys.now());
        let before = c.sys.now();
        launch_once(&c, &w, 1_000_000, 0);
        if before > t0 {
            assert!(c.sys.now() - before < 1_000_000, "a launch was held");
        }
        c.sys.advance(19_000_000);
    }
    assert_eq!(c.turn(0), None, "no turns");
}

/// A launch-bound container whose kernels' timings read twice their GPU
/// time (a tiny kernel timed across its launch gap) charges 70 % while its
/// kernels keep the device 35 % busy. Once the correction has learnt that, it
/// does not want its 70 % share, and a busy neighbour does not hold it to
/// turns. Its raw charges would say it wants it.
#[test]
fn charges_that_overstate_the_kernels_do_not_claim_turns() {
    let (f, node) = on_node(nvml_on(
        Fake::new(70, policy::DEFAULT),
        200,
        NVML_PID as i32,
    ));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    // 1 ms kernels every 2.86 ms: 35 % of the device. The neighbour
    // launches but does not want its share yet, so the correction learns.
    let start = c.sys.now();
    while c.sys.now() < start + 4 * SEC {
        m.touch(c.sys.now(), 70);
        launch_once(&c, &w, 1_000_000, 2_860_000);
    }
    let g = c.factor(0);
    assert!((0.45..0.56).contains(&g), "correction {g:.3}");
    assert_eq!(c.turn(0), None, "no turns");
    // Now the neighbour is busy too: ours stays off the turns, its
    // launches never held.
    let t0 = c.sys.now();
    let mut held = 0;
    while c.sys.now() < t0 + 2 * SEC {
        busy(m, c.sys.now());
        let before = c.sys.now();
        launch_once(&c, &w, 1_000_000, 0);
        if c.sys.now() - before > 500_000 {
            held += 1;
        }
        c.sys.advance(2_860_000);
        assert_eq!(c.turn(0), None, "took turns");
    }
    assert_eq!(held, 0, "launches held");
    let s = busy_share(&c.sys, t0, c.sys.now());
    assert!((s - 35.0).abs() < 2.0, "{s:.1}%");
}

/// Two containers both using most of their shares take turns; when the
/// neighbour's use drops (it stops wanting), the turns end within
/// `ACTIVE_NS` and a re-plan.
#[test]
fn turns_end_when_the_neighbour_stops_wanting_its_share() {
    let (f, node) = on_node(Fake::new(30, policy::DEFAULT));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    run_with(&c, kernel(1), 1_000_000, SEC, SEC / 2, |f| busy(m, f.now()));
    assert!(c.turn(0).is_some(), "taking turns");
    let quiet = c.sys.now();
    let mut ended = None;
    run_with(&c, kernel(1), 1_000_000, SEC, 0, |f| {
        m.touch(f.now(), 70);
        if ended.is_none() && c.turn(0).is_none() {
            ended = Some(f.now() - quiet);
        }
    });
    let ended = ended.expect("the turns never ended");
    assert!(
        ended <= phase::ACTIVE_NS + 2 * super::tuning::REPLAN_NS,
        "ended after {} ms",
        ended / 1_000_000
    );
}

/// A host whose sleeps overshoot by several ms (a loaded VM; this CI VM's
/// 1 ms sleeps overshot by 0.5–4 ms for seconds at a time): the bucket keeps
/// what the late wake-ups owe, so the share still holds.
#[test]
fn late_wake_ups_do_not_cost_the_share() {
    for late in [2_000_000, 6_000_000, 20_000_000] {
        for pct in [30, 60] {
            let c = Controller::new(Fake::new(pct, policy::DEFAULT));
            c.sys.late_ns.store(late, Relaxed);
            let s = run(&c, kernel(1), 1_000_000, 4 * SEC, SEC);
            assert!(
                (s - pct as f64).abs() < 2.0,
                "late {late} ns, limit {pct}: {s:.1}%"
            );
        }
    }
}

/// The longest time in `[from, to)` during which none of our kernels ran
/// or started: from `from` to the first start, between two kernels, from
/// the last end to `to`.
fn longest_gap(f: &Fake, from: u64, to: u64) -> u64 {
    let g = f.gpu.lock().unwrap();
    let mut iv: Vec<(u64, u64)> = g
        .intervals
        .iter()
        .copied()
        .filter(|&(s, e)| e > from && s < to)
        .collect();
    iv.sort_unstable();
    let mut edge = from;
    let mut gap = 0;
    for (s, e) in iv {
        gap = gap.max(s.saturating_sub(edge));
        edge = edge.max(e);
    }
    gap.max(to.saturating_sub(edge))
}

/// The bound of docs/sm-limit.md on any wait, for `cost` ns kernels at
/// `pct`: one frame of settled debt, the kernel's own wall time at the
/// limit, the batch and the lead, and the fake host's sleep slack.
fn stall_bound(cost: u64, pct: u32) -> u64 {
    super::tuning::FRAME_NS
        + super::bucket::wall_of(cost, pct)
        + super::bucket::BATCH_NS
        + super::bucket::LEAD_NS
        + 1_000_000
}

/// A process saturating the device is killed, and its queued
/// kernels still occupy the device when a new process at 30 % starts the
/// same loop: the new one's first timing waited behind them. It must make
/// progress at once and get its 30 %.
#[test]
fn a_killed_neighbours_queue_does_not_stall_a_new_process() {
    for queue in [50_000_000u64, 500_000_000] {
        let c = Controller::new(Fake::new(30, policy::DEFAULT));
        let t0 = c.sys.now();
        c.sys.foreign_until.store(t0 + queue, Relaxed);
        let s = run(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2 + queue);
        let gap = longest_gap(&c.sys, t0 + queue, t0 + 3 * SEC);
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
    let c = Controller::new(Fake::new(30, policy::DEFAULT));
    run(&c, kernel(1), 1_000_000, SEC, 0);
    let t1 = c.sys.now();
    let long = 300_000_000;
    c.sys.foreign_until.store(t1 + long, Relaxed);
    let s = run(&c, kernel(2), 1_000_000, 3 * SEC, SEC);
    let gap = longest_gap(&c.sys, t1 + long, t1 + 3 * SEC);
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
    let c = Controller::new(Fake::new(30, policy::DEFAULT));
    let t0 = c.sys.now();
    let burst = 40_000_000;
    for i in 0..6 {
        let at = c.sys.now();
        c.sys.foreign_until.store(at + burst, Relaxed);
        run(&c, kernel(10 + i), 500_000, SEC / 2, 0);
    }
    let end = c.sys.now();
    let gap = longest_gap(&c.sys, t0, end);
    assert!(
        gap <= burst + stall_bound(500_000, 30),
        "no kernel of ours for {:.1} ms",
        gap as f64 / 1e6
    );
    let s = busy_share(&c.sys, t0 + SEC / 2, end);
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
    let c = Controller::new(Fake::new(30, policy::DEFAULT));
    let t0 = c.sys.now();
    let s = run_with(&c, kernel(1), 2_000_000, 3 * SEC, SEC / 2, |f| {
        let free = f.gpu.lock().unwrap().free_at.max(f.now());
        f.foreign_until.store(free + 300_000, Relaxed);
    });
    let gap = longest_gap(&c.sys, t0, t0 + 3 * SEC);
    assert!(
        gap <= stall_bound(2_300_000, 30),
        "no kernel of ours for {:.1} ms",
        gap as f64 / 1e6
    );
    let est = c.estimate(&kernel(1)).unwrap_or(0);
    assert!((2_000_000..=2_300_000).contains(&est), "{est}");
    assert!((24.0..=32.0).contains(&s), "{s:.1}%");
}

/// A trainer of priority 1 (`rank`: the node table's priority + 1), no
/// limit, beside a service of priority 0 (another container's member) that
/// sends a request of `req` GPU ns every 20 ms until `until`: the request
/// queues behind whatever the trainer has queued (one FIFO device).
/// Returns, per request, what it found queued ahead of it.
fn trainer_beside_service(
    c: &Controller<Fake>,
    service: &super::node::Member,
    req: u64,
    dur: u64,
    until: u64,
) -> Vec<u64> {
    let mut next_req = c.sys.now();
    let mut ahead = Vec::new();
    let start = c.sys.now();
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    while c.sys.now() < start + dur {
        let f = &c.sys;
        let q = f.gpu.lock().unwrap().free_at;
        if q > f.now() + QUEUE_NS {
            f.now.store(q - QUEUE_NS, Relaxed);
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

fn ranked_trainer() -> (Controller<Fake>, &'static super::node::Member) {
    let (f, node) = on_node(Fake::new(0, policy::DEFAULT));
    f.ranked.store(true, Relaxed);
    f.file.region().priority.store(1, Relaxed);
    let c = Controller::new(f);
    let service = neighbour(node, c.sys.now(), 0);
    service.set_priority(Some(0));
    (c, service)
}

/// Beside an active service of higher priority, the trainer keeps at most
/// `LOW_QUEUE_NS` queued, so each request finds at most that ahead of it
/// (not the driver's whole 50 ms queue),
/// while the trainer keeps the device busy. When the service stops, the
/// trainer is free again within a frame.
#[test]
fn a_low_priority_trainer_keeps_its_queue_short_beside_a_service() {
    let (c, service) = ranked_trainer();
    let t0 = c.sys.now();
    let stop = t0 + 2 * SEC;
    let ahead = trainer_beside_service(&c, service, 500_000, 3 * SEC, stop);
    // The first request comes before the trainer has seen the service.
    let worst = ahead.iter().skip(2).max().copied().unwrap_or(0);
    assert!(ahead.len() > 90, "{} requests", ahead.len());
    assert!(
        worst <= super::tuning::LOW_QUEUE_NS + 100_000,
        "a request found {:.2} ms queued ahead of it",
        worst as f64 / 1e6
    );
    // The trainer still keeps the device busy: all but the service's 2.5 %.
    let s = busy_share(&c.sys, t0 + SEC / 2, stop);
    assert!(s > 92.0, "trainer {s:.1}%");
    // A frame after the service's last request the trainer queues freely
    // again (the driver's 50 ms).
    let q = c.sys.gpu.lock().unwrap().free_at - c.sys.now();
    assert!(q > 40_000_000, "queue {:.1} ms", q as f64 / 1e6);
    let free = busy_share(&c.sys, stop + super::tuning::FRAME_NS, c.sys.now());
    assert!(free > 99.0, "{free:.1}%");
}

/// Equal priorities (or none stated) hold nothing: the service's requests
/// find the trainer's whole queue, as on a time-sliced GPU without vgpu.
#[test]
fn equal_priorities_hold_nothing() {
    let (c, service) = ranked_trainer();
    service.set_priority(Some(1));
    let until = c.sys.now() + SEC;
    let ahead = trainer_beside_service(&c, service, 500_000, SEC, until);
    assert!(ahead.len() > 40, "{} requests", ahead.len());
    let worst = ahead.iter().skip(2).max().copied().unwrap_or(0);
    assert!(worst > 40_000_000, "{:.1} ms", worst as f64 / 1e6);
    assert_eq!(c.sys.sleeps.load(Relaxed), 0);
}

/// A service of higher priority that keeps the GPU busy does not starve the
/// low one: it waits for the other's work in flight at most a frame at a
/// time, then goes with its short queue.
#[test]
fn a_busy_high_priority_container_does_not_starve_the_low_one() {
    let (c, service) = ranked_trainer();
    let t0 = c.sys.now();
    let s = run_with(&c, kernel(1), 200_000, 2 * SEC, SEC / 2, |f| {
        let now = f.now();
        service.touch(now, 0);
        // Always 100 ms of work in flight.
        service.inflight_until.store(now + 100_000_000, Relaxed);
    });
    let gap = longest_gap(&c.sys, t0 + SEC / 2, t0 + 2 * SEC);
    assert!(s > 1.0, "low-priority share {s:.2}%");
    assert!(
        gap <= super::tuning::YIELD_MAX_NS + 2_000_000,
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
    let c = Controller::new(Fake::new(30, policy::DEFAULT));
    c.sys.skew_pct.store(300, Relaxed);
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    let start = c.sys.now();
    let mut took = Vec::new();
    while c.sys.now() < start + 2 * SEC {
        let at = c.sys.now();
        for _ in 0..4 {
            launch_once(&c, &w, 250_000, 1_500);
        }
        // Synchronize: the request ends when its kernels do.
        let end = c.sys.gpu.lock().unwrap().free_at;
        if at > start + 300_000_000 {
            took.push(end - at);
        }
        c.sys.now.store(at + 20_000_000, Relaxed);
    }
    let worst = took.iter().max().copied().unwrap_or(0);
    assert!(
        worst <= 1_100_000,
        "a request took {:.2} ms",
        worst as f64 / 1e6
    );
}

/// With a background thread (`Sys::offload`), no launch runs a feedback
/// step (its NVML calls take milliseconds, every 500 ms: enough to set a
/// light service's p99); the thread's calls to `background` do, and correct the
/// same 10 % under-estimate as the inline loop.
#[test]
fn feedback_steps_run_off_the_launch_path() {
    let c = closed_loop(60, 91, NVML_PID as i32);
    c.sys.offload.store(true, Relaxed);
    run(&c, kernel(1), 2_000_000, 2 * SEC, 0);
    assert_eq!(c.factor(0), 1.0, "a launch ran a feedback step");
    let start = c.sys.now();
    for _ in 0..120 {
        run(&c, kernel(1), 2_000_000, SEC / 20, 0);
        c.background();
    }
    let s = busy_share(&c.sys, start + 4 * SEC, c.sys.now());
    let g = c.factor(0);
    assert!((1.05..1.15).contains(&g), "correction {g:.3}");
    assert!((s - 60.0).abs() < 2.0, "{s:.1}% (correction {g:.3})");
}

/// What the idle bucket holds when the turns end (here 5 s of debt from
/// before them) does not stall the container: its share is back at the
/// limit within the second after.
#[test]
fn the_bucket_resumes_without_old_debt_when_the_turns_end() {
    let (f, node) = on_node(Fake::new(30, policy::DEFAULT));
    let c = Controller::new(f);
    let m = neighbour(node, c.sys.now(), 70);
    run_with(&c, kernel(1), 1_000_000, SEC, SEC / 2, |f| busy(m, f.now()));
    assert!(c.turn(0).is_some(), "taking turns");
    c.sys.buckets().devs[0]
        .tat
        .store(c.sys.now() + 5 * SEC, Relaxed);
    let s = run_with(&c, kernel(1), 1_000_000, 2 * SEC, SEC, |f| {
        m.touch(f.now(), 70);
    });
    assert!(c.turn(0).is_none(), "the turns ended");
    assert!((s - 30.0).abs() < 3.0, "share after the turns: {s:.1}%");
}

/// Inside a PID namespace NVML lists and samples the container's processes
/// under their namespace PIDs and hides everyone else's (driver R580): the
/// host PID the daemon filled in is never in its answers. The loop must not
/// read that as "this container used nothing" and lower its correction (the
/// container would run past its limit): it stays open, and the process's
/// own samples still give its `sm_util`.
#[test]
fn feedback_stays_open_when_nvml_shows_only_the_namespace() {
    // The slot: namespace pid NVML_PID (as NVML names it in here), host pid
    // 5555 (as the daemon filled it in).
    let c = closed_loop(30, 91, 5555);
    c.sys.file.region().procs[0]
        .pid
        .store(NVML_PID as i32, Relaxed);
    c.sys.own_pid.store(NVML_PID, Relaxed);
    *c.sys.device.lock().unwrap() = Some(vec![NVML_PID]);
    let s = run(&c, kernel(1), 2_000_000, 40 * SEC, 10 * SEC);
    assert_eq!(c.factor(0), 1.0);
    // Open loop with costs learnt 9 % short: about 33 %, not more.
    assert!((31.0..35.0).contains(&s), "{s:.1}%");
    let u = c.sys.file.region().procs[0].device_util[0]
        .sm_util
        .load(Relaxed);
    assert!((25..=40).contains(&u), "published sm_util {u}");
}

/// Far under its limit a container coasts: its launches make no driver
/// call (no context or capture query, no event) but the occasional one
/// that is priced, timed or admitted on the bucket. When its use grows past
/// the limit, the bucket holds it at the limit as before.
#[test]
fn a_container_far_under_its_limit_coasts_then_is_held_when_its_use_grows() {
    let c = Controller::new(Fake::new(50, policy::DEFAULT));
    let f = &c.sys;
    let w = Work {
        key: kernel(1),
        stream: 0,
    };
    // 10 µs kernels every 100 µs: 10 % of the device, far under 50 %.
    let light_until = f.now() + SEC;
    while f.now() < light_until {
        launch_once(&c, &w, 10_000, 90_000);
    }
    let calls = || f.queries.load(Relaxed) + f.records.load(Relaxed);
    let (before, t0) = (calls(), f.now());
    let mut n = 0u32;
    while f.now() < t0 + SEC {
        launch_once(&c, &w, 10_000, 90_000);
        n += 1;
    }
    let per_launch = f64::from(calls() - before) / f64::from(n);
    assert!(
        per_launch < 0.1,
        "{per_launch:.3} driver calls per launch far under the limit"
    );
    assert!(
        (c.charged_ns(0) as f64 / (f.now() - 1_000_000_000) as f64 - 0.1).abs() < 0.015,
        "the coasted launches are charged: {} ns",
        c.charged_ns(0)
    );
    // The same kernels back to back: the limit holds.
    let s = run(&c, kernel(1), 10_000, 3 * SEC, SEC / 2);
    assert!((s - 50.0).abs() < 2.0, "{s:.1}% at limit 50 after coasting");
}
