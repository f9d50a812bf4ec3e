//! The simulated GPU driver core.
//!
//! This crate holds everything the simulated `libcuda.so.1` (`simgpu-cuda`) and
//! `libnvidia-ml.so.1` (`simgpu-nvml`) share, plus the `simgpu-server` binary:
//!
//! - [`config`]: the `SIMGPU_*` environment variables;
//! - [`shm`]: the fixed layout of the shared state file (`$SIMGPU_DIR/state`);
//! - [`lock`]: the cross-process lock over that file (safe against SIGKILL);
//! - [`memory`]: device-memory reservation against capacity;
//! - [`timeline`]: the device's kernel queue and busy intervals (utilization);
//! - [`model`]: the kernel-duration model;
//! - [`client`] / [`spawn`] / [`proto`]: registration with the server, which
//!   is started on demand;
//! - [`server`]: the server loop (host PIDs via `SO_PEERCRED`, cleanup when a
//!   process exits);
//! - [`pids`]: PID-namespace detection;
//! - [`clock`]: shared `CLOCK_MONOTONIC` time and sleeping until a deadline.
//!
//! See `docs/simgpu.md` for the model and every variable.

pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod lock;
pub mod memory;
pub mod model;
pub mod pids;
pub mod proto;
pub mod server;
pub mod shm;
pub mod spawn;
pub mod timeline;

pub use error::SimError;
