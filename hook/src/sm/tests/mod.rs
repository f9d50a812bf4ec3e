//! The controller against the fake world (`world::fake`: its test clock,
//! region and buckets) and a GPU that runs in time on that clock (`Gpu`,
//! the driver's side): a single queue that runs kernels back to back,
//! events completing when the queue reaches them, and a host that launches
//! in a loop (blocking, like a driver, once the queue is 50 ms ahead). The tests are in one file per concept:
//! the share a limit gives (`share_held`), costs learnt on the way
//! (`cost_learning_loop`), the NVML loop (`feedback_loop`), turns
//! (`taking_turns`), no stall (`no_stall`) and priorities (`priorities`).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

use vgpu_common::region::policy;

use crate::driver::{Context, Events, Nvml, Poll};
use crate::sm::controller::{Controller, Work};
use crate::sm::cost_learning::cost::Key;
use crate::sm::node_sharing::phase;
use crate::world::fake::{FakeWorld, TestClock, UNIX_BASE_US};
use crate::world::{Clock, NodeFiles};

const QUEUE_NS: u64 = 50_000_000;
const SLACK_NS: u64 = 60_000;

#[derive(Default)]
struct Queue {
    free_at: u64,
    intervals: Vec<(u64, u64)>,
    events: HashMap<usize, u64>,
    next: usize,
}

/// The GPU, as the driver and NVML show it, running in time on the world's
/// clock.
struct Gpu {
    clock: Arc<TestClock>,
    gpu: Mutex<Queue>,
    /// Timings read back as this percent of the real ones (a wrongly learnt
    /// cost); 100 = exact.
    skew_pct: AtomicU64,
    /// Fake NVML: per-process utilization over the last 200 ms, reported
    /// as host pid `NVML_PID`.
    nvml: AtomicBool,
    /// Per-process samples read as this percent of the truth (100 = exact).
    proc_pct: AtomicU64,
    /// Another container's process (`OTHER_PID`) keeps the device busy
    /// this percent of the time, as NVML sees it (0: no such process).
    other_pct: AtomicU64,
    /// Fake NVML also reports the device's utilization, with these host
    /// pids running on it.
    device: Mutex<Option<Vec<u32>>>,
    /// Stream 0 is being captured into a graph.
    capturing: AtomicBool,
    /// Events recorded so far.
    records: AtomicU32,
    /// NVML's per-process samples as on a real GPU: one per process per
    /// second, each covering that second (ours on the second, the other
    /// process's half a second later), instead of one each per query.
    sparse: AtomicBool,
    /// Fake ns at which the other container's process exited (0: it has
    /// not); NVML then lists only ours, and its device utilization since a
    /// time before that still holds the other's busy time.
    other_exit: AtomicU64,
    /// Until this fake ns the device counter reads half the truth (NVML's
    /// samples lagging a start).
    lag_until: AtomicU64,
    /// Another context's work occupies the device until this fake ns: our
    /// kernels start after it, our events (recorded on our own stream)
    /// do not wait for it.
    foreign_until: AtomicU64,
    /// Context and capture queries made (driver calls of the launch path).
    queries: AtomicU32,
}

/// The controller under test.
type Sim = Controller<Gpu, FakeWorld>;

/// A process before its controller is made: its GPU and its world.
struct Setup {
    gpu: Gpu,
    world: FakeWorld,
}

const NVML_PID: u32 = 4242;
const OTHER_PID: u32 = 9999;

impl Setup {
    /// A process limited to `pct` under `policy_`, alone on its GPU; its
    /// sleeps end 60 µs late, as a real timer's do.
    fn new(pct: u64, policy_: i32) -> Self {
        let world = FakeWorld::at(1_000_000_000);
        world.clock.set_late(SLACK_NS);
        world.policy.store(policy_, Relaxed);
        let r = world.shm();
        r.sm_limit[0].store(pct, Relaxed);
        r.utilization_switch.store(1, Relaxed);
        r.recent_kernel.store(2, Relaxed);
        let gpu = Gpu {
            clock: Arc::clone(&world.clock),
            gpu: Mutex::new(Queue::default()),
            skew_pct: AtomicU64::new(100),
            nvml: AtomicBool::new(false),
            proc_pct: AtomicU64::new(100),
            other_pct: AtomicU64::new(0),
            device: Mutex::new(None),
            capturing: AtomicBool::new(false),
            records: AtomicU32::new(0),
            sparse: AtomicBool::new(false),
            other_exit: AtomicU64::new(0),
            lag_until: AtomicU64::new(0),
            foreign_until: AtomicU64::new(0),
            queries: AtomicU32::new(0),
        };
        Setup { gpu, world }
    }
}

