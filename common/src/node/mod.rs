//! The node's plan of turns and priority holds on each GPU, which `vgpu
//! daemon` makes and writes into each container's own sidecar
//! (`crate::sidecar::DevPlan`; docs/sm-limit.md, "Time division between
//! containers" and "Priority").
//!
//! No hook reads anything another container can write: the daemon decides
//! from what no tenant can forge (each container's SM limit and priority in
//! its runtime spec, its GPU use as NVML sees it), with each container's own
//! statement of its activity (its sidecar's second plan line) only making
//! the plan react sooner, never holding a neighbour longer than NVML
//! supports. The rules the daemon and the hook must agree on are here.

mod decide;
mod plan;

pub use decide::{decide, Seat, FUTURE_SLACK_NS};
pub use plan::{decode_turn, encode_turn, plan, Phase, ACTIVE_NS, FRAME_NS};

/// A higher-priority container holds the lower ones while it launched
/// within this long: less than a frame (the hook's re-plan period added),
/// so a service that stops gives the GPU back within a frame, and more
/// than its gaps between requests (20 ms for a 50-request/s service).
pub const HOLD_NS: u64 = FRAME_NS - 10_000_000;

/// How long after a higher-priority container's last launch a block by
/// HAMi's monitor may still be about it: the monitor decays `recent_kernel`
/// 2 → 1 → 0 over two 5 s ticks before it unblocks, plus a tick of slack.
pub const MONITOR_LAG_NS: u64 = 15_000_000_000;

/// How long a plan stands once written: the daemon re-writes it well
/// within this, so a plan past it means the daemon is gone, and the
/// container goes back to its own SM limit alone.
pub const PLAN_TTL_NS: u64 = 1_000_000_000;

/// The `rank` of HAMi priority `priority` (0 high, 1 low): priority + 1,
/// smaller is higher.
pub fn rank_of(priority: i32) -> u32 {
    priority.clamp(0, 1_000) as u32 + 1
}
