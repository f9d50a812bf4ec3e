//! The SM limiter's tuned constants, each with the reason for its value.

#![forbid(unsafe_code)]

/// The turns' frame, and the longest debt a single settlement may create:
/// what a latency-bound tenant may wait at worst for a wrongly learnt cost.
pub const FRAME_NS: u64 = vgpu_common::node::FRAME_NS;

/// A lower-priority container's queued GPU work while a higher one is
/// active: what a request of the higher one may find ahead of it on a
/// time-sliced GPU: a few large matmuls' worth (docs/benchmarks.md, "a
/// latency-bound service beside a trainer"). Short enough for a service's
/// p99 to stay within 1.5× of its time alone, long enough that the held
/// container's host, woken each time, keeps the GPU busy.
pub const LOW_QUEUE_NS: u64 = 500_000;

/// The longest a lower-priority launch waits for a higher one's work in
/// flight, before it goes with its short queue anyway: a high-priority
/// container that keeps the GPU busy must not starve the low one.
pub const YIELD_MAX_NS: u64 = FRAME_NS;

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

// `bucket.rs`
/// Wall time the bucket can hold on a host that wakes on time: bursts stay
/// within `DEPTH × limit` of GPU time, and a sleep that overshoots by less
/// than this (less the batch) loses nothing.
pub const DEPTH_NS: u64 = 4_000_000;

/// The depth on a host that wakes late is `DEPTH_NS + LATE_MARGIN ×` the
/// moving average of the sleeps' overshoot, weighted `1 / LATE_AVG_DIV`
/// per sleep: twice the average keeps what most late wake-ups were owed,
/// and a quarter per sleep follows a host that turns slow within a few
/// sleeps without trusting one.
pub const LATE_MARGIN: u64 = 2;

pub const LATE_AVG_DIV: u64 = 4;

/// The deepest the bucket gets on a host that wakes late (`Depth`).
pub const MAX_DEPTH_NS: u64 = 50_000_000;

/// A launch is admitted up to this long before its turn, so the GPU has
/// work queued when the host thread is late to wake (a loaded machine); it
/// adds `LEAD × limit` to the burst, nothing to the rate.
pub const LEAD_NS: u64 = 1_000_000;

/// An empty bucket is waited on until it holds this much more wall time
/// than one launch needs, so a throttled container is admitted a batch of
/// launches per wake-up instead of one: fewer host wake-ups, and on a device
/// time-sliced between containers, fewer context switches (each one costs
/// the device time that no container gets). The rate is unchanged.
pub const BATCH_NS: u64 = 2_000_000;

// The launch path (`control.rs`, `settings.rs`, `learn.rs`, `publish.rs`)
/// How often the region's settings are re-read on the launch path: an
/// admin's change takes effect within it, and the region's cache line is
/// read at most 20 times a second.
pub const REFRESH_NS: u64 = 50_000_000;

/// How often the process's share is published into its slot: HAMi's
/// monitor samples once a second.
pub const PUBLISH_NS: u64 = 1_000_000_000;

/// Longest single sleep while throttled: settings are re-read after it,
/// so a raised limit or a lifted block is seen within it.
pub const MAX_SLEEP_NS: u64 = 100_000_000;

/// Sleep step while the monitor blocks the container: HAMi's monitor
/// decides on a 5 s tick, so 100 ms costs nothing in reaction.
pub const BLOCK_SLEEP_NS: u64 = 100_000_000;

/// Timed launches in flight at most: bounds the events held and the
/// poll's work; at one sample per key per 4 ms, more is never needed.
pub const MAX_PENDING: usize = 32;

/// Event pairs kept per context for reuse (as many as can be in flight).
pub const EVENT_POOL: usize = 32;

/// Finished timings collected per poll: a few driver queries, so a
/// launch that polls is not delayed by a backlog.
pub const POLL_MAX: usize = 4;

/// Entries of each thread's cache of costs (`cost_learning::thread_cache`): a launch loop's
/// distinct kernels usually fit; a miss only takes the table's lock.
pub const CACHE_SLOTS: usize = 8;

