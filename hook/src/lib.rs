//! libvgpu.so: the CUDA/NVML interposer (see docs/hook.md).
//!
//! Layers: `ffi` (C types) → `real` (the real libraries, typed pointers) →
//! `exports` (the generated `extern "C"` symbols, `dlsym`) → policy
//! (`memory`, `nvml`, `procaddr`, `launch`, `sm`) over `region` and `state`.

#[macro_use]
mod log;
#[macro_use]
pub mod real;

pub mod config;
pub mod exports;
pub mod ffi;
mod launch;
pub mod mapguard;
mod memory;
mod nvml;
mod procaddr;
pub mod region;
pub mod sm;
pub mod state;
mod suspend;
