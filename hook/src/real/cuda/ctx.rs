//! Contexts the hook asks about or takes back on its own behalf: the
//! current context and its device, the destroy and primary release that
//! undo a context it could not count. The context calls the entry points
//! forward are made by the exports themselves.

use super::{sym, CuError};
use crate::ffi::*;

/// The calling thread's current context (NULL: none).
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuCtxGetCurrent")]
pub fn current() -> Result<CUcontext, CuError> {
    let f = sym(|t| t.cuCtxGetCurrent)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a live local the driver writes one handle to.
    CuError::result(unsafe { f(&mut ctx) })?;
    Ok(ctx)
}

/// The CUDA ordinal of the current context's device.
///
/// # Errors
/// The driver's code (`CUDA_ERROR_INVALID_CONTEXT` without a context).
#[doc(alias = "cuCtxGetDevice")]
pub fn device() -> Result<CUdevice, CuError> {
    let f = sym(|t| t.cuCtxGetDevice)?;
    let mut dev: CUdevice = -1;
    // SAFETY: `dev` is a live local the driver writes one CUdevice to.
    CuError::result(unsafe { f(&mut dev) })?;
    Ok(dev)
}

/// `cuCtxDestroy_v2`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuCtxDestroy_v2")]
pub fn destroy(ctx: CUcontext) -> Result<(), CuError> {
    let f = sym(|t| t.cuCtxDestroy_v2)?;
    // SAFETY: a context handle (the application's, or one the driver just
    // returned), passed by value; the driver validates handles.
    CuError::result(unsafe { f(ctx) })
}

/// `cuDevicePrimaryCtxRelease_v2`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDevicePrimaryCtxRelease_v2")]
pub fn primary_release(dev: CUdevice) -> Result<(), CuError> {
    let f = sym(|t| t.cuDevicePrimaryCtxRelease_v2)?;
    // SAFETY: plain value argument.
    CuError::result(unsafe { f(dev) })
}
