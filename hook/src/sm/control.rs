//! The controller: per launch, mark activity, obey the monitor's blocking,
//! and — on a limited device — charge the launch's learnt standalone GPU
//! time to the container's bucket, sleeping while it is empty; time a few
//! launches with events to learn their cost; publish the process's share.
//!
//! The fast path (no device limited) is a coarse clock read and three
//! relaxed loads. The region is re-read at most every `REFRESH_NS`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64};
use std::sync::Mutex;

use vgpu_common::region::MAX_DEVICES;

use super::bucket::{self, Admit};
use super::cost::{Costs, Key};
use super::feedback::{self, Reading};
use super::local;
use super::phase::{self, Gate, Phase};
use super::policy;
use super::prio::{self, Marks};
use super::sidecar::DevBucket;
use super::sys::{Poll, Sys};
use super::tuning::{
    BLOCK_SLEEP_NS, EVENT_POOL as MAX_POOL, LEASE_NS, MAX_PENDING, MAX_SLEEP_NS, MEASURED_FRESH_NS,
    POLL_NS,
};
pub use super::tuning::{PUBLISH_NS, REFRESH_NS, REPLAN_NS};
use super::{demand, tuning, turns};

/// What `before` hands to `after` for one launch.
#[derive(Debug)]
pub struct Ticket {
    dev: usize,
    key: Key,
    cost_ns: u64,
    /// What the bucket was charged (`cost_ns × gain`).
    billed_ns: u64,
    /// Percent it was charged at (0 = not charged to the bucket).
    pct: u32,
    stream: usize,
    /// (context, start event, end event).
    sample: Option<(usize, usize, usize)>,
    /// Held by a higher-priority container: record a marker after it
    /// (context).
    mark: Option<usize>,
}

impl Ticket {
    /// The device the launch was admitted on.
    pub fn dev(&self) -> usize {
        self.dev
    }
}

/// The launch as the controller sees it.
#[derive(Debug, Clone, Copy)]
pub struct Work {
    pub key: Key,
    /// The stream events are recorded on (the per-thread default stream
    /// already resolved to `CU_STREAM_PER_THREAD`).
    pub stream: usize,
}

#[derive(Debug)]
struct Pending {
    ctx: usize,
    dev: usize,
    key: Key,
    start: usize,
    end: usize,
}

#[derive(Debug, Default)]
struct Learn {
    costs: Costs,
    pool: HashMap<usize, Vec<(usize, usize)>>,
    pending: VecDeque<Pending>,
}

/// The feedback loop's memory of one device (leader only).
#[derive(Debug, Default, Clone, Copy)]
struct Loop {
    /// The lease value this process last wrote (see `DevBucket::lease`).
    lease: u64,
    /// CLOCK_MONOTONIC ns the current measurement window began (0 = none).
    at: u64,
    /// CLOCK_MONOTONIC ns of the previous call (a long gap re-baselines).
    seen: u64,
    /// Its Unix µs (NVML's `lastSeenTimeStamp` for the next one).
    at_us: u64,
    /// The container's `charged_ns` counter then.
    charged: u64,
    /// The limit then.
    pct: u32,
    /// Another container's process was on the device then.
    shared: bool,
    /// The window began at a baseline: it is discarded (NVML's samples lag
    /// a start or a limit change, so the first half second reads well below
    /// the ones after it).
    settling: bool,
}

impl Loop {
    /// Drops the measurement history (the next call re-baselines) but keeps
    /// the lease: this process still leads.
    fn forget(&mut self) {
        *self = Loop {
            lease: self.lease,
            ..Loop::default()
        };
    }
}

/// Low bits of a lease that carry the leader's pid.
const LEASE_PID_MASK: u64 = (1 << 20) - 1;

#[derive(Debug, Default)]
struct Publish {
    at: u64,
    charged: [i64; MAX_DEVICES],
}

