//! Launch entry points: each calls the SM limiter's hook point
//! (`sm::before_launch`) and forwards.

use std::ffi::{c_uint, c_void};

use crate::ffi::*;
use crate::sm::{before_launch, Launch, LaunchKind};

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

fn launch(kind: LaunchKind, stream: CUstream, blocks: u64, per_thread: bool) {
    before_launch(&Launch {
        kind,
        stream,
        blocks,
        per_thread,
    });
}

/// `CUlaunchConfig`: grid and stream of `cuLaunchKernelEx`.
#[derive(Clone, Copy)]
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
}

fn ex(config: *const c_void, per_thread: bool) {
    let (stream, b) = read(config as *const LaunchConfig).map_or((std::ptr::null_mut(), 0), |c| {
        (c.stream, blocks(c.grid[0], c.grid[1], c.grid[2]))
    });
    launch(LaunchKind::KernelEx, stream, b, per_thread);
}

#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of cuLaunchKernel"
)]
pub fn launch_kernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch(LaunchKind::Kernel, stream, blocks(gx, gy, gz), false);
    real_cuda!(cuLaunchKernel(
        f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra
    ))
}

#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of cuLaunchKernel_ptsz"
)]
pub fn launch_kernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch(LaunchKind::Kernel, stream, blocks(gx, gy, gz), true);
    real_cuda!(cuLaunchKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra
    ))
}

pub fn launch_kernel_ex(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ex(config, false);
    real_cuda!(cuLaunchKernelEx(config, f, params, extra))
}

pub fn launch_kernel_ex_ptsz(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ex(config, true);
    real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra))
}

#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of cuLaunchCooperativeKernel"
)]
pub fn launch_cooperative(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    launch(LaunchKind::Cooperative, stream, blocks(gx, gy, gz), false);
    real_cuda!(cuLaunchCooperativeKernel(
        f, gx, gy, gz, bx, by, bz, shmem, stream, params
    ))
}

#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of cuLaunchCooperativeKernel_ptsz"
)]
pub fn launch_cooperative_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    launch(LaunchKind::Cooperative, stream, blocks(gx, gy, gz), true);
    real_cuda!(cuLaunchCooperativeKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shmem, stream, params
    ))
}

pub fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launch(LaunchKind::Graph, stream, 0, false);
    real_cuda!(cuGraphLaunch(exec, stream))
}

pub fn graph_launch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launch(LaunchKind::Graph, stream, 0, true);
    real_cuda!(cuGraphLaunch_ptsz(exec, stream))
}
