//! Learning what launches cost: the process's cost table (`cost`), the
//! thread's cache of it (`thread_cache`), and the timing events of sampled
//! launches, from recording to collection (docs/sm-limit.md, "What vgpu
//! does", 3). Nothing ever waits on an event: finished timings are polled,
//! at most `POLL_NS` apart and a few at a time.

#![forbid(unsafe_code)]

pub(super) mod cost;
pub(super) mod thread_cache;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use crate::driver::{Events, Poll};
use crate::sm::tuning::{EVENT_POOL, MAX_PENDING, POLL_MAX, POLL_NS};
use cost::{Costs, Key};

/// A timed launch in flight.
#[derive(Debug)]
struct Pending {
    ctx: usize,
    dev: usize,
    key: Key,
    start: usize,
    end: usize,
}

#[derive(Debug, Default)]
struct Table {
    costs: Costs,
    /// Event pairs for reuse, per context.
    pool: HashMap<usize, Vec<(usize, usize)>>,
    pending: VecDeque<Pending>,
}

/// A launch's cost, and the timing started for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Priced {
    pub cost_ns: u64,
    /// The thread's previous launch waited for the bucket.
    pub slept: bool,
    /// (context, start event, end event) of a timing to start.
    pub sample: Option<(usize, usize, usize)>,
}

/// The process's cost learning.
#[derive(Debug)]
pub(crate) struct Learner {
    /// Tells this learner's entries in the threads' caches from another's.
    id: u64,
    table: Mutex<Table>,
    /// Timed launches are in flight (`Table::pending` is not empty).
    has_pending: AtomicBool,
    next_poll: AtomicU64,
}

impl Default for Learner {
    fn default() -> Self {
        Self {
            id: thread_cache::new_owner(),
            table: Mutex::new(Table::default()),
            has_pending: AtomicBool::new(false),
            next_poll: AtomicU64::new(0),
        }
    }
}

impl Learner {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Collects finished timings when due at `now`; `settle(dev, owed)`
    /// is told the GPU ns still owed (or to refund) for launches that were
    /// charged a guess, once a key's cost is agreed.
    pub(crate) fn poll_due(&self, ev: &impl Events, now: u64, settle: impl FnMut(usize, i64)) {
        if !self.has_pending.load(Relaxed) || now < self.next_poll.load(Relaxed) {
            return;
        }
        self.next_poll.store(now.saturating_add(POLL_NS), Relaxed);
        let mut t = self.table();
        poll(ev, &mut t, POLL_MAX, settle);
        self.has_pending.store(!t.pending.is_empty(), Relaxed);
    }

    /// The cost to charge a launch of `key` on `dev` in context `ctx` at
    /// `now`, from the thread's cache when it can (no lock), and the event
    /// pair to time it with, if a timing is due.
    pub(crate) fn price(
        &self,
        ev: &impl Events,
        dev: usize,
        ctx: usize,
        key: Key,
        now: u64,
    ) -> Priced {
        let found = thread_cache::lookup(self.id, &key);
        let (cost_ns, pair) = match found.cost {
            Ok(cost) => (cost, None),
            Err(skipped) => {
                let mut t = self.table();
                let c = t.costs.charge(dev, key, found.slept, skipped, now);
                thread_cache::store(self.id, &key, &c);
                let pair = if c.sample {
                    take_pair(ev, &mut t, ctx)
                } else {
                    None
                };
                (c.cost_ns, pair)
            }
        };
        Priced {
            cost_ns,
            slept: found.slept,
            sample: pair.map(|(a, b)| (ctx, a, b)),
        }
    }

    /// The cost of `key` from the thread's cache, when no timing is due
    /// and `fits(cost)` agrees; counted as a launch of the key. No lock,
    /// no driver call.
    pub(crate) fn cached(&self, key: &Key, fits: impl FnOnce(u64) -> bool) -> Option<u64> {
        thread_cache::take_if(self.id, key, fits)
    }

    /// Notes whether this thread's launch waited for the bucket (its next
    /// launch's timing would hold the launch latency of an idle stream).
    pub(crate) fn note_slept(&self, slept: bool, was: bool) {
        if slept != was {
            thread_cache::set_slept(slept);
        }
    }

    /// Starts the timing `sample` before the launch on `stream`; `None`
    /// (the pair kept for reuse) when the event cannot be recorded.
    pub(crate) fn start(
        &self,
        ev: &impl Events,
        sample: (usize, usize, usize),
        stream: usize,
    ) -> Option<(usize, usize, usize)> {
        let (ctx, start, end) = sample;
        if ev.record(start, stream) {
            Some(sample)
        } else {
            self.give_back(ev, ctx, start, end);
            None
        }
    }

    /// Ends the timing `sample` of a launch of `key` on `dev` after it was
    /// forwarded on `stream`.
    pub(crate) fn finish(
        &self,
        ev: &impl Events,
        dev: usize,
        key: Key,
        stream: usize,
        sample: (usize, usize, usize),
    ) {
        let (ctx, start, end) = sample;
        if ev.record(end, stream) {
            self.table().pending.push_back(Pending {
                ctx,
                dev,
                key,
                start,
                end,
            });
            self.has_pending.store(true, Relaxed);
        } else {
            self.give_back(ev, ctx, start, end);
        }
    }

