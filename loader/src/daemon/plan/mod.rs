//! The node's plan of turns and priority holds (docs/sm-limit.md, "Time
//! division between containers" and "Priority"), made here and nowhere
//! else: hooks of different containers never read each other's words.
//!
//! - [`roster`]: at each scan, the containers the daemon tracks, with what
//!   no tenant can forge about them (their SM limits and priority from the
//!   runtime spec, which pids NVML saw use which GPU) and their sidecars,
//!   opened without following a link;
//! - [`planner`]: a thread that, every few ms (every 200 µs while a hold is
//!   on, to pass a higher container's work in flight on quickly), reads
//!   each container's own statement of its activity, decides with
//!   `vgpu_common::node::decide`, and writes each container its plan
//!   through `daemon::apply::plan`, into its own sidecar only. It also
//!   leaves `turns.json` in the state directory for `vgpu turns`.

pub mod planner;
pub mod roster;
pub mod witness;

/// `vgpu turns` reads the planner's last view here, in the state directory.
pub const TURNS_FILE: &str = "turns.json";

/// The planner's last view, as `turns.json` holds it (`vgpu turns`).
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct Report {
    /// Unix ms when written.
    pub at_unix_ms: u64,
    pub frame_ms: u64,
    pub gpus: Vec<GpuReport>,
}

/// One GPU's seats.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct GpuReport {
    pub uuid: String,
    pub seats: Vec<SeatReport>,
}

/// One container on the GPU.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct SeatReport {
    /// The first 12 characters of its container id.
    pub container: String,
    /// Its CUDA ordinal for this GPU.
    pub ordinal: usize,
    pub sm_limit: Option<u32>,
    pub priority: u32,
    /// The kernel's view supports its statement.
    pub confirmed: bool,
    /// It launched within the hold's span.
    pub launching: bool,
    /// Its turn, ms into the frame.
    pub turn_ms: Option<[f64; 2]>,
    /// Held for a container of higher priority.
    pub held: bool,
}
