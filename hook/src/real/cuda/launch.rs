//! Kernel and graph launches, forwarded as the application made them.

use std::ffi::{c_uint, c_void};

use super::{sym, CuError};
use crate::ffi::*;

/// `cuLaunchKernel`, forwarded with the application's arguments.
#[doc(alias = "cuLaunchKernel")]
pub fn kernel(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchKernel) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
    // SAFETY: the function, stream, `params` and `extra` are the
    // application's arguments of this very launch, passed unchanged.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

/// `cuLaunchKernel_ptsz`, forwarded with the application's arguments.
#[doc(alias = "cuLaunchKernel_ptsz")]
pub fn kernel_ptsz(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchKernel_ptsz) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
    // SAFETY: as in `kernel`.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

/// `cuLaunchCooperativeKernel`, forwarded with the application's arguments.
#[doc(alias = "cuLaunchCooperativeKernel")]
pub fn cooperative(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchCooperativeKernel) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
    // SAFETY: the function, stream and `params` are the application's
    // arguments of this very launch, passed unchanged.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

/// `cuLaunchCooperativeKernel_ptsz`, forwarded with the application's
/// arguments.
#[doc(alias = "cuLaunchCooperativeKernel_ptsz")]
pub fn cooperative_ptsz(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchCooperativeKernel_ptsz) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
    // SAFETY: as in `cooperative`.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

/// `cuLaunchKernelEx`, forwarded with the application's arguments.
#[doc(alias = "cuLaunchKernelEx")]
pub fn kernel_ex(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchKernelEx) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `config`, the function, `params` and `extra` are the
    // application's arguments of this very launch, passed unchanged.
    unsafe { real(config, f, params, extra) }
}

/// `cuLaunchKernelEx_ptsz`, forwarded with the application's arguments.
#[doc(alias = "cuLaunchKernelEx_ptsz")]
pub fn kernel_ex_ptsz(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let Ok(real) = sym(|t| t.cuLaunchKernelEx_ptsz) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: as in `kernel_ex`.
    unsafe { real(config, f, params, extra) }
}

/// `cuGraphLaunch`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuGraphLaunch")]
pub fn graph(exec: CUgraphExec, stream: CUstream) -> Result<(), CuError> {
    let real = sym(|t| t.cuGraphLaunch)?;
    // SAFETY: the application's graph and stream handles by value; the
    // driver validates both.
    CuError::result(unsafe { real(exec, stream) })
}

/// `cuGraphLaunch_ptsz`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuGraphLaunch_ptsz")]
pub fn graph_ptsz(exec: CUgraphExec, stream: CUstream) -> Result<(), CuError> {
    let real = sym(|t| t.cuGraphLaunch_ptsz)?;
    // SAFETY: as in `graph`.
    CuError::result(unsafe { real(exec, stream) })
}