/// The controller of `f`.
fn sim(f: Setup) -> Sim {
    Controller::new(f.gpu, f.world)
}

impl Gpu {
    fn now(&self) -> u64 {
        self.clock.now()
    }
}

impl Context for Gpu {
    fn current_device(&self) -> Option<usize> {
        self.current().map(|(_, dev)| dev)
    }

    fn current(&self) -> Option<(usize, usize)> {
        self.queries.fetch_add(1, Relaxed);
        Some((7, 0))
    }

    fn only_device(&self) -> Option<usize> {
        Some(0)
    }
}

impl Events for Gpu {
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

impl Nvml for Gpu {
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
}

/// Runs launches of `cost` (key `key`) for `dur` of fake time; returns the
/// GPU's busy share (percent) over the last `dur - warmup`.
fn run(c: &Sim, key: Key, cost: u64, dur: u64, warmup: u64) -> f64 {
    run_with(c, key, cost, dur, warmup, |_| {})
}

/// `run`, calling `each` before every launch.
fn run_with(
    c: &Sim,
    key: Key,
    cost: u64,
    dur: u64,
    warmup: u64,
    mut each: impl FnMut(&Gpu),
) -> f64 {
    let f = &c.driver;
    let start = f.now();
    let w = Work { key, stream: 0 };
    while f.now() < start + dur {
        // The driver blocks while the queue is too far ahead.
        let ahead = f.gpu.lock().unwrap().free_at;
        if ahead > f.now() + QUEUE_NS {
            f.clock.set(ahead - QUEUE_NS);
        }
        each(f);
        launch_once(c, &w, cost, 1_500);
    }
    busy_share(f, start + warmup, start + dur)
}

/// One launch of `cost` GPU ns through the controller, then `gap` of host
/// time before the next.
fn launch_once(c: &Sim, w: &Work, cost: u64, gap: u64) {
    let f = &c.driver;
    let t = c.before(w);
    {
        let mut g = f.gpu.lock().unwrap();
        let s = g.free_at.max(f.now()).max(f.foreign_until.load(Relaxed));
        g.free_at = s + cost;
        g.intervals.push((s, s + cost));
    }
    c.after_opt(t, true);
    f.clock.advance(gap);
}

fn busy_share(f: &Gpu, from: u64, to: u64) -> f64 {
    let g = f.gpu.lock().unwrap();
    let busy: u64 = g
        .intervals
        .iter()
        .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
        .sum();
    busy as f64 * 100.0 / (to - from) as f64
}

impl Sim {
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

/// A container of one process whose host pid is known (`hostpid`), with
/// NVML, at `pct`, whose timings read `skew` % of the truth.
fn closed_loop(pct: u64, skew: u64, hostpid: i32) -> Sim {
    sim(nvml_on(Setup::new(pct, policy::DEFAULT), skew, hostpid))
}

/// `f` with one process in its region (GPU memory held, host pid
/// `hostpid`), its timings read as `skew` % of the truth, and NVML on.
fn nvml_on(f: Setup, skew: u64, hostpid: i32) -> Setup {
    let r = f.world.shm();
    r.proc_num.store(1, Relaxed);
    r.procs[0].pid.store(77, Relaxed);
    r.procs[0].hostpid.store(hostpid, Relaxed);
    r.procs[0].used[0].total.store(500 << 20, Relaxed);
    f.gpu.skew_pct.store(skew, Relaxed);
    f.gpu.nvml.store(true, Relaxed);
    f
}

/// Another container on the GPU, as the daemon knows it: its spec's limit
/// and priority, and what its hook states in its plan line.
#[derive(Debug, Default)]
struct Neighbour {
    limit: AtomicU32,
    /// `node::rank_of` its priority; 0 = no spec.
    rank: AtomicU32,
    launched: AtomicU64,
    wants: AtomicU64,
    inflight_until: AtomicU64,
}

/// The neighbour's key among the seats (ours is our container id).
const NEIGHBOUR_KEY: u64 = 0x5555_0000_0000_0000;

impl Neighbour {
    fn touch(&self, now: u64, pct: u32) {
        self.limit.store(pct, Relaxed);
        self.launched.fetch_max(now, Relaxed);
    }

