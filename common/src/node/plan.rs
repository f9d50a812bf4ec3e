//! The plan of turns: which phase of a common frame each member that wants
//! its share gets. Every process computes it from the same table.

use crate::region::rules::sm_limit;

/// The schedule's period: short enough that a 100 ms utilization sample
/// holds two whole frames, long enough that the two context switches per
/// frame cost nothing measurable.
pub const FRAME_NS: u64 = 50_000_000;
/// A container is in the plan while it wanted its share within this long.
pub const ACTIVE_NS: u64 = 200_000_000;
/// A container's turn: `[start, start + len)` within every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub start: u64,
    pub len: u64,
}

/// Container `me`'s phase among the `active` `(container, limit)` pairs;
/// `None` when it is alone among the limited ones (its bucket suffices) or
/// not among them.
pub fn plan(active: &[(u64, u32)], me: u64) -> Option<Phase> {
    // The table's cells hold a limit as the region does: decoded by its rule.
    let mut v: Vec<(u64, u32)> = active
        .iter()
        .filter(|(id, _)| *id != 0)
        .filter_map(|&(id, l)| Some((id, sm_limit(u64::from(l))?.percent())))
        .collect();
    v.sort_unstable();
    v.dedup_by_key(|x| x.0);
    if v.len() < 2 {
        return None;
    }
    let total: u64 = v.iter().map(|x| u64::from(x.1)).sum();
    let denom = total.max(100);
    let mut start = 0;
    for (id, limit) in v {
        let len = FRAME_NS * u64::from(limit) / denom;
        if id == me {
            return Some(Phase { start, len });
        }
        start += len;
    }
    None
}
