//! The controller: one process's limiter, composed of its parts. Per
//! launch it reads the settings when due (`settings`), obeys the monitor's
//! blocking, prices the launch (`cost_learning`), lets a higher-priority container
//! go first (`node_sharing`), admits the charge `cost × correction` on the
//! container's bucket or in its turn (`admission`), and finds the feedback
//! loop's step due (`correction::nvml_feedback`); after it, it starts the launch's timing or
//! takes the charge back.
//!
//! The fast path (no device limited) is a coarse clock read and three
//! relaxed loads. Far under its limit a container coasts (`coast`): a
//! launch of known cost adds it to what the window owes, with no driver
//! call, clock read or shared write beyond the unlimited path's.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::region::rules::SmLimit;
use vgpu_common::region::MAX_DEVICES;

use crate::driver::{Events, Nvml};
use crate::sm::admission::coast::Coast;
use crate::sm::admission::gcra::Admit;
use crate::sm::admission::{self, Admission};
use crate::sm::correction;
use crate::sm::correction::nvml_feedback::Feedback;
use crate::sm::correction::turn_measure;
use crate::sm::cost_learning::cost::Key;
use crate::sm::cost_learning::Learner;
use crate::sm::node_sharing::Sharing;
use crate::sm::published_share::PublishedShare;
use crate::sm::settings::Settings;
use crate::sm::tuning::MAX_SLEEP_NS;
use crate::world::{Job, World};

/// What `before` hands to `after` for one launch.
#[derive(Debug)]
pub(crate) struct Ticket {
    dev: usize,
    key: Key,
    cost_ns: u64,
    /// What the bucket was charged (`cost_ns × correction`).
    billed_ns: u64,
    /// The limit it was charged at (`None`: not charged to the bucket).
    pct: Option<SmLimit>,
    stream: usize,
    /// (context, start event, end event).
    sample: Option<(usize, usize, usize)>,
    /// Held by a higher-priority container: record a marker after it
    /// (context).
    mark: Option<usize>,
    /// Coasted: its cost is owed to the window, nothing else was done.
    coasted: bool,
}

impl Ticket {
    /// The device the launch was admitted on.
    pub(crate) fn dev(&self) -> usize {
        self.dev
    }
}

/// The launch as the controller sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    pub key: Key,
    /// The stream events are recorded on (the per-thread default stream
    /// already resolved to `CU_STREAM_PER_THREAD`).
    pub stream: usize,
}

/// What admission decided for one launch.
struct Admitted {
    /// The limit charged at (`None`: not charged).
    pct: Option<SmLimit>,
    slept: bool,
    billed: u64,
    /// Held by a higher priority first.
    held: bool,
}

/// The limiter of one process, over the driver `D` and the world `W`
/// (both monomorphised: no dynamic call on the launch path).
#[derive(Debug)]
pub(crate) struct Controller<D: Events + Nvml, W: World> {
    pub driver: D,
    pub world: W,
    /// What the background thread runs for this controller (its
    /// [`Controller::background`]).
    background: fn(),
    settings: Settings,
    learner: Learner,
    admission: Admission,
    sharing: Sharing,
    /// What the container's turns really took.
    turns: turn_measure::Meter,
    feedback: Feedback,
    share: PublishedShare,
    coast: Coast,
}

impl<D: Events + Nvml, W: World> Controller<D, W> {
    /// The limiter over `driver` and `world`, whose feedback steps run on
    /// the launch path.
    #[cfg(test)]
    pub(crate) fn new(driver: D, world: W) -> Self {
        Self::with_background(driver, world, || {})
    }

    /// As [`Controller::new`]; a background thread, when the world has
    /// one, runs `background` (which calls [`Controller::background`] of
    /// this controller) for the feedback steps.
    pub(crate) fn with_background(driver: D, world: W, background: fn()) -> Self {
        Self {
            driver,
            world,
            background,
            settings: Settings::default(),
            learner: Learner::default(),
            admission: Admission::default(),
            sharing: Sharing::default(),
            turns: turn_measure::Meter::default(),
            feedback: Feedback::default(),
            share: PublishedShare::default(),
            coast: Coast::default(),
        }
    }

    /// Before a launch: may sleep (blocked by the monitor, or the bucket is
    /// empty). `None` when the launch is not accounted.
    pub(crate) fn before(&self, w: &Work) -> Option<Ticket> {
        let now = self.world.coarse();
        if self.settings.due(now) {
            self.refresh(now);
        }
        // A block by HAMi's monitor means "a container of higher priority is
        // active on your GPU". Where the daemon's plan shows that container,
        // the hold rule keeps this one's queue short for exactly as long as
        // it is active; sleeping whole seconds on the monitor's 5 s view
        // would starve this one and keep the GPU idle after it stops.
        if !self.sharing.outranked() {
            self.settings.wait_unblocked(&self.world);
        }
        if self.settings.limited() == 0 {
            return None;
        }
        if let Some(t) = self.coasting(w, now) {
            return Some(t);
        }
        self.limited_launch(w)
    }

