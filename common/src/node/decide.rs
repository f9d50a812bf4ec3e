//! What the daemon decides for each container on one GPU, from what no
//! tenant can forge (each container's SM limit and priority in its runtime
//! spec, whether NVML sees it use the GPU) and each container's own
//! statement of its activity (its plan's second line), which can only make
//! the plan react sooner: a statement counts only while the kernel's view
//! confirms the container uses the GPU, instants ahead of the clock count
//! for nothing, and work said to be in flight holds others at most a frame.

use crate::region::rules::SmLimit;
use crate::sidecar::{OwnWords, PlanWords};

use super::{plan, ACTIVE_NS, FRAME_NS, HOLD_NS, MONITOR_LAG_NS, PLAN_TTL_NS};

/// How far ahead of the daemon's clock a container's stated instant may
/// be: the hook stamps its own reading of the node's CLOCK_MONOTONIC, a
/// little after the daemon took its `now`. Further ahead, no honest hook
/// wrote it: it counts as never.
pub const FUTURE_SLACK_NS: u64 = 100_000_000;

/// One container on the GPU, as the daemon knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    /// Orders the turns; unique per container on the node.
    pub key: u64,
    /// Its SM limit on this GPU, from its runtime spec (`None`: none).
    pub limit: Option<SmLimit>,
    /// Its priority's rank (`rank_of`), from its runtime spec (`None`: no
    /// spec: neither holds nor is held).
    pub rank: Option<u32>,
    /// What its hook states about its activity here.
    pub own: OwnWords,
    /// The kernel's view (NVML) supports its statement now: it used the
    /// GPU lately.
    pub confirmed: bool,
}

impl Seat {
    /// Its statement, with instants no honest hook writes by `now` voided.
    fn stated(&self, now: u64) -> OwnWords {
        let horizon = now.saturating_add(FUTURE_SLACK_NS);
        let ok = |t: u64| if t > horizon { 0 } else { t };
        OwnWords {
            launched: ok(self.own.launched),
            wants: ok(self.own.wants),
            // Work in flight holds others at most a frame from now.
            inflight_until: self.own.inflight_until.min(now.saturating_add(FRAME_NS)),
        }
    }

    /// It launched within `ns` before `now`, as the kernel confirms.
    fn launched_within(&self, now: u64, ns: u64) -> Option<u64> {
        let l = self.stated(now).launched;
        (self.confirmed && l != 0 && now.saturating_sub(l) <= ns).then_some(l)
    }
}

