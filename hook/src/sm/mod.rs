//! The SM (compute) limiter's hook point. Every launch entry point calls
//! [`before_launch`] before forwarding to the driver; the limiter (added
//! later, in this module) decides there whether to wait. It must stay cheap
//! when nothing is throttled: no lock, no syscall.
//!
//! The device of a launch, when needed, is `crate::memory::driver::Real`'s
//! `current_device()` (one driver call) or the stream's context.

use crate::ffi::CUstream;

/// Which launch entry point was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchKind {
    /// `cuLaunchKernel`.
    Kernel,
    /// `cuLaunchKernelEx` (grid from `CUlaunchConfig`).
    KernelEx,
    /// `cuLaunchCooperativeKernel`.
    Cooperative,
    /// `cuGraphLaunch` (grid unknown: 0).
    Graph,
}

/// One launch as the limiter sees it.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub kind: LaunchKind,
    pub stream: CUstream,
    /// `gridX * gridY * gridZ`, 0 when unknown.
    pub blocks: u64,
    /// The `_ptsz` (per-thread default stream) variant was called.
    pub per_thread: bool,
}

/// Called before every launch. No-op until the SM limiter lands.
#[inline]
pub fn before_launch(_launch: &Launch) {}