    /// A launch of a container far under its limit on a device with a
    /// window open (`coast`), priced from the thread's cache with no timing
    /// due: its cost is owed to the window. The device is the process's
    /// only one, else the current context's (the query an unlimited launch
    /// makes to count it). `None`: the full path.
    fn coasting(&self, w: &Work, now: u64) -> Option<Ticket> {
        // With several devices, ask for the context only when coasting is
        // possible at all: otherwise the full path asks once.
        let dev = match self.driver.only_device() {
            Some(d) => d,
            None if self.coast.any_open(now) => self.driver.current()?.1,
            None => return None,
        };
        if dev >= MAX_DEVICES
            || self.settings.limited() & (1 << dev) == 0
            || !self.coast.open(dev, now)
        {
            return None;
        }
        let cost = self.learner.cached(&w.key, |c| self.coast.take(dev, c))?;
        Some(Ticket {
            dev,
            key: w.key,
            cost_ns: cost,
            billed_ns: 0,
            pct: None,
            stream: w.stream,
            sample: None,
            mark: None,
            coasted: true,
        })
    }

    fn refresh(&self, now: u64) {
        let buckets = self.world.buckets();
        self.settings
            .refresh(&self.world, now, |region, slot, mask| {
                self.share.publish(region, slot, buckets, mask, now)
            });
    }

    fn limited_launch(&self, w: &Work) -> Option<Ticket> {
        let (ctx, dev) = self.driver.current()?;
        if dev >= MAX_DEVICES || self.settings.limited() & (1 << dev) == 0 {
            return None;
        }
        // A launch captured into a graph runs when the graph is launched,
        // and is charged then.
        if self.driver.capturing(w.stream) {
            return None;
        }
        let now = self.world.now();
        self.settle_coasted(dev, now);
        self.learner
            .poll_due(&self.driver, now, |dev, owed| self.settle(dev, owed));
        let priced = self.learner.price(&self.driver, dev, ctx, w.key, now);
        self.share.add(dev, priced.cost_ns as i64);
        let a = self.admit(dev, priced.cost_ns, now, (ctx, w.stream));
        self.learner.note_slept(a.slept, priced.slept);
        // Coast on while the bucket neither held this launch nor is shared
        // with the node (turns, priorities: those publish every launch).
        let b = &self.world.buckets().devs[dev];
        let eligible = !a.slept && !self.settings.ranked() && self.sharing.turn(dev).is_none();
        self.coast.plan(
            dev,
            now,
            b.charged_ns.load(Relaxed),
            a.pct,
            correction::factor(b),
            eligible,
        );
        Some(Ticket {
            dev,
            key: w.key,
            cost_ns: priced.cost_ns,
            billed_ns: a.billed,
            pct: a.pct,
            stream: w.stream,
            sample: priced
                .sample
                .and_then(|s| self.learner.start(&self.driver, s, w.stream)),
            mark: a.held.then_some(ctx),
            coasted: false,
        })
    }

    /// Admits a launch of `cost` on `dev` (`now`: the clock read for it;
    /// `at`: its context and stream), sleeping until it may go: first
    /// while a container of higher priority is active on the device
    /// (`node_sharing`), then until its charge `cost × correction` fits in the
    /// bucket or, taking turns, in the container's turn.
    fn admit(&self, dev: usize, cost: u64, mut now: u64, at: (usize, usize)) -> Admitted {
        let b = &self.world.buckets().devs[dev];
        let mut slept = false;
        let arrived = now;
        loop {
            let pct = self.settings.enforced(dev);
            if pct.is_none() && !self.settings.ranked() {
                return Admitted {
                    pct: None,
                    slept,
                    billed: 0,
                    held: false,
                };
            }
            self.sharing.replan_if_due(&self.world, dev, now, pct);
            let higher = self.sharing.higher(dev);
            let held = higher != 0;
            if held {
                if let Some(t) =
                    self.sharing
                        .yield_to(&self.driver, &self.world, dev, now, now - arrived, cost)
                {
                    slept = true;
                    now = self.sleep(t);
                    continue;
                }
            }
            let Some(pct) = pct else {
                self.sharing.note_queued(&self.world, dev, now, cost);
                return Admitted {
                    pct: None,
                    slept,
                    billed: 0,
                    held,
                };
            };
            let billed = correction::charge(b, cost);
            let turn = self.sharing.turn(dev);
            let light = self.sharing.light(dev);
            let (admitted, empty) = self.admission.try_once(b, turn, now, billed, pct, light);
            if turn.is_some() {
                match admitted {
                    Admit::Go => self.turns.admitted(&self.driver, b, dev, at, billed, empty),
                    Admit::WaitUntil(_) => self.turns.turn_ended(&self.driver, dev),
                }
            }
            match admitted {
                Admit::Go => {
                    b.charged_ns.fetch_add(billed, Relaxed);
                    if slept {
                        b.throttled.fetch_add(1, Relaxed);
                    }
                    self.sharing.note_queued(&self.world, dev, now, cost);
                    // Unthrottled launches step the loop too: a container
                    // whose charges are too low never waits for the bucket,
                    // and only a measurement can find that out. Taking
                    // turns, the turns' own events are the evidence, and
                    // NVML's per-process split of a device passed between
                    // contexts every few ms is no measure: the loop waits.
                    if turn.is_none() {
                        self.feedback
                            .on_launch(&self.driver, &self.world, dev, now, pct, || {
                                self.world.offload(Job::SmFeedback, self.background)
                            });
                    }
                    return Admitted {
                        pct: Some(pct),
                        slept,
                        billed,
                        held,
                    };
                }
                Admit::WaitUntil(t) => {
                    slept = true;
                    let t = t.min(now.saturating_add(MAX_SLEEP_NS));
                    now = self.sleep(t);
                    self.admission.woke_late(now.saturating_sub(t));
                }
            }
        }
    }