/// Finished timings are collected at most this often (a driver call
/// each): well under the sampling gap, so no timing waits long.
pub const POLL_NS: u64 = 500_000;

/// How often an accounted process re-reads the daemon's plan (`phase`) and
/// states its activity in its plan line: a fifth of a frame, so a plan
/// change is seen within the frame it starts in.
pub const REPLAN_NS: u64 = 10_000_000;

/// A leader holds the loop this long without renewing it: a few periods,
/// so a leader that exits is replaced within two seconds.
pub const LEASE_NS: u64 = 4 * PERIOD_NS;

/// While the leader measured this recently, it publishes `sm_util` (two
/// publishing periods: one missed step does not hand it back).
pub const MEASURED_FRESH_NS: u64 = 2 * PUBLISH_NS;

// `cost.rs`
/// Cost of a launch on a device nothing was learnt about yet: a short
/// kernel's time; what it was wrong by is settled once the cost is agreed.
pub const DEFAULT_COST_NS: u64 = 20_000;

/// Samples every key gets before sampling becomes occasional: enough for
/// `AGREE` and a few more, so the first estimate is soon refined.
pub const EARLY_SAMPLES: u32 = 6;

/// Samples whose minimum first replaces the guess. The first launch of a
/// key finds its stream idle, so its start event completes at once and
/// its timing holds whatever other contexts had queued on the device
/// (a killed saturating process left 50 ms and more); the next launches
/// are queued behind it in the stream and are timed from its end.
pub const AGREE: u32 = 3;

/// After that, one launch in this many is timed...
pub const SAMPLE_EVERY: u64 = 64;

/// ...and at most one per key in this long: a launch-bound loop issues
/// ~100,000 launches/s, and each timing costs two `cuEventRecord`s and a
/// query (about 1 % of such a loop's rate at one in 64). A window of
/// samples still spans well under the feedback period.
pub const SAMPLE_GAP_NS: u64 = 4_000_000;

/// Samples per re-estimation window: at one per 4 ms at least 128 ms, long
/// enough that a neighbour's burst delays a few samples, never all.
pub const COST_WINDOW: u32 = 32;

/// An unseen key is charged the device's running average of agreed
/// estimates, each new one weighted `1 / FALLBACK_WEIGHT`: it follows the
/// application's current mix of kernels within a few keys, and no single
/// key decides it.
pub const FALLBACK_WEIGHT: u64 = 8;

/// Keys kept before the table is cleared (a process generating unbounded
/// distinct grids must not grow memory without bound).
pub const MAX_KEYS: usize = 8192;

// `demand.rs`
/// The window the use is measured over: several turns (a 50 ms frame), so
/// one turn's gaps do not decide it.
pub const DEMAND_WINDOW_NS: u64 = 100_000_000;

/// Using at least this fraction of its share, a container wants it: a busy
/// container reaches more than 0.8 of its share even when the GPU
/// time-slices it with a neighbour, while a launch-bound loop of tiny
/// kernels or a service between requests stays far below (docs/benchmarks.md,
/// "containers taking turns", has the figures this threshold sits between).
pub const WANT_FRACTION: f64 = 0.7;

// `feedback.rs`, `correction.rs`
/// How often the loop runs (at most): NVML's device counter is sampled
/// every 1/6 s, so a period holds a few samples, and the loop still
/// corrects within seconds.
pub const PERIOD_NS: u64 = 500_000_000;

/// No limited launch for this long (no call in between): re-baseline, do
/// not step.
pub const MAX_GAP_NS: u64 = 2 * PERIOD_NS;

/// The measurement window while another container shares the device. The
/// split then comes from NVML's per-process samples, which the driver takes
/// about once a second per process, each swinging ±15 points around the
/// process's share (docs/benchmarks.md): half a second can hold a sample
/// of one process and none of the other's, giving one all the device.
/// Non-overlapping windows keep the loop's delay at one step, so the step
/// stays stable; a smaller step (`K_SHARED`) averages over several.
pub const SHARED_PERIOD_NS: u64 = 16 * PERIOD_NS;

