//! libvgpu.so: the CUDA/NVML interposer (see docs/hook.md).
//!
//! Layers: `ffi` (C types, safe readers of application structs) → `real`
//! (the real libraries, typed pointers, and the safe wrappers that return
//! `Result<_, CuError>` / `Result<_, NvmlError>`) → `driver` (what the hook
//! asks the driver on its own behalf, as traits with one real implementation
//! over `real` and a fake for unit tests) and `world` (the outside world
//! besides the driver: clocks, this process's identity, the node's files,
//! background work; one real implementation, one fake with the one test
//! clock) → `exports` (the generated `extern "C"` symbols, `dlsym`) →
//! policy (`memory`, `nvml`, `procaddr`, `launch`, `devices`, `sm`) over
//! `region` and `state`. Every policy module is `#![forbid(unsafe_code)]`
//! (`cargo xtask lint` checks the list), `driver` and `world` included.
//! Only `real` and `exports` call the driver raw,
//! and only they and `driver::native` name `real` (`cargo xtask lint`): each
//! export hands its policy function the call that forwards it.
//! `sidecar` is the container's second shared file (measured context sizes,
//! the limiter's buckets), mapped like the node tables through
//! `sigbus_guard::shared`.

#[macro_use]
mod log;
#[macro_use]
pub(crate) mod real;

pub(crate) mod config;
mod devices;
mod driver;
pub(crate) mod exports;
pub(crate) mod ffi;
mod launch;
mod memory;
mod nvml;
mod procaddr;
pub(crate) mod region;
mod sidecar;
pub(crate) mod sigbus_guard;
mod signal;
pub(crate) mod sm;
pub(crate) mod state;
mod suspend;
pub(crate) mod world;