    /// A launch priced at `cost_ns` did not happen.
    pub(crate) fn cancel(
        &self,
        ev: &impl Events,
        key: Key,
        cost_ns: u64,
        sample: Option<(usize, usize, usize)>,
    ) {
        self.table().costs.uncharge(key, cost_ns);
        if let Some((ctx, start, end)) = sample {
            self.give_back(ev, ctx, start, end);
        }
    }

    /// The learnt cost of `key`, if any.
    #[cfg(test)]
    pub(crate) fn estimate(&self, key: &Key) -> Option<u64> {
        self.table().costs.estimate(key)
    }

    fn give_back(&self, ev: &impl Events, ctx: usize, start: usize, end: usize) {
        recycle(ev, &mut self.table(), ctx, start, end);
    }
}

fn take_pair(ev: &impl Events, t: &mut Table, ctx: usize) -> Option<(usize, usize)> {
    if t.pending.len() >= MAX_PENDING {
        return None;
    }
    if let Some(p) = t.pool.get_mut(&ctx).and_then(Vec::pop) {
        return Some(p);
    }
    ev.create_pair()
}

fn recycle(ev: &impl Events, t: &mut Table, ctx: usize, start: usize, end: usize) {
    let pool = t.pool.entry(ctx).or_default();
    if pool.len() < EVENT_POOL {
        pool.push((start, end));
    } else {
        ev.destroy_event(start);
        ev.destroy_event(end);
    }
}

/// Collects up to `max` finished timings, oldest first.
fn poll(ev: &impl Events, t: &mut Table, max: usize, mut settle: impl FnMut(usize, i64)) {
    for _ in 0..max {
        let Some(p) = t.pending.front() else { return };
        match ev.query(p.end) {
            Poll::NotReady => return,
            Poll::Failed => {
                if let Some(p) = t.pending.pop_front() {
                    ev.destroy_event(p.start);
                    ev.destroy_event(p.end);
                }
            }
            Poll::Ready => {
                let Some(p) = t.pending.pop_front() else {
                    return;
                };
                if let Some(ns) = ev.elapsed_ns(p.start, p.end) {
                    let owed = t.costs.sample(p.dev, p.key, ns);
                    if owed != 0 {
                        settle(p.dev, owed);
                    }
                }
                recycle(ev, t, p.ctx, p.start, p.end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;
    use crate::driver::fake::FakeDriver;
    use crate::sm::tuning::{AGREE, DEFAULT_COST_NS};

    const K: Key = Key::Kernel {
        func: 0x5000,
        grid: [4, 1, 1],
        block: [64, 1, 1],
    };

    /// One launch of `K` priced, timed and forwarded.
    fn launch(l: &Learner, gpu: &FakeDriver, now: u64) -> Priced {
        let p = l.price(gpu, 0, 7, K, now);
        let s = p.sample.and_then(|s| l.start(gpu, s, 0));
        if let Some(s) = s {
            l.finish(gpu, 0, K, 0, s);
        }
        p
    }

    #[test]
    fn a_guess_is_settled_once_timings_complete_and_agree() {
        let (l, gpu) = (Learner::default(), FakeDriver::default());
        let mut settled = Vec::new();
        for i in 0..AGREE {
            let p = launch(&l, &gpu, u64::from(i));
            assert_eq!(p.cost_ns, DEFAULT_COST_NS, "a guess until agreed");
            assert!(p.sample.is_some(), "every early launch is timed");
        }
        // Nothing completed: polling collects nothing.
        l.poll_due(&gpu, 1_000_000, |d, o| settled.push((d, o)));
        assert_eq!(l.estimate(&K), None);
        // The GPU ran them, 100 µs each: the cost is agreed, and the
        // guessed launches owe the difference.
        gpu.finish_events(100_000);
        for t in 1..4 {
            l.poll_due(&gpu, t * 10_000_000, |d, o| settled.push((d, o)));
        }
        assert_eq!(l.estimate(&K), Some(100_000));
        let owed = i64::from(AGREE) * (100_000 - DEFAULT_COST_NS as i64);
        assert_eq!(settled, vec![(0, owed)]);
        assert_eq!(launch(&l, &gpu, 50_000_000).cost_ns, 100_000);
    }

    #[test]
    fn a_timing_that_cannot_start_or_a_failed_launch_leaves_nothing_pending() {
        let (l, gpu) = (Learner::default(), FakeDriver::default());
        gpu.refuse_record.store(true, SeqCst);
        let p = launch(&l, &gpu, 0);
        assert!(p.sample.is_some(), "a pair was taken");
        assert!(!l.has_pending.load(Relaxed), "but nothing is in flight");
        gpu.refuse_record.store(false, SeqCst);
        // A launch that failed: its guess is taken back, so agreement
        // settles only the launches that happened.
        let p = l.price(&gpu, 0, 7, K, 1);
        l.cancel(&gpu, K, p.cost_ns, p.sample);
        let mut owed = 0;
        for i in 0..AGREE {
            launch(&l, &gpu, 2 + u64::from(i));
        }
        gpu.finish_events(50_000);
        for t in 1..4 {
            l.poll_due(&gpu, t * 10_000_000, |_, o| owed += o);
        }
        // Launches charged the guess: the refused one and AGREE more.
        assert_eq!(
            owed,
            i64::from(AGREE + 1) * (50_000 - DEFAULT_COST_NS as i64)
        );
        // The pairs were recycled, not leaked: no more events than two
        // launches' worth in flight ever needed.
        assert!(gpu.created.load(SeqCst) <= 2 * (AGREE as usize + 2));
    }
}