/// The limiter of one process.
#[derive(Debug)]
pub struct Controller<S: Sys> {
    pub sys: S,
    /// Tells this controller's entries in the threads' caches (`local`)
    /// from another's.
    id: u64,
    next_refresh: AtomicU64,
    refreshing: AtomicBool,
    /// Bit per device with a limit (accounting on).
    limited: AtomicU32,
    enforce: AtomicBool,
    blocked: AtomicBool,
    limits: [AtomicU32; MAX_DEVICES],
    last_secs: AtomicU64,
    next_poll: AtomicU64,
    /// Timed launches are in flight (`Learn::pending` is not empty).
    has_pending: AtomicBool,
    /// GPU ns this process was charged, per device.
    charged: [AtomicI64; MAX_DEVICES],
    learn: Mutex<Learn>,
    publish: Mutex<Publish>,
    /// Next feedback step due, per device (CLOCK_MONOTONIC ns).
    fb_next: [AtomicU64; MAX_DEVICES],
    fb: Mutex<[Loop; MAX_DEVICES]>,
    host_pid_noted: AtomicBool,
    /// Per device: the container's turn while it shares the GPU with other
    /// limited containers (`phase::encode`; 0 = none, the bucket limits).
    plans: [AtomicU64; MAX_DEVICES],
    /// Next re-plan due, per device (CLOCK_MONOTONIC ns).
    plan_next: [AtomicU64; MAX_DEVICES],
    replanning: AtomicBool,
    /// Per device, while taking turns: (CLOCK_MONOTONIC ns, the container's
    /// `charged_ns`) at the last debug report of the turns.
    turn_report: Mutex<[(u64, u64); MAX_DEVICES]>,
    /// What the container's turns really took, per device.
    turns: turns::Meter,
    /// Whether the container uses most of its share, per device.
    demand: demand::Demand,
    /// The bucket's depth, from how late this host wakes.
    depth: bucket::Depth,
    /// Per device: the container used less than most of its share lately
    /// (`demand`), so its bucket holds a frame.
    light: [AtomicBool; MAX_DEVICES],
    /// Takes part in the node's priorities without a limit
    /// (`CUDA_TASK_PRIORITY` set, `Sys::ranked`).
    ranked: AtomicBool,
    /// The region's `priority` (HAMi's; 0 high).
    priority: std::sync::atomic::AtomicI32,
    /// Per device: this container's member of the node table, + 1.
    member: [AtomicU32; MAX_DEVICES],
    /// Per device: the members of higher priority active now (bit mask).
    higher: [AtomicU32; MAX_DEVICES],
    /// This process's launches admitted while held (`prio`).
    marks: Mutex<Marks>,
    /// Per device: a feedback step is due at this limit (0: none), for the
    /// background thread (`Sys::offload`).
    fb_due: [AtomicU32; MAX_DEVICES],
}

