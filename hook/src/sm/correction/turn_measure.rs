//! Measuring the container's own turns (docs/sm-limit.md, "Time division
//! between containers").
//!
//! A turn is filled by the learnt costs; if they are short, the container's
//! work runs past its turn into the next container's, both contexts then
//! have work queued, and the device time-slices between them: the loss the
//! turns exist to avoid. Learnt costs (a window minimum) run some percent
//! short of what a turn really takes, and the overrun cascades: the
//! neighbour's launches then block in the driver. A turn is exclusive, so its own GPU time can be measured
//! exactly: an event before the turn's first launch and one after its last,
//! against the sum of the charges admitted in between. Their ratio is the
//! evidence the correction factor (`correction::from_turn`) learns from
//! while taking turns. A burst during which the queue ran dry
//! (the host fell behind, so the events span idle time) or that spread over
//! several streams is not used.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Mutex;

use vgpu_common::region::MAX_DEVICES;

use vgpu_common::sidecar::DevBucket;

use crate::driver::{Events as Gpu, Poll};
use crate::sm::correction;
use crate::sm::tuning::{MIN_BURST_NS, RESTART_WITHIN};

/// One turn's launches on one stream, between two events.
#[derive(Debug, Clone, Copy)]
struct Burst {
    ctx: usize,
    stream: usize,
    start: usize,
    end: usize,
}

#[derive(Debug, Default)]
struct Events {
    /// The burst whose end event is recorded, waiting for the GPU, and the
    /// charges it held.
    done: Option<(Burst, u64, u64)>,
    /// The open burst.
    open: Option<Burst>,
    /// An event pair of the context it was made in, for the next burst.
    spare: Option<(usize, usize, usize)>,
}

#[derive(Debug, Default)]
struct Dev {
    /// The open burst's stream (`tag`; 0 = none), its charges so far, and whether
    /// it is spoilt (the queue ran dry, another stream).
    stream: AtomicUsize,
    charged: AtomicU64,
    launches: AtomicU64,
    spoilt: AtomicBool,
    events: Mutex<Events>,
}

/// Per process: what its turns really took.
#[derive(Debug, Default)]
pub struct Meter {
    devs: [Dev; MAX_DEVICES],
}

impl Meter {
    /// A launch of `charge` was admitted in a turn; `empty`: the container's
    /// queue had drained before it. Called before the launch is forwarded.
    /// `at`: the launch's context and stream.
    pub(crate) fn admitted<S: Gpu>(
        &self,
        sys: &S,
        b: &DevBucket,
        dev: usize,
        at: (usize, usize),
        charge: u64,
        empty: bool,
    ) {
        let (ctx, stream) = at;
        let Some(d) = self.devs.get(dev) else { return };
        let open = d.stream.load(Acquire);
        if open != 0 {
            if open != tag(stream) {
                d.spoilt.store(true, Relaxed);
            } else if empty && d.launches.load(Relaxed) < RESTART_WITHIN && self.restart(sys, d) {
                // The host stalled right after the turn began (its first
                // launch after the context switch can take a while in the
                // driver): measure from here.
                d.charged.store(charge, Relaxed);
                d.launches.store(1, Relaxed);
                return;
            } else if empty {
                d.spoilt.store(true, Relaxed);
            }
            d.charged.fetch_add(charge, Relaxed);
            d.launches.fetch_add(1, Relaxed);
            return;
        }
        if !empty {
            return;
        }
        // The first launch of a turn: open a burst (at most one thread).
        let Ok(mut ev) = d.events.try_lock() else {
            return;
        };
        collect(sys, b, &mut ev);
        if ev.done.is_some() || ev.open.is_some() {
            return;
        }
        let pair = match ev.spare.take() {
            Some((c, a, b)) if c == ctx => Some((a, b)),
            Some((_, a, b)) => {
                sys.destroy_event(a);
                sys.destroy_event(b);
                None
            }
            None => None,
        };
        let Some((start, end)) = pair.or_else(|| sys.create_pair()) else {
            return;
        };
        if !sys.record(start, stream) {
            ev.spare = Some((ctx, start, end));
            return;
        }
        ev.open = Some(Burst {
            ctx,
            stream,
            start,
            end,
        });
        d.charged.store(charge, Relaxed);
        d.launches.store(1, Relaxed);
        d.spoilt.store(false, Relaxed);
        d.stream.store(tag(stream), Release);
    }

    /// Records the open burst's start event again, before this launch.
    fn restart<S: Gpu>(&self, sys: &S, d: &Dev) -> bool {
        let Ok(ev) = d.events.try_lock() else {
            return false;
        };
        ev.open.is_some_and(|b| sys.record(b.start, b.stream))
    }

    /// The container's next launch waits for its next turn: the open burst
    /// ends after the launches already forwarded.
    pub(crate) fn turn_ended<S: Gpu>(&self, sys: &S, dev: usize) {
        let Some(d) = self.devs.get(dev) else { return };
        if d.stream.load(Acquire) == 0 {
            return;
        }
        let Ok(mut ev) = d.events.try_lock() else {
            return;
        };
        let Some(b) = ev.open.take() else { return };
        d.stream.store(0, Release);
        let charged = d.charged.load(Relaxed);
        if d.spoilt.load(Relaxed) || charged < MIN_BURST_NS || !sys.record(b.end, b.stream) {
            ev.spare = Some((b.ctx, b.start, b.end));
            return;
        }
        ev.done = Some((b, charged, d.launches.load(Relaxed)));
    }
}

/// Reads a finished burst, if any, into the correction.
fn collect<S: Gpu>(sys: &S, b: &DevBucket, ev: &mut Events) {
    let Some((burst, charged, launches)) = ev.done else {
        return;
    };
    match sys.query(burst.end) {
        Poll::NotReady => return,
        Poll::Failed => {}
        Poll::Ready => {
            if let Some(took) = sys.elapsed_ns(burst.start, burst.end) {
                vlog!(
                    crate::log::DEBUG,
                    "sm turn burst: took {:.2} ms, charged {:.2} ms, {} launches",
                    took as f64 / 1e6,
                    charged as f64 / 1e6,
                    launches
                );
                let _ = correction::from_turn(b, took, charged);
            }
        }
    }
    ev.done = None;
    ev.spare = Some((burst.ctx, burst.start, burst.end));
}

/// A stream as a non-zero word: the legacy stream is the null handle.
fn tag(stream: usize) -> usize {
    stream | 1 << (usize::BITS - 1)
}
