//! Devices: count, ordinals, UUIDs, total memory.

use std::ffi::c_int;

use super::{sym, CuError};
use crate::ffi::*;

/// The number of devices this process sees.
///
/// # Errors
/// The driver's code (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`).
#[doc(alias = "cuDeviceGetCount")]
pub fn count() -> Result<c_int, CuError> {
    let f = sym(|t| t.cuDeviceGetCount)?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a live local the driver writes one int to.
    CuError::result(unsafe { f(&mut n) })?;
    Ok(n)
}

/// The device of CUDA ordinal `ordinal`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDeviceGet")]
pub fn get(ordinal: c_int) -> Result<CUdevice, CuError> {
    let f = sym(|t| t.cuDeviceGet)?;
    let mut d: CUdevice = 0;
    // SAFETY: `d` is a live local the driver writes one CUdevice to.
    CuError::result(unsafe { f(&mut d, ordinal) })?;
    Ok(d)
}

/// The 16 UUID bytes of `dev`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuDeviceGetUuid_v2")]
pub fn uuid(dev: CUdevice) -> Result<[u8; 16], CuError> {
    let f = sym(|t| t.cuDeviceGetUuid_v2)?;
    let mut u = CUuuid::default();
    // SAFETY: `u` is a live local of CUuuid's layout (16 bytes).
    CuError::result(unsafe { f(&mut u, dev) })?;
    Ok(u.bytes)
}