impl<S: Sys> Controller<S> {
    pub fn new(sys: S) -> Self {
        Self {
            sys,
            id: local::new_owner(),
            next_refresh: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            limited: AtomicU32::new(0),
            enforce: AtomicBool::new(false),
            blocked: AtomicBool::new(false),
            limits: std::array::from_fn(|_| AtomicU32::new(0)),
            last_secs: AtomicU64::new(0),
            next_poll: AtomicU64::new(0),
            has_pending: AtomicBool::new(false),
            charged: std::array::from_fn(|_| AtomicI64::new(0)),
            learn: Mutex::new(Learn::default()),
            publish: Mutex::new(Publish::default()),
            fb_next: std::array::from_fn(|_| AtomicU64::new(0)),
            fb: Mutex::new([Loop::default(); MAX_DEVICES]),
            host_pid_noted: AtomicBool::new(false),
            plans: std::array::from_fn(|_| AtomicU64::new(0)),
            plan_next: std::array::from_fn(|_| AtomicU64::new(0)),
            replanning: AtomicBool::new(false),
            turn_report: Mutex::new([(0, 0); MAX_DEVICES]),
            turns: turns::Meter::default(),
            demand: demand::Demand::default(),
            depth: bucket::Depth::default(),
            light: std::array::from_fn(|_| AtomicBool::new(false)),
            ranked: AtomicBool::new(false),
            priority: std::sync::atomic::AtomicI32::new(1),
            member: std::array::from_fn(|_| AtomicU32::new(0)),
            higher: std::array::from_fn(|_| AtomicU32::new(0)),
            marks: Mutex::new(Marks::default()),
            fb_due: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Before a launch: may sleep (blocked by the monitor, or the bucket is
    /// empty). `None` when the launch is not accounted.
    pub fn before(&self, w: &Work) -> Option<Ticket> {
        let now = self.sys.coarse();
        if now >= self.next_refresh.load(Relaxed) {
            self.refresh(now);
        }
        if self.blocked.load(Relaxed) {
            self.wait_unblocked();
        }
        if self.limited.load(Relaxed) == 0 {
            return None;
        }
        self.limited_launch(w)
    }

    fn limited_launch(&self, w: &Work) -> Option<Ticket> {
        let (ctx, dev) = self.sys.current()?;
        if dev >= MAX_DEVICES || self.limited.load(Relaxed) & (1 << dev) == 0 {
            return None;
        }
        // A launch captured into a graph runs when the graph is launched,
        // and is charged then.
        if self.sys.capturing(w.stream) {
            return None;
        }
        let now = self.sys.now();
        if self.has_pending.load(Relaxed) && now >= self.next_poll.load(Relaxed) {
            self.next_poll.store(now.saturating_add(POLL_NS), Relaxed);
            let mut l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
            self.poll(&mut l, 4);
            self.has_pending.store(!l.pending.is_empty(), Relaxed);
        }
        // The common case, a known cost with no sample due, takes no lock.
        let found = local::lookup(self.id, &w.key);
        let (cost_ns, sample) = match found.cost {
            Ok(cost) => (cost, None),
            Err(skipped) => {
                let mut l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
                let c = l.costs.charge(dev, w.key, found.slept, skipped, now);
                local::store(self.id, &w.key, &c);
                let s = if c.sample {
                    self.take_pair(&mut l, ctx)
                } else {
                    None
                };
                (c.cost_ns, s)
            }
        };
        self.charged[dev].fetch_add(cost_ns as i64, Relaxed);
        let (pct, slept, billed_ns, held) = self.admit(dev, cost_ns, now, (ctx, w.stream));
        if slept != found.slept {
            local::set_slept(slept);
        }
        let mut t = Ticket {
            dev,
            key: w.key,
            cost_ns,
            billed_ns,
            pct,
            stream: w.stream,
            sample: None,
            mark: held.then_some(ctx),
        };
        if let Some((start, end)) = sample {
            if self.sys.record(start, w.stream) {
                t.sample = Some((ctx, start, end));
            } else {
                self.give_back(ctx, start, end);
            }
        }
        Some(t)
    }

    /// Charges `cost × gain` to the bucket of `dev` while enforced, sleeping
    /// until it is non-negative (`now`: the clock read for this launch);
    /// while the container takes turns with others on the device, admits
    /// it in its turn instead (`phase`). First, while a container of higher
    /// priority is active on the device, holds the launch as `prio` says.
    /// Returns the percent charged at (0: not charged), whether it slept,
    /// the amount charged, and whether it was held by a higher priority.
    fn admit(
        &self,
        dev: usize,
        cost: u64,
        mut now: u64,
        at: (usize, usize),
    ) -> (u32, bool, u64, bool) {
        let b = &self.sys.buckets().devs[dev];
        let mut slept = false;
        let arrived = now;
        loop {
            let pct = self.limits[dev].load(Relaxed);
            let enforced = pct != 0 && self.enforce.load(Relaxed);
            if !enforced && !self.ranked.load(Relaxed) {
                return (0, slept, 0, false);
            }
            if now >= self.plan_next[dev].load(Relaxed) {
                self.replan(dev, now, if enforced { pct } else { 0 });
            }
            let higher = self.higher[dev].load(Relaxed);
            let held = higher != 0;
            if held {
                if let Some(t) = self.yield_to(dev, higher, now, now - arrived, cost) {
                    slept = true;
                    self.sys.sleep_until(t);
                    now = self.sys.now();
                    if now >= self.next_refresh.load(Relaxed) {
                        self.refresh(now);
                    }
                    continue;
                }
            }
            if !enforced {
                self.note_queued(dev, now, cost);
                return (0, slept, 0, held);
            }
            let billed = scale(cost, b.gain());
            let turn = phase::decode(self.plans[dev].load(Relaxed));
            let admitted = match turn {
                Some(p) => {
                    let (a, empty) = take_turn(b, p, now, scale(billed, self.turns.scale(dev)));
                    match a {
                        Admit::Go => self
                            .turns
                            .admitted(&self.sys, dev, at.0, at.1, billed, empty),
                        Admit::WaitUntil(_) => self.turns.turn_ended(&self.sys, dev),
                    }
                    a
                }
                None => {
                    // A container that used less than most of its share
                    // may use the rest of a frame's share at once: a
                    // service's request is not held for its burst.
                    let depth = if self.light[dev].load(Relaxed) {
                        self.depth.get().max(tuning::FRAME_NS)
                    } else {
                        self.depth.get()
                    };
                    bucket::try_admit(&b.tat, now, billed, pct, depth)
                }
            };
            match admitted {
                Admit::Go => {
                    b.charged_ns.fetch_add(billed, Relaxed);
                    if slept {
                        b.throttled.fetch_add(1, Relaxed);
                    }
                    self.note_queued(dev, now, cost);
                    // Unthrottled launches step the loop too: a container
                    // whose charges are too low never waits for the bucket,
                    // and only a measurement can find that out. Taking
                    // turns, the share is the turn's length whatever the
                    // charges, and NVML's per-process split of a device
                    // passed between contexts every few ms is no measure
                    // (it can credit one container with most of the
                    // device): the gain holds, and the loop re-baselines
                    // afterwards.
                    if turn.is_none() && now >= self.fb_next[dev].load(Relaxed) {
                        if self.sys.offload() {
                            self.fb_due[dev].store(pct, Relaxed);
                        } else {
                            self.feedback(dev, now, pct);
                        }
                    }
                    return (pct, slept, billed, held);
                }
                Admit::WaitUntil(t) => {
                    slept = true;
                    let t = t.min(now.saturating_add(MAX_SLEEP_NS));
                    self.sys.sleep_until(t);
                    now = self.sys.now();
                    self.depth.observe(now.saturating_sub(t));
                    if now >= self.next_refresh.load(Relaxed) {
                        self.refresh(now);
                    }
                }
            }
        }
    }

    /// The background thread's turn (`Sys::offload`): runs the feedback
    /// steps that launches found due, off their path.
    pub fn background(&self) {
        for (dev, due) in self.fb_due.iter().enumerate() {
            let pct = due.swap(0, Relaxed);
            if pct != 0 {
                self.feedback(dev, self.sys.now(), pct);
            }
        }
    }

    /// While containers of higher priority (`higher`, members of the node
    /// table) are active on `dev`: until when this launch of `cost` must
    /// wait (`prio::gate`), having waited `yielded` already; `None` = go.
    fn yield_to(&self, dev: usize, higher: u32, now: u64, yielded: u64, cost: u64) -> Option<u64> {
        let node = self.sys.node(dev)?;
        let high_until = node.inflight_until(higher);
        let queued = {
            let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            m.drain(&self.sys)
        };
        match prio::gate(now, high_until, yielded, queued, cost) {
            prio::Gate::Go => None,
            prio::Gate::WaitUntil(t) => Some(t),
        }
    }

    /// Publishes `cost` of work queued at `now` in the container's member
    /// of the node table, for lower-priority containers to yield to.
    fn note_queued(&self, dev: usize, now: u64, cost: u64) {
        let i = self.member[dev].load(Relaxed);
        if i == 0 {
            return;
        }
        if let Some(m) = self
            .sys
            .node(dev)
            .and_then(|n| n.members.get(i as usize - 1))
        {
            // Its work starts, at the latest, once the lower-priority
            // containers' short queues have drained and the GPU has
            // switched contexts: in flight until then, and for its cost.
            m.queued(now.saturating_add(tuning::HIGH_START_NS), cost);
        }
    }

    /// After the launch returned `ok` (CUDA_SUCCESS or not).
    pub fn after(&self, t: Ticket, ok: bool) {
        if ok {
            if let Some(ctx) = t.mark {
                let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
                m.push(&self.sys, ctx, t.stream, t.cost_ns);
            }
            if let Some((ctx, start, end)) = t.sample {
                if self.sys.record(end, t.stream) {
                    let mut l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
                    l.pending.push_back(Pending {
                        ctx,
                        dev: t.dev,
                        key: t.key,
                        start,
                        end,
                    });
                    self.has_pending.store(true, Relaxed);
                } else {
                    self.give_back(ctx, start, end);
                }
            }
            return;
        }
        // The launch did not happen: take its charge back.
        {
            let mut l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
            l.costs.uncharge(t.key, t.cost_ns);
        }
        if let Some((ctx, start, end)) = t.sample {
            self.give_back(ctx, start, end);
        }
        self.charged[t.dev].fetch_sub(t.cost_ns as i64, Relaxed);
        if t.pct > 0 {
            let b = &self.sys.buckets().devs[t.dev];
            b.charged_ns.fetch_sub(t.billed_ns, Relaxed);
            bucket::adjust(
                &b.tat,
                self.sys.now(),
                -(t.billed_ns as i64),
                t.pct,
                self.depth.get(),
            );
        }
    }

    /// Collects up to `max` finished timings, oldest first.
    fn poll(&self, l: &mut Learn, max: usize) {
        for _ in 0..max {
            let Some(p) = l.pending.front() else { return };
            match self.sys.query(p.end) {
                Poll::NotReady => return,
                Poll::Failed => {
                    if let Some(p) = l.pending.pop_front() {
                        self.sys.destroy_event(p.start);
                        self.sys.destroy_event(p.end);
                    }
                }
                Poll::Ready => {
                    let Some(p) = l.pending.pop_front() else {
                        return;
                    };
                    if let Some(ns) = self.sys.elapsed_ns(p.start, p.end) {
                        let owed = l.costs.sample(p.dev, p.key, ns);
                        if owed != 0 {
                            self.settle(p.dev, owed);
                        }
                    }
                    let pool = l.pool.entry(p.ctx).or_default();
                    if pool.len() < MAX_POOL {
                        pool.push((p.start, p.end));
                    } else {
                        self.sys.destroy_event(p.start);
                        self.sys.destroy_event(p.end);
                    }
                }
            }
        }
    }

    /// Charges GPU time learnt after the fact (launches charged a guess),
    /// at most one frame of wall time at the limit: the estimate behind it
    /// is the minimum of agreeing samples, and what is over a frame is
    /// forgiven rather than made a debt that no launch could pay before
    /// the next frame (a latency-bound tenant's worst wait).
    fn settle(&self, dev: usize, owed: i64) {
        let pct = self.limits[dev].load(Relaxed);
        let cap = (tuning::FRAME_NS as u128 * u128::from(pct.clamp(1, 100)) / 100) as i64;
        let owed = owed.min(cap);
        self.charged[dev].fetch_add(owed, Relaxed);
        if pct > 0 && self.enforce.load(Relaxed) {
            let b = &self.sys.buckets().devs[dev];
            let owed = (owed as f64 * b.gain()) as i64;
            // Two's complement: adding a negative amount subtracts it.
            b.charged_ns.fetch_add(owed as u64, Relaxed);
            bucket::adjust(&b.tat, self.sys.now(), owed, pct, self.depth.get());
            if self.plans[dev].load(Relaxed) != 0 {
                // Taking turns: the queue drains that much later (or
                // sooner), so the turn's remaining room is that much less.
                let _ = b
                    .busy_until
                    .fetch_update(AcqRel, Acquire, |t| Some(t.saturating_add_signed(owed)));
            }
        }
    }

    /// One step of the outer loop on `dev` (docs/sm-limit.md, "Feedback"):
    /// called on the limited launch path at most once per period. Only
    /// the container's leader (a lease in the sidecar) measures and steers.
    fn feedback(&self, dev: usize, now: u64, pct: u32) {
        let Ok(mut all) = self.fb.try_lock() else {
            return;
        };
        if now < self.fb_next[dev].load(Relaxed) {
            return;
        }
        self.fb_next[dev].store(now.saturating_add(feedback::PERIOD_NS), Relaxed);
        let b = &self.sys.buckets().devs[dev];
        let st = &mut all[dev];
        let cur = b.lease.load(Acquire);
        let new = (now.saturating_add(LEASE_NS) & !LEASE_PID_MASK)
            | (u64::from(self.sys.pid()) & LEASE_PID_MASK);
        let mine = cur != 0 && cur == st.lease;
        let expired = (cur & !LEASE_PID_MASK) < now;
        if !(mine || expired) || b.lease.compare_exchange(cur, new, AcqRel, Acquire).is_err() {
            // Someone else leads: forget our history.
            *st = Loop::default();
            return;
        }
        st.lease = new;
        let prev = *st;
        st.seen = now;
        // Open loop (gain 1) unless every process's host pid is known and
        // NVML answers.
        let Some(pids) = self.container_pids() else {
            vlog_once!(
                crate::log::INFO,
                "sm feedback: a host pid is unknown, open loop"
            );
            b.gain.store(0, Relaxed);
            st.forget();
            return;
        };
        let asked = self.sys.now();
        let Some(samples) = self.sys.proc_util(dev, prev.at_us) else {
            vlog_once!(
                crate::log::INFO,
                "sm feedback: no NVML process utilization, open loop"
            );
            b.gain.store(0, Relaxed);
            st.forget();
            return;
        };
        let device = self.sys.device_busy(dev, prev.at_us);
        let nvml_us = self.sys.now().saturating_sub(asked) / 1_000;
        b.measured_at.store(now, Relaxed);
        if namespace_view(device.as_ref(), &pids, self.sys.pid()) {
            // NVML run inside a PID namespace lists and samples only the
            // namespace's own processes, under their namespace PIDs (driver
            // R580): it cannot tell a device this container shares from one
            // it has alone, so it cannot correct the charges. The loop stays
            // open; the container's own samples still give its `sm_util`.
            vlog_once!(
                crate::log::INFO,
                "sm feedback: NVML shows this PID namespace only, open loop"
            );
            self.publish_namespace_util(dev, &samples);
            b.gain.store(0, Relaxed);
            st.forget();
            return;
        }
        if let Some((region, _)) = self.sys.region() {
            for s in region.procs.iter().take(region.proc_count()) {
                let h = s.hostpid.load(Relaxed);
                if s.pid.load(Relaxed) != 0 && h > 0 {
                    let u = attributed(device.as_ref(), &samples, &[h as u32]);
                    s.device_util[dev].sm_util.store(u.round() as u64, Relaxed);
                }
            }
        }
        let charged = b.charged_ns.load(Relaxed);
        let rebase =
            prev.at == 0 || now.saturating_sub(prev.seen) > feedback::MAX_GAP_NS || prev.pct != pct;
        let shared = shared(device.as_ref(), &pids);
        // Another container came or went during the window: it was neither
        // alone nor shared throughout, and neither reading fits it.
        let mixed = !rebase && prev.shared != shared;
        let widen = !rebase && !mixed && !prev.settling && shared;
        if widen && now.saturating_sub(prev.at) < feedback::SHARED_PERIOD_NS {
            // Sharing the device, the split comes from NVML's per-process
            // samples, about one per process per second: one period may
            // hold a sample of one process and none of the other's. Keep
            // widening the window (not the settling one: it is discarded
            // after one period).
            return;
        }
        st.at = now;
        st.at_us = self.sys.unix_us();
        st.charged = charged;
        st.pct = pct;
        st.shared = shared;
        st.settling = rebase;
        if rebase || mixed || prev.settling {
            // First measurement, no limited launch for a while, or the
            // limit changed (the measurement still shows the old one):
            // this one only sets the baseline, and the window after it
            // is discarded too. A mixed window is discarded.
            return;
        }
        let period = now.saturating_sub(prev.at).max(1) as f64;
        let r = Reading {
            measured: measure(device.as_ref(), &samples, &pids),
            charged: charged.wrapping_sub(prev.charged) as i64 as f64 * 100.0 / period,
            shared,
        };
        let g = feedback::step(b.gain(), pct, r);
        vlog!(
            crate::log::DEBUG,
            "sm feedback dev {dev}: limit {pct}, {} {:.1} ({} samples), charged {:.1}, gain {:.3} -> {g:.3} (NVML {nvml_us} us, bucket depth {:.1} ms)",
            if shared { "attributed" } else { "device" },
            r.measured,
            samples.len(),
            r.charged,
            b.gain(),
            self.depth.get() as f64 / 1e6
        );
        b.gain.store(feedback::encode(g), Relaxed);
    }

    /// Host pids of the container's processes that hold GPU memory (a
    /// process without a context, such as `nvidia-smi` run in the
    /// container, runs no kernels); `None` when any of them is unknown.
    fn container_pids(&self) -> Option<Vec<u32>> {
        let (region, _) = self.sys.region()?;
        let mut v = Vec::new();
        for s in region.procs.iter().take(region.proc_count()) {
            if s.pid.load(Relaxed) == 0 || s.used.iter().all(|u| u.total.load(Relaxed) == 0) {
                continue;
            }
            let h = s.hostpid.load(Relaxed);
            if h <= 0 {
                return None;
            }
            v.push(h as u32);
        }
        (!v.is_empty()).then_some(v)
    }

    /// Each slot of this process's PID namespace gets its own samples as its
    /// `sm_util` (NVML names them by namespace PID there).
    fn publish_namespace_util(&self, dev: usize, samples: &[(u32, u32)]) {
        let Some((region, own)) = self.sys.region() else {
            return;
        };
        let Some(ns) = region.procs.get(own).map(|s| s.pidns.load(Relaxed)) else {
            return;
        };
        for s in region.procs.iter().take(region.proc_count()) {
            let pid = s.pid.load(Relaxed);
            if pid > 0 && s.pidns.load(Relaxed) == ns {
                let u = feedback::container_share(samples, &[pid as u32]);
                s.device_util[dev].sm_util.store(u.round() as u64, Relaxed);
            }
        }
    }

    /// The gain published for `dev` (1 in open loop).
    pub fn gain(&self, dev: usize) -> f64 {
        self.sys.buckets().devs.get(dev).map_or(1.0, |b| b.gain())
    }

    fn take_pair(&self, l: &mut Learn, ctx: usize) -> Option<(usize, usize)> {
        if l.pending.len() >= MAX_PENDING {
            return None;
        }
        if let Some(p) = l.pool.get_mut(&ctx).and_then(Vec::pop) {
            return Some(p);
        }
        self.sys.create_pair()
    }

    fn give_back(&self, ctx: usize, start: usize, end: usize) {
        let mut l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
        let pool = l.pool.entry(ctx).or_default();
        if pool.len() < MAX_POOL {
            pool.push((start, end));
        } else {
            self.sys.destroy_event(start);
            self.sys.destroy_event(end);
        }
    }

    /// Re-reads the node's table of limited containers on `dev` (marking
    /// this one active at `pct`, and wanting its share if it does) and
    /// stores the container's turn, if another limited container on the
    /// device wants its share too.
    fn replan(&self, dev: usize, now: u64, pct: u32) {
        if self.replanning.swap(true, Acquire) {
            return;
        }
        self.plan_next[dev].store(now.saturating_add(REPLAN_NS), Relaxed);
        let wants = pct != 0 && self.wants_share(dev, now, pct);
        self.light[dev].store(pct != 0 && self.demand.light(dev), Relaxed);
        let mut higher = 0;
        let mut member = 0;
        let plan = self.sys.node(dev).and_then(|node| {
            let id = self.sys.buckets().container_id();
            let me = node.join(id, now)?;
            member = node
                .members
                .iter()
                .position(|m| std::ptr::eq(m, me))
                .map_or(0, |i| i as u32 + 1);
            me.touch(now, pct);
            me.set_priority(Some(self.priority.load(Relaxed)));
            higher = node.higher(id, me.rank.load(Relaxed), now, tuning::HOLD_NS);
            if wants {
                me.want(now);
            }
            if !self.sys.turns() {
                return None;
            }
            phase::plan(&node.wanting(now, phase::ACTIVE_NS), id)
        });
        self.member[dev].store(member, Relaxed);
        if self.higher[dev].swap(higher, Relaxed) != higher {
            vlog!(
                crate::log::INFO,
                "sm dev {dev}: {}",
                if higher != 0 {
                    "a container of higher priority is active here, this one keeps its queue short"
                } else {
                    "no container of higher priority is active here"
                }
            );
        }
        let w = phase::encode(plan);
        if plan.is_some() && crate::log::enabled(crate::log::DEBUG) {
            self.report_turns(dev, now);
        }
        let was = self.plans[dev].swap(w, Relaxed);
        if was != 0 && w == 0 {
            // The turns limited the container while they lasted; what the
            // idle bucket holds from before them is no debt any more (left,
            // it stalls the container for as long once the turns end).
            let _ = self.sys.buckets().devs[dev].tat.fetch_min(now, Relaxed);
        }
        if was != w {
            match plan {
                Some(p) => vlog!(
                    crate::log::INFO,
                    "sm dev {dev}: taking turns with other limited containers, {:.1}-{:.1} ms of every {} ms",
                    p.start as f64 / 1e6,
                    (p.start + p.len) as f64 / 1e6,
                    phase::FRAME_NS / 1_000_000
                ),
                None => vlog!(
                    crate::log::INFO,
                    "sm dev {dev}: no other limited container here uses most of its share, the bucket alone limits"
                ),
            }
        }
        self.replanning.store(false, Release);
    }

    /// Whether the container used most of its share of `dev` lately: of its
    /// turn while taking turns, else of its limit `pct`. Taking turns, the
    /// turns' measure is per ns charged (gain included). On the bucket, a
    /// gain under 1 is trusted (the charges overstate the kernels: a
    /// launch-bound tiny kernel's timing is twice its GPU time) and one
    /// over 1 is not (NVML over-attributes a shared device, which raises
    /// the gain of a container that is in fact charged right).
    fn wants_share(&self, dev: usize, now: u64, pct: u32) -> bool {
        let b = &self.sys.buckets().devs[dev];
        let (share, per_charged) = match self.turn(dev) {
            Some(p) => (p.len as f64 / phase::FRAME_NS as f64, self.turns.scale(dev)),
            None => (f64::from(pct) / 100.0, 1.0 / b.gain().max(1.0)),
        };
        let charged = b.charged_ns.load(Relaxed);
        self.demand.observe(dev, now, charged, per_charged, share)
    }

    /// Debug, every second or so while taking turns: the share the
    /// container was charged, its gain and turn scale, and `TURN_STATS`.
    fn report_turns(&self, dev: usize, now: u64) {
        let mut r = self.turn_report.lock().unwrap_or_else(|p| p.into_inner());
        let b = &self.sys.buckets().devs[dev];
        let charged = b.charged_ns.load(Relaxed);
        let (at, before) = r[dev];
        if at != 0 && now.saturating_sub(at) < 1_000_000_000 {
            return;
        }
        r[dev] = (now, charged);
        if at != 0 {
            let pct = charged.wrapping_sub(before) as i64 as f64 * 100.0 / (now - at) as f64;
            let t: Vec<u64> = TURN_STATS.iter().map(|x| x.swap(0, Relaxed)).collect();
            let mean = |sum: u64, n: u64| sum as f64 / n.max(1) as f64 / 1e6;
            vlog!(
                crate::log::DEBUG,
                "sm dev {dev} turns: charged {pct:.1} % over {:.2} s, gain {:.3}, turn scale {:.3}; {} bursts on an empty queue, {:.2} ms into the turn; {} stops at {:.2} ms, queue to {:.2} ms",
                (now - at) as f64 / 1e9,
                b.gain(),
                self.turns.scale(dev),
                t[0],
                mean(t[1], t[0]),
                t[2],
                mean(t[3], t[2]),
                mean(t[4], t[2]),
            );
        }
    }

    /// Re-reads the region (one thread at a time), marks activity, and
    /// publishes the share when due.
    fn refresh(&self, now: u64) {
        if self.refreshing.swap(true, Acquire) {
            return;
        }
        self.next_refresh
            .store(now.saturating_add(REFRESH_NS), Relaxed);
        if let Some((region, slot)) = self.sys.region() {
            let s = policy::read(region, self.sys.policy());
            for (d, l) in s.limits.iter().enumerate() {
                self.limits[d].store(*l, Relaxed);
            }
            self.enforce.store(s.enforce, Relaxed);
            let ranked = self.sys.ranked();
            self.ranked.store(ranked, Relaxed);
            self.priority.store(region.priority.load(Relaxed), Relaxed);
            // Ranked without a limit, every device is accounted: its launches
            // are published to (or held by) the node's other containers.
            let all = (1u32 << MAX_DEVICES) - 1;
            self.limited
                .store(s.limited_mask() | if ranked { all } else { 0 }, Relaxed);
            if s.limited_mask() != 0 && !self.host_pid_noted.swap(true, Relaxed) {
                self.sys.note_host_pid();
            }
            self.blocked.store(s.blocked, Relaxed);
            if !s.blocked {
                policy::mark_activity(region, self.sys.unix_secs(), &self.last_secs);
            }
            self.publish(region, slot, now);
        }
        self.refreshing.store(false, Release);
    }

    /// Writes this process's share of each limited device (percent of wall
    /// time, from the GPU time it was charged) into its slot's `sm_util`.
    fn publish(&self, region: &vgpu_common::region::SharedRegion, slot: usize, now: u64) {
        let Ok(mut p) = self.publish.try_lock() else {
            return;
        };
        if p.at == 0 {
            p.at = now;
            return;
        }
        let dt = now.saturating_sub(p.at);
        if dt < PUBLISH_NS {
            return;
        }
        p.at = now;
        let Some(s) = region.procs.get(slot) else {
            return;
        };
        let mask = self.limited.load(Relaxed);
        let devs = &self.sys.buckets().devs;
        for (d, b) in devs.iter().enumerate() {
            let m = b.measured_at.load(Relaxed);
            if m != 0 && now.saturating_sub(m) < MEASURED_FRESH_NS {
                // The feedback leader publishes NVML's measurement.
                p.charged[d] = self.charged[d].load(Relaxed);
                continue;
            }
            let c = self.charged[d].load(Relaxed);
            let delta = c.saturating_sub(p.charged[d]).max(0) as u64;
            p.charged[d] = c;
            if mask & (1 << d) != 0 || delta > 0 {
                let pct = (delta.saturating_mul(100) / dt.max(1)).min(100);
                s.device_util[d].sm_util.store(pct, Relaxed);
            }
        }
    }

    fn wait_unblocked(&self) {
        while let Some((region, _)) = self.sys.region() {
            if region.recent_kernel.load(Relaxed) >= 0 {
                policy::unblocked(region);
                break;
            }
            let now = self.sys.now();
            self.sys.sleep_until(now.saturating_add(BLOCK_SLEEP_NS));
        }
        self.blocked.store(false, Relaxed);
    }

    /// GPU ns charged to this process on `dev` (tests, diagnostics).
    pub fn charged_ns(&self, dev: usize) -> i64 {
        self.charged.get(dev).map_or(0, |c| c.load(Relaxed))
    }

    /// The learnt cost of `key`, if any.
    pub fn estimate(&self, key: &Key) -> Option<u64> {
        let l = self.learn.lock().unwrap_or_else(|p| p.into_inner());
        l.costs.estimate(key)
    }

    /// The factor the container's measured turns put on its charges.
    pub fn turn_scale(&self, dev: usize) -> f64 {
        self.turns.scale(dev)
    }

    /// The container's turn on `dev`, while it takes turns.
    pub fn turn(&self, dev: usize) -> Option<Phase> {
        phase::decode(self.plans.get(dev)?.load(Relaxed))
    }
}

/// Whether the container is alone on the device: every compute process
/// NVML lists (`device`: utilization, host pids) is one of its `pids`.
fn alone(device: Option<&(f64, Vec<u32>)>, pids: &[u32]) -> bool {
    device
        .is_some_and(|(_, running)| !running.is_empty() && running.iter().all(|p| pids.contains(p)))
}

/// Whether another container's process is on the device (NVML lists a
/// compute process that is not one of `pids`).
fn shared(device: Option<&(f64, Vec<u32>)>, pids: &[u32]) -> bool {
    device.is_some_and(|(_, running)| running.iter().any(|p| !pids.contains(p)))
}

/// The container's share of the device over the last window, from the
/// device's reading `device` and NVML's per-process `samples`. Alone on the
/// device, that is the device's own utilization, the figure `nvidia-smi`
/// shows and the limit is a share of; NVML's per-process SM samples read
/// several points below it (docs/sm-limit.md). Sharing the device,
/// its utilization is split by the per-process samples' proportions;
/// without a device reading, the container's samples are taken as read.
fn measure(device: Option<&(f64, Vec<u32>)>, samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    match device {
        Some((util, _)) if alone(device, pids) => *util,
        _ => attributed(device, samples, pids),
    }
}

/// `pids`' part of the device's utilization (see [`measure`]); what the
/// leader publishes as each process's `sm_util`.
/// Whether NVML's process list is the caller's PID namespace's view: it
/// shows this process under its own (namespace) PID `me`, and none of the
/// container's host PIDs `pids`, which differ from it.
fn namespace_view(device: Option<&(f64, Vec<u32>)>, pids: &[u32], me: u32) -> bool {
    device.is_some_and(|(_, listed)| {
        !pids.contains(&me) && listed.contains(&me) && !pids.iter().any(|p| listed.contains(p))
    })
}

fn attributed(device: Option<&(f64, Vec<u32>)>, samples: &[(u32, u32)], pids: &[u32]) -> f64 {
    device
        .and_then(|(util, _)| feedback::attributed_share(samples, pids, *util))
        .unwrap_or_else(|| feedback::container_share(samples, pids))
}

/// Admits `cost` into the container's turn `p` on a device it shares: after
/// the container's queued work, if it fits before the turn ends.
/// Also says whether the container's queue had drained (by its charges).
fn take_turn(b: &DevBucket, p: Phase, now: u64, cost: u64) -> (Admit, bool) {
    let mut busy = b.busy_until.load(Acquire);
    loop {
        match phase::gate(p, now, busy, cost) {
            Gate::Go { busy_until } => {
                match b
                    .busy_until
                    .compare_exchange_weak(busy, busy_until, AcqRel, Acquire)
                {
                    Ok(_) => {
                        if busy < now && crate::log::enabled(crate::log::DEBUG) {
                            TURN_STATS[0].fetch_add(1, Relaxed);
                            TURN_STATS[1].fetch_add(phase::into_turn(p, now), Relaxed);
                        }
                        return (Admit::Go, busy < now);
                    }
                    Err(cur) => busy = cur,
                }
            }
            Gate::WaitUntil(t) => {
                if crate::log::enabled(crate::log::DEBUG) {
                    TURN_STATS[2].fetch_add(1, Relaxed);
                    TURN_STATS[3].fetch_add(phase::into_turn(p, now), Relaxed);
                    TURN_STATS[4].fetch_add(phase::into_turn(p, busy.max(now)), Relaxed);
                }
                return (Admit::WaitUntil(t), false);
            }
        }
    }
}

/// Debug counters of the turns (`LIBCUDA_LOG_LEVEL=4` only): launches that
/// found the container's queue empty and how far into the turn they came
/// (ns, summed), waits for the next turn and how far into the turn the host
/// and its queue were then. They tell a turn the GPU left idle because the
/// host issued work more slowly than the GPU ran it from one the limiter
/// cut short.
static TURN_STATS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// `cost × gain`, exact when the gain is 1.
fn scale(cost: u64, gain: f64) -> u64 {
    if gain == 1.0 {
        cost
    } else {
        (cost as f64 * gain) as u64
    }
}
