//! The plan of turns: which phase of a common frame each limited container
//! that wants its share gets. The daemon computes it per GPU.

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

/// A turn in one word, as the plan stores it: 0 = none, else a flag and
/// the phase's start and length in µs.
pub fn encode_turn(p: Option<Phase>) -> u64 {
    p.map_or(0, |p| {
        1 << 63 | ((p.start / 1_000) & 0xff_ffff) << 24 | ((p.len / 1_000) & 0xff_ffff)
    })
}

/// The turn [`encode_turn`] stored; `None` for 0 or a phase that does not
/// fit in a frame (not one the daemon writes).
pub fn decode_turn(w: u64) -> Option<Phase> {
    let p = (w >> 63 == 1).then(|| Phase {
        start: (w >> 24 & 0xff_ffff) * 1_000,
        len: (w & 0xff_ffff) * 1_000,
    })?;
    (p.len > 0 && p.start.saturating_add(p.len) <= FRAME_NS).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn phases_follow_the_limits_in_id_order() {
        let a = [(9, 70), (4, 30)];
        assert_eq!(
            plan(&a, 4),
            Some(Phase {
                start: 0,
                len: 15 * MS
            })
        );
        assert_eq!(
            plan(&a, 9),
            Some(Phase {
                start: 15 * MS,
                len: 35 * MS
            })
        );
        // Alone, unlimited neighbours, or not a member: no plan.
        assert_eq!(plan(&[(4, 30)], 4), None);
        assert_eq!(plan(&[(4, 30), (5, 100), (6, 0)], 4), None);
        assert_eq!(plan(&a, 5), None);
        // Over-committed: scaled to the frame.
        let b = [(1, 80), (2, 80), (3, 40)];
        assert_eq!(plan(&b, 3).unwrap().len, 10 * MS);
        assert_eq!(plan(&b, 3).unwrap().start, 40 * MS);
        // Under-committed: the rest of the frame is nobody's.
        let c = [(1, 20), (2, 30)];
        assert_eq!(
            plan(&c, 2).unwrap(),
            Phase {
                start: 10 * MS,
                len: 15 * MS
            }
        );
        for p in [plan(&a, 9), plan(&b, 3), None] {
            assert_eq!(decode_turn(encode_turn(p)), p);
        }
    }
}