/// The plan of every seat, in order, as of `now`.
pub fn decide(seats: &[Seat], now: u64) -> Vec<PlanWords> {
    let wanting: Vec<(u64, u32)> = seats
        .iter()
        .filter_map(|s| {
            let limit = s.limit?;
            let w = s.stated(now).wants;
            (s.confirmed && w != 0 && now.saturating_sub(w) <= ACTIVE_NS)
                .then(|| (s.key, limit.percent()))
        })
        .collect();
    seats
        .iter()
        .map(|m| {
            let mut w = PlanWords {
                planned_until: now.saturating_add(PLAN_TTL_NS),
                turn: super::encode_turn(plan(&wanting, m.key)),
                ..PlanWords::default()
            };
            let Some(mine) = m.rank else {
                return w;
            };
            for h in seats {
                if h.key == m.key || h.rank.is_none_or(|r| r >= mine) {
                    continue;
                }
                if let Some(l) = h.launched_within(now, HOLD_NS) {
                    w.hold_until = w.hold_until.max(l.saturating_add(HOLD_NS));
                    let inflight = h.stated(now).inflight_until;
                    if inflight > now {
                        w.high_inflight_until = w.high_inflight_until.max(inflight);
                    }
                }
                if let Some(l) = h.launched_within(now, MONITOR_LAG_NS) {
                    w.outranked_until = w.outranked_until.max(l.saturating_add(MONITOR_LAG_NS));
                }
            }
            w
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{decode_turn, rank_of};
    use crate::region::rules::sm_limit;

    const MS: u64 = 1_000_000;
    const NOW: u64 = 1_000_000 * MS;

    fn seat(key: u64, limit: u64, priority: Option<i32>) -> Seat {
        Seat {
            key,
            limit: sm_limit(limit),
            rank: priority.map(rank_of),
            own: OwnWords::default(),
            confirmed: true,
        }
    }

    #[test]
    fn limited_containers_that_want_their_share_take_turns() {
        let mut a = seat(1, 30, Some(1));
        let mut b = seat(2, 70, Some(1));
        let c = seat(3, 100, Some(1));
        a.own.wants = NOW - 10 * MS;
        b.own.wants = NOW - 10 * MS;
        let p = decide(&[a, b, c], NOW);
        assert_eq!(decode_turn(p[0].turn).map(|t| t.len), Some(15 * MS));
        assert_eq!(decode_turn(p[1].turn).map(|t| t.start), Some(15 * MS));
        assert_eq!(p[2].turn, 0, "no limit, no turn");
        assert!(p.iter().all(|w| w.planned_until == NOW + PLAN_TTL_NS));
        // Wanting long ago, or unconfirmed by NVML: out of the plan.
        b.own.wants = NOW - ACTIVE_NS - 1;
        assert_eq!(decide(&[a, b], NOW)[0].turn, 0);
        b.own.wants = NOW;
        b.confirmed = false;
        assert_eq!(decide(&[a, b], NOW)[0].turn, 0);
    }

    #[test]
    fn a_lower_priority_is_held_while_a_higher_one_launches() {
        let mut svc = seat(1, 100, Some(0));
        let trainer = seat(2, 100, Some(1));
        let nospec = seat(3, 100, None);
        svc.own.launched = NOW - 5 * MS;
        svc.own.inflight_until = NOW + 2 * MS;
        let p = decide(&[svc, trainer, nospec], NOW);
        assert_eq!(p[1].hold_until, NOW - 5 * MS + HOLD_NS);
        assert_eq!(p[1].high_inflight_until, NOW + 2 * MS);
        assert_eq!(p[1].outranked_until, NOW - 5 * MS + MONITOR_LAG_NS);
        assert_eq!(p[0].hold_until, 0, "nothing above the service");
        assert_eq!(
            p[2],
            PlanWords {
                planned_until: NOW + PLAN_TTL_NS,
                ..PlanWords::default()
            }
        );
        // Quiet for longer than the hold: nothing held.
        svc.own.launched = NOW - HOLD_NS - 1;
        assert_eq!(decide(&[svc, trainer], NOW)[1].hold_until, 0);
        // Equal priorities hold nothing.
        let mut peer = seat(1, 100, Some(1));
        peer.own.launched = NOW;
        assert_eq!(decide(&[peer, trainer], NOW)[1].hold_until, 0);
    }

    /// A statement the kernel does not support, or that no honest hook
    /// writes, holds nobody: an idle service saying it launched, instants
    /// far ahead, work "in flight" for ever.
    #[test]
    fn a_forged_statement_holds_at_most_what_the_kernel_supports() {
        let trainer = seat(2, 100, Some(1));
        let mut svc = seat(1, 100, Some(0));
        svc.own.launched = NOW;
        svc.own.inflight_until = u64::MAX;
        svc.confirmed = false;
        let p = decide(&[svc, trainer], NOW);
        assert_eq!((p[1].hold_until, p[1].outranked_until), (0, 0));
        svc.confirmed = true;
        let p = decide(&[svc, trainer], NOW);
        assert_eq!(p[1].high_inflight_until, NOW + FRAME_NS);
        svc.own.launched = NOW + FUTURE_SLACK_NS + 1;
        let p = decide(&[svc, trainer], NOW);
        assert_eq!((p[1].hold_until, p[1].high_inflight_until), (0, 0));
        let mut a = seat(3, 30, Some(1));
        a.own.wants = u64::MAX;
        let mut b = seat(4, 70, Some(1));
        b.own.wants = NOW;
        assert_eq!(decide(&[a, b], NOW)[1].turn, 0, "a forged want is no want");
    }
}
