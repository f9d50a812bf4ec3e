//! The SM limiter's tuned constants, each with the reason for its value.

/// The turns' frame, and the longest debt a single settlement may create:
/// what a latency-bound tenant may wait at worst for a wrongly learnt cost.
pub const FRAME_NS: u64 = vgpu_common::node::FRAME_NS;

/// A lower-priority container's queued GPU work while a higher one is
/// active: what a request of the higher one may find ahead of it on a
/// time-sliced GPU. Two or three 4096² bf16 matmuls on an H100; short
/// enough for a service's p99 to stay within 1.5× of its time alone, long
/// enough that the held container's host, woken each time, keeps the GPU
/// busy.
pub const LOW_QUEUE_NS: u64 = 500_000;

/// The longest a lower-priority launch waits for a higher one's work in
/// flight, before it goes with its short queue anyway: a high-priority
/// container that keeps the GPU busy must not starve the low one.
pub const YIELD_MAX_NS: u64 = FRAME_NS;

/// A higher-priority container holds the lower ones while it launched
/// within this long: less than a frame (the re-plan period added), so a
/// service that stops gives the GPU back within a frame, and more than its
/// gaps between requests (20 ms for a 50-request/s service).
pub const HOLD_NS: u64 = FRAME_NS - super::control::REPLAN_NS;

/// What a GPU's switch between two contexts' work may take, at most,
/// beyond the work itself (an allowance: Hopper time-slices contexts with
/// its compute preemption; tens of µs are typical).
pub const CONTEXT_SWITCH_NS: u64 = 300_000;

/// A higher-priority container's launch is in flight from its launch until
/// at least this long after it (plus its learnt cost): its work starts at
/// the latest once the lower ones' queues (`LOW_QUEUE_NS`) have drained
/// and the GPU has switched contexts. Its costs alone would release the
/// lower ones before that, and a context that keeps getting work keeps the
/// GPU until its time slice ends.
pub const HIGH_START_NS: u64 = LOW_QUEUE_NS + CONTEXT_SWITCH_NS;