    /// Sleeps until `t`; re-reads the settings when due. Returns the time.
    fn sleep(&self, t: u64) -> u64 {
        self.world.sleep_until(t);
        let now = self.world.now();
        if self.settings.due(now) {
            self.refresh(now);
        }
        now
    }

    /// After the launch returned `ok` (CUDA_SUCCESS or not).
    pub(crate) fn after(&self, t: Ticket, ok: bool) {
        if t.coasted {
            if !ok {
                self.coast.give_back(t.dev, t.cost_ns);
            }
            return;
        }
        if ok {
            if let Some(ctx) = t.mark {
                self.sharing.mark(&self.driver, ctx, t.stream, t.cost_ns);
            }
            if let Some(s) = t.sample {
                self.learner.finish(&self.driver, t.dev, t.key, t.stream, s);
            }
            return;
        }
        // The launch did not happen: take its charge back.
        self.learner
            .cancel(&self.driver, t.key, t.cost_ns, t.sample);
        self.share.add(t.dev, -(t.cost_ns as i64));
        if let Some(pct) = t.pct {
            let b = &self.world.buckets().devs[t.dev];
            self.admission.refund(b, self.world.now(), t.billed_ns, pct);
        }
    }

    /// Charges what the launches coasted on `dev` owe, at the bucket's time
    /// like a settlement: they ran within the window behind it.
    fn settle_coasted(&self, dev: usize, now: u64) {
        let owed = self.coast.take_owed(dev);
        if owed == 0 {
            return;
        }
        let owed = i64::try_from(owed).unwrap_or(i64::MAX);
        self.share.add(dev, owed);
        if let Some(pct) = self.settings.enforced(dev) {
            let b = &self.world.buckets().devs[dev];
            let turns = self.sharing.turn(dev).is_some();
            self.admission.settle(b, now, owed, pct, turns);
        }
    }

    /// Charges GPU time learnt after the fact (launches charged a guess),
    /// at most a frame of wall time at the limit (`admission::settlement_cap`).
    fn settle(&self, dev: usize, owed: i64) {
        let owed = admission::settlement_cap(owed, self.settings.limit(dev));
        self.share.add(dev, owed);
        if let Some(pct) = self.settings.enforced(dev) {
            let b = &self.world.buckets().devs[dev];
            let turns = self.sharing.turn(dev).is_some();
            self.admission.settle(b, self.world.now(), owed, pct, turns);
        }
    }

    /// The background thread's turn (`world::Background::offload`): runs
    /// the feedback steps that launches found due, off their path.
    pub(crate) fn background(&self) {
        self.feedback.background(&self.driver, &self.world);
    }

    /// GPU ns charged to this process on `dev`.
    #[cfg(test)]
    pub(crate) fn charged_ns(&self, dev: usize) -> i64 {
        self.share.charged_ns(dev)
    }

    /// The learnt cost of `key`, if any.
    #[cfg(test)]
    pub(crate) fn estimate(&self, key: &Key) -> Option<u64> {
        self.learner.estimate(key)
    }

    /// The correction factor on `dev`'s charges (1: none).
    #[cfg(test)]
    pub(crate) fn factor(&self, dev: usize) -> f64 {
        self.world
            .buckets()
            .devs
            .get(dev)
            .map_or(1.0, correction::factor)
    }

    /// The container's turn on `dev`, while it takes turns.
    #[cfg(test)]
    pub(crate) fn turn(&self, dev: usize) -> Option<crate::sm::node_sharing::phase::Phase> {
        self.sharing.turn(dev)
    }
}
