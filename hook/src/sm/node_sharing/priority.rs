//! Priorities between containers on one GPU (HAMi's `CUDA_TASK_PRIORITY`:
//! 0 high, 1 low; docs/sm-limit.md, "Priority").
//!
//! Without MPS the GPU time-slices between contexts that both have work
//! queued, so a latency-bound service's request waits for whatever a busy
//! neighbour has queued. A container of lower priority therefore, while a
//! higher one is active on the GPU (it launched within `HOLD_NS`), keeps
//! at most `LOW_QUEUE_NS` of its own work queued, measured by completion
//! events (`Marks`: one per launch while held, so an estimate that is short
//! cannot let the real queue grow), and queues nothing while the higher
//! one has work in flight (`node_mapping::Member::inflight_until`), for at most
//! `YIELD_MAX_NS` at a time: a high-priority container that keeps the GPU
//! busy leaves the low one a short queue, not nothing. Once the higher one
//! is quiet for `HOLD_NS`, nothing is held.

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::driver::{Events, Poll};
use crate::sm::tuning::{LOW_QUEUE_NS, YIELD_MAX_NS};
use crate::sm::tuning::{MARK_POOL as MAX_POOL, MIN_WAIT_NS};

/// What the gate says about one launch of a lower-priority container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Go,
    WaitUntil(u64),
}

/// The gate at `now`: `high_until`, when the higher members' queued work
/// drains; `yielded`, how long this launch has already waited for it;
/// `queued`, the GPU ns of this process's own launches not yet known to be
/// complete; `cost`, this launch's.
pub fn gate(now: u64, high_until: u64, yielded: u64, queued: u64, cost: u64) -> Gate {
    if high_until > now && yielded < YIELD_MAX_NS {
        return Gate::WaitUntil(high_until.min(now + YIELD_MAX_NS - yielded));
    }
    if queued > 0 && queued.saturating_add(cost) > LOW_QUEUE_NS {
        let over = queued.saturating_add(cost) - LOW_QUEUE_NS;
        return Gate::WaitUntil(now + over.clamp(MIN_WAIT_NS, LOW_QUEUE_NS));
    }
    Gate::Go
}

/// This process's launches admitted while held, each with an event
/// recorded after it: the queue is the cost of those not yet complete.
#[derive(Debug, Default)]
pub struct Marks {
    /// (context, event, cost ns), oldest first.
    q: VecDeque<(usize, usize, u64)>,
    queued: u64,
    pool: Vec<(usize, usize)>,
}

impl Marks {
    /// Drops the completed launches from the front; returns the GPU ns
    /// still queued.
    pub fn drain(&mut self, sys: &impl Events) -> u64 {
        while let Some(&(ctx, ev, cost)) = self.q.front() {
            match sys.query(ev) {
                Poll::NotReady => break,
                Poll::Ready | Poll::Failed => {
                    self.q.pop_front();
                    self.queued = self.queued.saturating_sub(cost);
                    self.recycle(sys, ctx, ev);
                }
            }
        }
        if self.q.is_empty() {
            self.queued = 0;
        }
        self.queued
    }

    /// Records a marker after a launch of `cost` on `stream` of `ctx`.
    pub fn push(&mut self, sys: &impl Events, ctx: usize, stream: usize, cost: u64) {
        let ev = match self.pool.iter().rposition(|&(c, _)| c == ctx) {
            Some(i) => self.pool.swap_remove(i).1,
            None => match sys.create_event() {
                Some(e) => e,
                None => return,
            },
        };
        if sys.record(ev, stream) {
            self.q.push_back((ctx, ev, cost));
            self.queued = self.queued.saturating_add(cost);
        } else {
            self.recycle(sys, ctx, ev);
        }
    }

    fn recycle(&mut self, sys: &impl Events, ctx: usize, ev: usize) {
        if self.pool.len() < MAX_POOL {
            self.pool.push((ctx, ev));
        } else {
            sys.destroy_event(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_gate_yields_to_work_in_flight_then_keeps_the_queue_short() {
        let now = 1_000 * MS;
        // The higher one has 2 ms in flight: wait for it.
        assert_eq!(
            gate(now, now + 2 * MS, 0, 0, 200_000),
            Gate::WaitUntil(now + 2 * MS)
        );
        // ...but not for ever: a busy high-priority container leaves the
        // low one its short queue.
        assert_eq!(
            gate(now, now + 500 * MS, YIELD_MAX_NS - MS, 0, 200_000),
            Gate::WaitUntil(now + MS)
        );
        assert_eq!(
            gate(now, now + 500 * MS, YIELD_MAX_NS, 0, 200_000),
            Gate::Go
        );
        // Nothing in flight: up to LOW_QUEUE of own work queued.
        assert_eq!(
            gate(now, now, 0, 0, 5 * MS),
            Gate::Go,
            "an empty queue takes any kernel"
        );
        assert_eq!(gate(now, now, 0, LOW_QUEUE_NS - 200_000, 200_000), Gate::Go);
        assert_eq!(
            gate(now, now, 0, LOW_QUEUE_NS, 200_000),
            Gate::WaitUntil(now + 200_000)
        );
    }
}
