//! Contexts: `cuInit`, the current context, context creation and
//! destruction, primary contexts.

use std::ffi::{c_int, c_uint, c_void};

use super::{sym, CuError};
use crate::ffi::*;

/// `cuInit`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuInit")]
pub fn init(flags: c_uint) -> Result<(), CuError> {
    let f = sym(|t| t.cuInit)?;
    // SAFETY: plain value argument.
    CuError::result(unsafe { f(flags) })
}

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

/// `cuCtxCreate_v2`, forwarded with the application's out-pointer.
#[doc(alias = "cuCtxCreate_v2")]
pub fn create_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let Ok(f) = sym(|t| t.cuCtxCreate_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `ctx` is the application's out-pointer of this very call,
    // passed unchanged (valid or NULL per the C API; the driver checks NULL).
    unsafe { f(ctx, flags, dev) }
}

/// `cuCtxCreate_v3`, forwarded with the application's pointers.
#[doc(alias = "cuCtxCreate_v3")]
pub fn create_v3(
    ctx: *mut CUcontext,
    params: *mut c_void,
    nparams: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuCtxCreate_v3) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `ctx` and `params` (with its count) are the application's
    // arguments of this very call, passed unchanged.
    unsafe { f(ctx, params, nparams, flags, dev) }
}

/// `cuCtxCreate_v4`, forwarded with the application's pointers.
#[doc(alias = "cuCtxCreate_v4")]
pub fn create_v4(
    ctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuCtxCreate_v4) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `ctx` and `params` are the application's arguments of this
    // very call, passed unchanged.
    unsafe { f(ctx, params, flags, dev) }
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

/// `cuDevicePrimaryCtxRetain`, forwarded with the application's out-pointer.
#[doc(alias = "cuDevicePrimaryCtxRetain")]
pub fn primary_retain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let Ok(f) = sym(|t| t.cuDevicePrimaryCtxRetain) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `ctx` is the application's out-pointer of this very call,
    // passed unchanged.
    unsafe { f(ctx, dev) }
}

/// `cuDevicePrimaryCtxRelease` (v1).
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDevicePrimaryCtxRelease")]
pub fn primary_release_v1(dev: CUdevice) -> Result<(), CuError> {
    let f = sym(|t| t.cuDevicePrimaryCtxRelease)?;
    // SAFETY: plain value argument.
    CuError::result(unsafe { f(dev) })
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

/// `cuDevicePrimaryCtxReset` (v1).
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDevicePrimaryCtxReset")]
pub fn primary_reset_v1(dev: CUdevice) -> Result<(), CuError> {
    let f = sym(|t| t.cuDevicePrimaryCtxReset)?;
    // SAFETY: plain value argument.
    CuError::result(unsafe { f(dev) })
}

/// `cuDevicePrimaryCtxReset_v2`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDevicePrimaryCtxReset_v2")]
pub fn primary_reset(dev: CUdevice) -> Result<(), CuError> {
    let f = sym(|t| t.cuDevicePrimaryCtxReset_v2)?;
    // SAFETY: plain value argument.
    CuError::result(unsafe { f(dev) })
}
