//! The SM limiter's tuned constants, each with the reason for its value.

/// The turns' frame, and the longest debt a single settlement may create:
/// what a latency-bound tenant may wait at worst for a wrongly learnt cost.
pub const FRAME_NS: u64 = vgpu_common::node::FRAME_NS;
