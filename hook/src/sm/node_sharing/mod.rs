//! How the container shares a GPU with the node's other containers, through
//! the node's table (`node_mapping`): taking turns with other limited containers
//! that use most of their share (`demand`, `phase`), and priorities (`priority`:
//! a lower-priority container keeps its queue short while a higher one is
//! active). Re-planned every `REPLAN_NS` on a limited launch.

#![forbid(unsafe_code)]

pub(super) mod demand;
pub(super) mod node_mapping;
pub(super) mod phase;
pub(super) mod priority;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Mutex;

use vgpu_common::region::rules::{self, SmLimit};
use vgpu_common::region::MAX_DEVICES;

use crate::driver::Events;
use crate::sm::correction;
use crate::sm::sys::{Container, NodeTable};
use crate::sm::tuning::{HIGH_START_NS, HOLD_NS, MONITOR_LAG_NS, REPLAN_NS, TURN_REPORT_NS};
use demand::Demand;
use phase::Phase;
use priority::Marks;

/// This process's view of the node, per device.
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
    /// This container's member of the node table, + 1.
    member: [AtomicU32; MAX_DEVICES],
    /// The members of higher priority active now (bit mask).
    higher: [AtomicU32; MAX_DEVICES],
    /// A member of higher priority was active within `MONITOR_LAG_NS`: a
    /// block from HAMi's monitor is about it, and the hold rule answers it.
    outranked: [AtomicBool; MAX_DEVICES],
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
            member: std::array::from_fn(|_| AtomicU32::new(0)),
            higher: std::array::from_fn(|_| AtomicU32::new(0)),
            outranked: std::array::from_fn(|_| AtomicBool::new(false)),
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

    /// The members of higher priority active on `dev` (bit mask).
    pub(crate) fn higher(&self, dev: usize) -> u32 {
        self.higher[dev].load(Relaxed)
    }

    /// Whether a member of higher priority was active on any device within
    /// `MONITOR_LAG_NS`, so that a block by HAMi's monitor (which lags
    /// activity by up to two of its 5 s ticks) is one the node table sees
    /// too, and the hold rule (fresher by three orders of magnitude) serves
    /// it instead of sleeping.
    pub(crate) fn outranked(&self) -> bool {
        self.outranked.iter().any(|o| o.load(Relaxed))
    }

    /// Re-plans `dev` when due at `now`: the container is active there at
    /// `pct` (`None`: accounted, not limited) with priority `priority`.
    pub(crate) fn replan_if_due<S: Container + NodeTable>(
        &self,
        sys: &S,
        dev: usize,
        now: u64,
        pct: Option<SmLimit>,
        priority: i32,
    ) {
        if now >= self.plan_next[dev].load(Relaxed) {
            self.replan(sys, dev, now, pct, priority);
        }
    }

    /// Re-reads the node's table of limited containers on `dev` (marking
    /// this one active at `pct`, and wanting its share if it does) and
    /// stores the container's turn, if another limited container on the
    /// device wants its share too.
    fn replan<S: Container + NodeTable>(
        &self,
        sys: &S,
        dev: usize,
        now: u64,
        pct: Option<SmLimit>,
        priority: i32,
    ) {
        if self.replanning.swap(true, Acquire) {
            return;
        }
        self.plan_next[dev].store(now.saturating_add(REPLAN_NS), Relaxed);
        let b = &sys.buckets().devs[dev];
        let wants = pct.is_some_and(|p| self.wants_share(b, dev, now, p));
        self.light[dev].store(pct.is_some() && self.demand.light(dev), Relaxed);
        let mut higher = 0;
        let mut outranked = false;
        let mut member = 0;
        let plan = sys.node(dev).and_then(|node| {
            let id = sys.buckets().container_id();
            let me = node.join(id, now)?;
            member = node
                .members
                .iter()
                .position(|m| std::ptr::eq(m, me))
                .map_or(0, |i| i as u32 + 1);
            me.touch(now, rules::sm_limit_cell(pct));
            me.set_priority(Some(priority));
            higher = node.higher(id, me.rank.load(Relaxed), now, HOLD_NS);
            outranked = node.higher(id, me.rank.load(Relaxed), now, MONITOR_LAG_NS) != 0;
            if wants {
                me.want(now);
            }
            if !sys.turns() {
                return None;
            }
            phase::plan(&node.wanting(now, phase::ACTIVE_NS), id)
        });
        self.member[dev].store(member, Relaxed);
        self.outranked[dev].store(outranked, Relaxed);
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

    /// While containers of higher priority (`higher`, members of the node
    /// table) are active on `dev`: until when this launch of `cost` must
    /// wait (`priority::gate`), having waited `yielded` already; `None` = go.
    pub(crate) fn yield_to<S: Events + NodeTable>(
        &self,
        sys: &S,
        dev: usize,
        higher: u32,
        now: u64,
        yielded: u64,
        cost: u64,
    ) -> Option<u64> {
        let node = sys.node(dev)?;
        let high_until = node.inflight_until(higher);
        let queued = {
            let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            m.drain(sys)
        };
        match priority::gate(now, high_until, yielded, queued, cost) {
            priority::Gate::Go => None,
            priority::Gate::WaitUntil(t) => Some(t),
        }
    }

    /// Records a marker after a launch of `cost` admitted while held.
    pub(crate) fn mark<S: Events>(&self, sys: &S, ctx: usize, stream: usize, cost: u64) {
        let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        m.push(sys, ctx, stream, cost);
    }

    /// Publishes `cost` of work queued at `now` in the container's member
    /// of the node table, for lower-priority containers to yield to.
    pub(crate) fn note_queued<S: NodeTable>(&self, sys: &S, dev: usize, now: u64, cost: u64) {
        let i = self.member[dev].load(Relaxed);
        if i == 0 {
            return;
        }
        if let Some(m) = sys.node(dev).and_then(|n| n.members.get(i as usize - 1)) {
            // Its work starts, at the latest, once the lower-priority
            // containers' short queues have drained and the GPU has
            // switched contexts: in flight until then, and for its cost.
            m.queued(now.saturating_add(HIGH_START_NS), cost);
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
