//! Time division between limited containers on one GPU (docs/sm-limit.md,
//! "Time division between containers").
//!
//! Two processes of two containers run in two contexts, and a GPU without
//! MPS time-slices between contexts that both have work queued. Slicing
//! costs device time that neither gets (about a tenth of the device), and
//! the larger share loses most of it, whatever the batch size of the
//! smaller. Exclusive turns, each container draining its queue before the
//! other's turn, give each its share (docs/benchmarks.md, "containers
//! taking turns", has the figures).
//!
//! So while two or more limited containers on a GPU each use most of their
//! share (`demand`), each one runs only in its own phase of a common frame
//! on CLOCK_MONOTONIC (shared by every container of a node): phases in the
//! order of the containers, each `limit %` of the frame (scaled down when
//! the limits add up to more than 100). `vgpu daemon` makes the plan
//! (`vgpu_common::node::plan`) and writes each container its own phase. A
//! launch is admitted only when the container's queued work plus its cost
//! fits before the phase ends.

#![forbid(unsafe_code)]

use crate::sm::tuning::ALONE_WITHIN_DIV;
pub use crate::sm::tuning::GUARD_NS;
#[cfg(test)]
pub use vgpu_common::node::{plan, ACTIVE_NS};
pub use vgpu_common::node::{Phase, FRAME_NS};

/// The plan in one word for the launch path: 0 = none.
pub fn encode(p: Option<Phase>) -> u64 {
    vgpu_common::node::encode_turn(p)
}

pub fn decode(w: u64) -> Option<Phase> {
    vgpu_common::node::decode_turn(w)
}

/// How far `t` is into the phase's latest start at or before it.
pub fn into_turn(p: Phase, t: u64) -> u64 {
    t.saturating_sub(p.start) % FRAME_NS
}

/// Outcome of one admission attempt in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Launch now; the container's queue then drains at this instant.
    Go { busy_until: u64 },
    /// Not before this instant (the next phase's start).
    WaitUntil(u64),
}

/// Admits `cost` ns of GPU work at `now` into phase `p`: it starts after
/// the container's queued work (which drains at `busy`) and must reach its
/// midpoint `GUARD_NS` before the phase ends. (Whole kernels do not tile a
/// phase: requiring the last one to end inside it would cut a container of
/// 1 ms kernels in 15 ms turns to 28 % instead of 30; by midpoints it is
/// right on average, and overruns by at most half a kernel.) Work longer
/// than a whole phase goes alone, early in a phase: it then overruns, but
/// still makes progress.
pub fn gate(p: Phase, now: u64, busy: u64, cost: u64) -> Gate {
    let ws = now.saturating_sub(p.start) / FRAME_NS * FRAME_NS + p.start;
    let we = ws + p.len;
    if (ws..we).contains(&now) {
        let begin = now.max(busy);
        let fits = begin + cost / 2 + GUARD_NS <= we;
        let alone =
            busy <= ws && cost / 2 + GUARD_NS > p.len && now - ws <= p.len / ALONE_WITHIN_DIV;
        if fits || alone {
            return Gate::Go {
                busy_until: begin + cost,
            };
        }
    }
    Gate::WaitUntil(if now < ws { ws } else { ws + FRAME_NS })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn work_is_admitted_only_where_it_fits_in_the_phase() {
        let p = Phase {
            start: 15 * MS,
            len: 35 * MS,
        };
        let f = 1000 * FRAME_NS; // a frame boundary
                                 // Before the phase: wait for its start.
        assert_eq!(gate(p, f + MS, 0, MS), Gate::WaitUntil(f + 15 * MS));
        // In it, behind queued work, while it fits.
        assert_eq!(
            gate(p, f + 20 * MS, f + 30 * MS, 5 * MS),
            Gate::Go {
                busy_until: f + 35 * MS
            }
        );
        // Queued work would take it past the end: the next frame's phase.
        assert_eq!(
            gate(p, f + 20 * MS, f + 47 * MS, 6 * MS),
            Gate::WaitUntil(f + FRAME_NS + 15 * MS)
        );
        // Too near the end of the phase.
        assert_eq!(
            gate(p, f + 49 * MS + 4 * MS / 5, 0, 10_000),
            Gate::WaitUntil(f + FRAME_NS + 15 * MS)
        );
        // Longer than a whole phase: early in a phase with nothing queued.
        let long = 80 * MS;
        assert_eq!(
            gate(p, f + 16 * MS, f, long),
            Gate::Go {
                busy_until: f + 96 * MS
            }
        );
        assert!(matches!(gate(p, f + 30 * MS, f, long), Gate::WaitUntil(_)));
        assert!(matches!(
            gate(p, f + 16 * MS, f + 17 * MS, long),
            Gate::WaitUntil(_)
        ));
    }

    #[test]
    fn back_to_back_work_fills_each_phase_and_never_leaves_it() {
        // One container's view: 200 µs kernels, the host always ready.
        let p = Phase {
            start: 10 * MS,
            len: 15 * MS,
        };
        let (mut now, mut busy, mut gpu) = (7 * FRAME_NS, 0u64, 0u64);
        let end = now + 40 * FRAME_NS;
        while now < end {
            match gate(p, now, busy, 200_000) {
                Gate::Go { busy_until } => {
                    let start = busy_until - 200_000;
                    let off = start % FRAME_NS;
                    assert!(off >= p.start && busy_until % FRAME_NS <= p.start + p.len + 100_000);
                    busy = busy_until;
                    gpu += 200_000;
                    now += 5_000;
                }
                Gate::WaitUntil(t) => now = t,
            }
        }
        let share = gpu as f64 / (40 * FRAME_NS) as f64;
        assert!((share - 0.3).abs() < 0.3 * 0.03, "{share}");
    }
}