    fn want(&self, now: u64) {
        self.wants.fetch_max(now, Relaxed);
    }

    fn set_priority(&self, p: Option<i32>) {
        self.rank
            .store(p.map_or(0, vgpu_common::node::rank_of), Relaxed);
    }

    fn queued(&self, now: u64, cost: u64) {
        let _ = self
            .inflight_until
            .fetch_update(Relaxed, Relaxed, |t| Some(t.max(now) + cost));
    }

    /// The stand-in for `vgpu daemon`: decides with the daemon's own rule
    /// (`node::decide`, every statement confirmed by the kernel) and writes
    /// our plan of device 0.
    fn plan_for(&self, f: &FakeWorld, now: u64) {
        let r = f.shm();
        let mine = &f.buckets.plans[0];
        let ours = vgpu_common::node::Seat {
            key: f.buckets.container_id(),
            limit: vgpu_common::region::rules::sm_limit(r.sm_limit[0].load(Relaxed)),
            rank: Some(vgpu_common::node::rank_of(r.priority.load(Relaxed))),
            own: vgpu_common::sidecar::OwnWords {
                launched: mine.launched.load(Relaxed),
                wants: mine.wants.load(Relaxed),
                inflight_until: mine.inflight_until.load(Relaxed),
            },
            confirmed: true,
        };
        let rank = self.rank.load(Relaxed);
        let other = vgpu_common::node::Seat {
            key: NEIGHBOUR_KEY,
            limit: vgpu_common::region::rules::sm_limit(u64::from(self.limit.load(Relaxed))),
            rank: (rank != 0).then_some(rank),
            own: vgpu_common::sidecar::OwnWords {
                launched: self.launched.load(Relaxed),
                wants: self.wants.load(Relaxed),
                inflight_until: self.inflight_until.load(Relaxed),
            },
            confirmed: true,
        };
        let w = vgpu_common::node::decide(&[ours, other], now)[0];
        mine.seq.fetch_add(1, Relaxed);
        mine.planned_until.store(w.planned_until, Relaxed);
        mine.turn.store(w.turn, Relaxed);
        mine.hold_until.store(w.hold_until, Relaxed);
        mine.high_inflight_until
            .store(w.high_inflight_until, Relaxed);
        mine.outranked_until.store(w.outranked_until, Relaxed);
        mine.seq.fetch_add(1, Relaxed);
    }
}

/// `f` on a GPU it shares with another container, the daemon planning
/// (the stand-in plans at every coarse clock read, which every launch
/// makes first, and after every sleep).
fn on_node(f: Setup) -> (Setup, &'static Neighbour) {
    let node: &'static Neighbour = Box::leak(Box::default());
    f.world.on_tick(move |w, now| node.plan_for(w, now));
    (f, node)
}

/// The other container on `node`, limited to `pct`, as of `now`.
fn neighbour(node: &'static Neighbour, now: u64, pct: u32) -> &'static Neighbour {
    node.touch(now, pct);
    node
}

/// The neighbour `m` launches at `now` and uses most of its share.
fn busy(m: &Neighbour, now: u64) {
    m.touch(now, 70);
    m.want(now);
}

/// The longest time in `[from, to)` during which none of our kernels ran
/// or started: from `from` to the first start, between two kernels, from
/// the last end to `to`.
fn longest_gap(f: &Gpu, from: u64, to: u64) -> u64 {
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

mod cost_learning_loop;
mod feedback_loop;
mod no_stall;
mod priorities;
mod share_held;
mod taking_turns;
