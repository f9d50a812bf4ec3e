//! Device memory the hook frees, measures or takes on its own behalf:
//! frees, IPC closes, address ranges, `cuMemGetInfo`, and the mapped host
//! memory of `CUDA_OVERSUBSCRIBE`. The calls the entry points forward are
//! made by the exports themselves (`crate::exports`).

use std::ffi::c_uint;

use super::{sym, CuError};
use crate::ffi::*;

/// `cuMemFree_v2`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemFree_v2")]
pub fn free(dptr: CUdeviceptr) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemFree_v2)?;
    // SAFETY: a device address passed by value; the driver validates it.
    CuError::result(unsafe { f(dptr) })
}

/// `cuIpcCloseMemHandle`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuIpcCloseMemHandle")]
pub fn ipc_close(dptr: CUdeviceptr) -> Result<(), CuError> {
    let f = sym(|t| t.cuIpcCloseMemHandle)?;
    // SAFETY: a device address by value; the driver validates it.
    CuError::result(unsafe { f(dptr) })
}

/// The size of the allocation that contains `dptr`.
///
/// # Errors
/// The driver's code (`CUDA_ERROR_NOT_FOUND` for an address it did not
/// hand out).
#[doc(alias = "cuMemGetAddressRange_v2")]
pub fn allocation_size(dptr: CUdeviceptr) -> Result<usize, CuError> {
    let f = sym(|t| t.cuMemGetAddressRange_v2)?;
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: `base` and `size` are live locals the driver writes to.
    CuError::result(unsafe { f(&mut base, &mut size, dptr) })?;
    Ok(size)
}

/// `(free, total)` bytes of the current context's device.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemGetInfo_v2")]
pub fn info() -> Result<(usize, usize), CuError> {
    let f = sym(|t| t.cuMemGetInfo_v2)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: `free` and `total` are live locals the driver writes to.
    CuError::result(unsafe { f(&mut free, &mut total) })?;
    Ok((free, total))
}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the
/// caller's.
const HOSTALLOC_PORTABLE: c_uint = 0x01;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device's address space.
const HOSTALLOC_DEVICEMAP: c_uint = 0x02;

/// Pinned host memory the device can address (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`), as an address.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemHostAlloc")]
pub fn host_alloc_mapped(bytesize: usize) -> Result<usize, CuError> {
    let f = sym(|t| t.cuMemHostAlloc)?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `p` is a live local the driver writes the address to.
    CuError::result(unsafe { f(&mut p, bytesize, HOSTALLOC_PORTABLE | HOSTALLOC_DEVICEMAP) })?;
    Ok(p as usize)
}

/// The device address of mapped host memory at `host`
/// (`cuMemHostGetDevicePointer_v2`).
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemHostGetDevicePointer_v2")]
pub fn host_device_pointer(host: usize) -> Result<CUdeviceptr, CuError> {
    let f = sym(|t| t.cuMemHostGetDevicePointer_v2)?;
    let mut d: CUdeviceptr = 0;
    // SAFETY: `d` is a live local the driver writes to; `host` is passed
    // by value (the driver validates it) and flags must be 0.
    CuError::result(unsafe { f(&mut d, host as *mut std::ffi::c_void, 0) })?;
    Ok(d)
}

/// `cuMemFreeHost` of memory from [`host_alloc_mapped`].
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemFreeHost")]
pub fn free_host(host: usize) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemFreeHost)?;
    // SAFETY: an address by value; the driver validates it.
    CuError::result(unsafe { f(host as *mut std::ffi::c_void) })
}