/// Bounds of the correction factor: the errors seen are ±2.5× (a tiny
/// kernel's timing holding its launch latency); a factor beyond 4× would
/// be a broken measurement, not a cost error.
pub const FACTOR_MIN: f64 = 0.25;

pub const FACTOR_MAX: f64 = 4.0;

/// Fraction of the log-error corrected per period: with one period of
/// delay in the measurement, half converges without overshoot.
pub const FEEDBACK_K: f64 = 0.5;

/// The same, per window, when the reading is a split of a shared device
/// (noisier: each sample swings ±15 points).
pub const FEEDBACK_K_SHARED: f64 = 0.3;

/// Largest factor applied in one period: a lost NVML sample (a zero
/// reading) moves the correction by a third at most.
pub const FEEDBACK_MAX_STEP: f64 = 1.5;

/// |measured / charged − 1| below this: hold (NVML's percent is an integer
/// and its samples jitter by about this much).
pub const DEAD_BAND: f64 = 0.02;

/// Charged less than this percent of the period: too little work to learn
/// from (an idle or nearly idle container).
pub const MIN_CHARGED: f64 = 1.0;

// `turns.rs`, `correction.rs`
/// A turn's measure is believed while the factor it implies (the current
/// one times the turn's GPU time over its charges) is within these bounds:
/// outside them it is no cost error but a turn that was not what it seemed
/// (charged guesses, a neighbour's late start).
pub const TURN_RATIO_MIN: f64 = 0.5;

pub const TURN_RATIO_MAX: f64 = 2.0;

/// A burst charged less than this says too little (a few kernels' event
/// jitter would be a large part of it).
pub const MIN_BURST_NS: u64 = 1_000_000;

/// A turn whose queue runs dry within its first launches is measured from
/// the launch after the stall: the first launch after a context switch can
/// take a while in the driver.
pub const RESTART_WITHIN: u64 = 8;

/// |measured / charged − 1| of a turn below this: hold (event jitter).
pub const TURN_DEAD_BAND: f64 = 0.01;

/// The turns' debug report comes at most this often.
pub const TURN_REPORT_NS: u64 = 1_000_000_000;

/// Fraction of the log-error corrected per measured turn: turns come 20
/// times a second, so half a step is fast and smooths one turn's noise.
pub const TURN_K: f64 = 0.5;

// `phase.rs`
/// Admitted work must be due to finish this long before its phase ends: the
/// launch reaches the GPU a few µs after it is admitted.
pub const GUARD_NS: u64 = 300_000;

/// Work longer than a whole phase goes alone when the phase is at most
/// `1 / ALONE_WITHIN_DIV` gone: early enough that most of it runs in the
/// phase, so it still makes progress without taking the next one.
pub const ALONE_WITHIN_DIV: u64 = 4;

// `prio.rs`
/// Shortest wait for the own queue to drain: about a host wake-up.
pub const MIN_WAIT_NS: u64 = 20_000;

/// Marker events kept for reuse: a held container's launches in flight
/// within its short queue, with room to spare.
pub const MARK_POOL: usize = 64;

// `mod.rs`
/// How often the background thread looks for a feedback step due: a tenth
/// of the period, so a due step waits at most that long.
pub const BACKGROUND_NS: u64 = PERIOD_NS / 10;

// `coast.rs`
/// A coasting window: launches of known cost go uncharged on the bucket
/// this long at most, then one launch is admitted in full, which charges
/// what they owe and measures the container's rate. A fifth of a frame: the
/// coarse clock's tick (1–4 ms) is well inside it, and a container whose
/// use grows is back on the bucket within it.
pub const COAST_WINDOW_NS: u64 = 10_000_000;

/// A container coasts while its charged rate over the last window is under
/// this fraction of its limit, and each window's coasted charges stay
/// under this fraction of the window at the limit: the limit is then at
/// least a quarter away, and the bucket, when it takes over, starts with
/// room for the burst a window could have held.
pub const COAST_BELOW: f64 = 0.75;
