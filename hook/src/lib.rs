//! libvgpu.so: the CUDA/NVML interposer (see docs/hook.md).
//!
//! Layers: `ffi` (C types) → `real` (the real libraries, typed pointers) →
//! `exports` (the generated `extern "C"` symbols, `dlsym`) → policy
//! (`memory`, `nvml`, `procaddr`, `launch`, `sm`) over `region` and `state`.

#[macro_use]
mod log;
#[macro_use]
pub(crate) mod real;

pub(crate) mod config;
pub(crate) mod exports;
pub(crate) mod ffi;
mod launch;
pub(crate) mod mapguard;
mod memory;
mod nvml;
mod procaddr;
pub(crate) mod region;
mod signal;
pub(crate) mod sm;
pub(crate) mod state;
mod suspend;
