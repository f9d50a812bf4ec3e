//! How the container shares a GPU with the node's other containers, by the
//! plan `vgpu daemon` writes into the container's own sidecar
//! (`vgpu_common::sidecar::DevPlan`): taking turns with other limited
//! containers that use most of their share (`demand`, `phase`), and
//! priorities (`priority`: a lower-priority container keeps its queue
//! short while the daemon says a higher one is active). The hook states
//! only its own activity (the plan's second line); it reads nothing any
//! other container writes. Without a live plan (no daemon) the container
//! keeps to its own SM limit alone, as HAMi-core does. Re-read every
//! `REPLAN_NS` on an accounted launch.

#![forbid(unsafe_code)]

pub(super) mod demand;
pub(super) mod phase;
pub(super) mod priority;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8};
use std::sync::Mutex;

use vgpu_common::region::rules::SmLimit;
use vgpu_common::region::MAX_DEVICES;
use vgpu_common::sidecar::DevPlan;

use crate::driver::Events;
use crate::sm::correction;
use crate::sm::tuning::{HIGH_START_NS, REPLAN_NS, TURN_REPORT_NS};
use crate::world::NodeFiles;
use demand::Demand;
use phase::Phase;
use priority::Marks;

/// Whether a daemon's plan was seen on a device: not yet looked, none, live.
const PLAN_UNKNOWN: u8 = 0;
const PLAN_NONE: u8 = 1;
const PLAN_LIVE: u8 = 2;

/// This process's view of its plan, per device.
#[derive(Debug)]
pub(crate) struct Sharing {
    /// The container's turn while it shares the GPU with other limited
    /// containers (`phase::encode`; 0 = none, the bucket limits).
    plans: [AtomicU64; MAX_DEVICES],
    /// Next re-plan due (CLOCK_MONOTONIC ns).
    plan_next: [AtomicU64; MAX_DEVICES],
    replanning: AtomicBool,
    /// Whether the container uses most of its share.
    demand: Demand,
    /// The container used less than most of its share lately, so its
    /// bucket holds a frame.
    light: [AtomicBool; MAX_DEVICES],
    /// 1 while the plan holds the container for a higher-priority one.
    higher: [AtomicU32; MAX_DEVICES],
    /// The plan says a block from HAMi's monitor is about a higher
    /// container, and the hold rule answers it.
    outranked: [AtomicBool; MAX_DEVICES],
    /// `PLAN_*`: whether a daemon plans the device (logged on change).
    planned: [AtomicU8; MAX_DEVICES],
    /// This process's launches admitted while held (`priority`).
    marks: Mutex<Marks>,
    /// (CLOCK_MONOTONIC ns, the container's `charged_ns`) at the last debug
    /// report of the turns.
    report: Mutex<[(u64, u64); MAX_DEVICES]>,
}

impl Default for Sharing {
    fn default() -> Self {
        Self {
            plans: std::array::from_fn(|_| AtomicU64::new(0)),
            plan_next: std::array::from_fn(|_| AtomicU64::new(0)),
            replanning: AtomicBool::new(false),
            demand: Demand::default(),
            light: std::array::from_fn(|_| AtomicBool::new(false)),
            higher: std::array::from_fn(|_| AtomicU32::new(0)),
            outranked: std::array::from_fn(|_| AtomicBool::new(false)),
            planned: std::array::from_fn(|_| AtomicU8::new(PLAN_UNKNOWN)),
            marks: Mutex::new(Marks::default()),
            report: Mutex::new([(0, 0); MAX_DEVICES]),
        }
    }
}

impl Sharing {
    /// The container's turn on `dev`, while it takes turns.
    pub(crate) fn turn(&self, dev: usize) -> Option<Phase> {
        phase::decode(self.plans.get(dev)?.load(Relaxed))
    }

    /// Whether the container used less than most of its share of `dev`.
    pub(crate) fn light(&self, dev: usize) -> bool {
        self.light[dev].load(Relaxed)
    }

    /// Non-zero while the plan holds the container on `dev` for a container
    /// of higher priority.
    pub(crate) fn higher(&self, dev: usize) -> u32 {
        self.higher[dev].load(Relaxed)
    }

    /// Whether the plan says a block by HAMi's monitor (which lags activity
    /// by up to two of its 5 s ticks) may be about a higher container on
    /// some device, so that the hold rule (fresher by three orders of
    /// magnitude) serves it instead of sleeping.
    pub(crate) fn outranked(&self) -> bool {
        self.outranked.iter().any(|o| o.load(Relaxed))
    }

    /// Re-plans `dev` when due at `now`: the container is active there at
    /// `pct` (`None`: accounted, not limited).
    pub(crate) fn replan_if_due(
        &self,
        files: &impl NodeFiles,
        dev: usize,
        now: u64,
        pct: Option<SmLimit>,
    ) {
        if now >= self.plan_next[dev].load(Relaxed) {
            self.replan(files, dev, now, pct);
        }
    }

    /// States the container's activity on `dev` in its own plan line
    /// (launching, and wanting its share if it does), and takes the
    /// daemon's plan: its turn, and whether a higher container holds it.
    fn replan(&self, files: &impl NodeFiles, dev: usize, now: u64, pct: Option<SmLimit>) {
        if self.replanning.swap(true, Acquire) {
            return;
        }
        self.plan_next[dev].store(now.saturating_add(REPLAN_NS), Relaxed);
        let buckets = files.buckets();
        let b = &buckets.devs[dev];
        let mine = &buckets.plans[dev];
        let wants = pct.is_some_and(|p| self.wants_share(b, dev, now, p));
        self.light[dev].store(pct.is_some() && self.demand.light(dev), Relaxed);
        DevPlan::advance(&mine.launched, now);
        if wants {
            DevPlan::advance(&mine.wants, now);
        }
        let words = mine.read();
        // A plan read torn three times keeps the last one.
        let Some(w) = words else {
            self.replanning.store(false, Release);
            return;
        };
        let live = w.planned_until > now;
        self.note_planned(dev, live);
        let plan = if live && pct.is_some() {
            phase::decode(w.turn)
        } else {
            None
        };
        let higher = u32::from(live && w.hold_until > now);
        self.outranked[dev].store(live && w.outranked_until > now, Relaxed);
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
            self.report_turns(b, dev, now);
        }
        let was = self.plans[dev].swap(w, Relaxed);
        if was != 0 && w == 0 {
            // The turns limited the container while they lasted; what the
            // idle bucket holds from before them is no debt any more (left,
            // it stalls the container for as long once the turns end).
            let _ = b.tat.fetch_min(now, Relaxed);
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

    /// Logs when the daemon's plan of `dev` appears or goes.
    fn note_planned(&self, dev: usize, live: bool) {
        let now = if live { PLAN_LIVE } else { PLAN_NONE };
        if self.planned[dev].swap(now, Relaxed) == now {
            return;
        }
        if live {
            vlog!(
                crate::log::INFO,
                "sm dev {dev}: vgpu daemon plans this GPU: turns with other limited containers and priority holds as it says"
            );
        } else {
            vlog!(
                crate::log::INFO,
                "sm dev {dev}: no vgpu daemon plans this GPU: containers do not coordinate, this one keeps to its own SM limit"
            );
        }
    }

    /// Over every device's plan, read from the sidecar at `now` (for a
    /// process that accounts no launch yet): whether a daemon plans any of
    /// them, and whether a live plan holds the container on any.
    pub(crate) fn plan_state(files: &impl NodeFiles, now: u64) -> (bool, bool) {
        let live = files
            .buckets()
            .plans
            .iter()
            .filter_map(|p| p.read().filter(|w| w.planned_until > now));
        live.fold((false, false), |(_, held), w| {
            (true, held || w.hold_until > now || w.outranked_until > now)
        })
    }

    /// Whether the container used most of its share of `dev` lately: of its
    /// turn while taking turns, else of its limit `pct`, its charges read
    /// as the correction says they may be (`correction::demand_rate`).
    fn wants_share(
        &self,
        b: &vgpu_common::sidecar::DevBucket,
        dev: usize,
        now: u64,
        pct: SmLimit,
    ) -> bool {
        let turn = self.turn(dev);
        let share = match turn {
            Some(p) => p.len as f64 / phase::FRAME_NS as f64,
            None => f64::from(pct.percent()) / 100.0,
        };
        let rate = correction::demand_rate(b, turn.is_some());
        self.demand
            .observe(dev, now, b.charged_ns.load(Relaxed), rate, share)
    }

    /// While the plan holds the container on `dev`: until when this
    /// launch of `cost` must wait (`priority::gate`), having waited
    /// `yielded` already; `None` = go.
    pub(crate) fn yield_to(
        &self,
        gpu: &impl Events,
        files: &impl NodeFiles,
        dev: usize,
        now: u64,
        yielded: u64,
        cost: u64,
    ) -> Option<u64> {
        let w = files.buckets().plans.get(dev)?.read()?;
        let high_until = if w.planned_until > now {
            w.high_inflight_until
        } else {
            0
        };
        let queued = {
            let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            m.drain(gpu)
        };
        match priority::gate(now, high_until, yielded, queued, cost) {
            priority::Gate::Go => None,
            priority::Gate::WaitUntil(t) => Some(t),
        }
    }

    /// Records a marker after a launch of `cost` admitted while held.
    pub(crate) fn mark(&self, gpu: &impl Events, ctx: usize, stream: usize, cost: u64) {
        let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        m.push(gpu, ctx, stream, cost);
    }

    /// States `cost` of work queued at `now` in the container's own plan
    /// line: the daemon passes it on to lower-priority containers.
    pub(crate) fn note_queued(&self, files: &impl NodeFiles, dev: usize, now: u64, cost: u64) {
        if let Some(p) = files.buckets().plans.get(dev) {
            // Its work starts, at the latest, once the lower-priority
            // containers' short queues have drained and the GPU has
            // switched contexts: in flight until then, and for its cost.
            p.queued(now.saturating_add(HIGH_START_NS), cost);
        }
    }

    /// Debug, every second or so while taking turns: the share the
    /// container was charged, its correction, and the turns' counters.
    fn report_turns(&self, b: &vgpu_common::sidecar::DevBucket, dev: usize, now: u64) {
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        let charged = b.charged_ns.load(Relaxed);
        let (at, before) = r[dev];
        if at != 0 && now.saturating_sub(at) < TURN_REPORT_NS {
            return;
        }
        r[dev] = (now, charged);
        if at != 0 {
            let pct = charged.wrapping_sub(before) as i64 as f64 * 100.0 / (now - at) as f64;
            let t = crate::sm::admission::take_turn_stats();
            let mean = |sum: u64, n: u64| sum as f64 / n.max(1) as f64 / 1e6;
            vlog!(
                crate::log::DEBUG,
                "sm dev {dev} turns: charged {pct:.1} % over {:.2} s, correction {:.3}; {} bursts on an empty queue, {:.2} ms into the turn; {} stops at {:.2} ms, queue to {:.2} ms",
                (now - at) as f64 / 1e9,
                correction::factor(b),
                t[0],
                mean(t[1], t[0]),
                t[2],
                mean(t[3], t[2]),
                mean(t[4], t[2]),
            );
        }
    }
}
