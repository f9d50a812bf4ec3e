//! Device memory: allocation and free (plain, pitched, managed,
//! stream-ordered, pools), VMM handles, IPC imports, address ranges and
//! `cuMemGetInfo`.

use std::ffi::{c_uint, c_void};

use super::{sym, CuError};
use crate::ffi::*;

/// `cuMemAlloc_v2`, forwarded with the application's out-pointer.
#[doc(alias = "cuMemAlloc_v2")]
pub fn alloc(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAlloc_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `dptr` is the application's out-pointer of this very call,
    // passed unchanged (valid or NULL per the C API; the driver checks NULL).
    unsafe { f(dptr, bytesize) }
}

/// `cuMemAllocManaged`, forwarded with the application's out-pointer.
#[doc(alias = "cuMemAllocManaged")]
pub fn alloc_managed(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocManaged) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `dptr` is the application's out-pointer of this very call,
    // passed unchanged.
    unsafe { f(dptr, bytesize, flags) }
}

/// `cuMemAllocPitch_v2`, forwarded with the application's out-pointers.
#[doc(alias = "cuMemAllocPitch_v2")]
pub fn alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocPitch_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `dptr` and `pitch` are the application's out-pointers of
    // this very call, passed unchanged.
    unsafe { f(dptr, pitch, width, height, elem) }
}

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

/// `cuMemAllocAsync`, forwarded with the application's out-pointer.
#[doc(alias = "cuMemAllocAsync")]
pub fn alloc_async(dptr: *mut CUdeviceptr, bytesize: usize, s: CUstream) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocAsync) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `dptr` is the application's out-pointer and `s` its stream
    // handle, both of this very call, passed unchanged.
    unsafe { f(dptr, bytesize, s) }
}

/// `cuMemAllocAsync_ptsz`, forwarded with the application's out-pointer.
#[doc(alias = "cuMemAllocAsync_ptsz")]
pub fn alloc_async_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, s: CUstream) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocAsync_ptsz) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: as in `alloc_async`.
    unsafe { f(dptr, bytesize, s) }
}

/// `cuMemAllocFromPoolAsync`, forwarded with the application's out-pointer.
#[doc(alias = "cuMemAllocFromPoolAsync")]
pub fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocFromPoolAsync) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the application's out-pointer, pool and stream of this very
    // call, passed unchanged.
    unsafe { f(dptr, bytesize, pool, s) }
}

/// `cuMemAllocFromPoolAsync_ptsz`, forwarded with the application's
/// out-pointer.
#[doc(alias = "cuMemAllocFromPoolAsync_ptsz")]
pub fn alloc_from_pool_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemAllocFromPoolAsync_ptsz) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: as in `alloc_from_pool`.
    unsafe { f(dptr, bytesize, pool, s) }
}

/// `cuMemFreeAsync`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemFreeAsync")]
pub fn free_async(dptr: CUdeviceptr, s: CUstream) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemFreeAsync)?;
    // SAFETY: a device address and the application's stream handle, by
    // value; the driver validates both.
    CuError::result(unsafe { f(dptr, s) })
}

/// `cuMemFreeAsync_ptsz`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemFreeAsync_ptsz")]
pub fn free_async_ptsz(dptr: CUdeviceptr, s: CUstream) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemFreeAsync_ptsz)?;
    // SAFETY: as in `free_async`.
    CuError::result(unsafe { f(dptr, s) })
}

/// `cuMemCreate`, forwarded with the application's pointers.
#[doc(alias = "cuMemCreate")]
pub fn create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemCreate) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `handle` and `prop` are the application's pointers of this
    // very call, passed unchanged.
    unsafe { f(handle, size, prop, flags) }
}

/// `cuMemRelease`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemRelease")]
pub fn release(handle: CUmemGenericAllocationHandle) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemRelease)?;
    // SAFETY: an allocation handle by value; the driver validates it.
    CuError::result(unsafe { f(handle) })
}

/// `cuMemRetainAllocationHandle`, forwarded with the application's
/// pointers.
#[doc(alias = "cuMemRetainAllocationHandle")]
pub fn retain_handle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemRetainAllocationHandle) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `handle` is the application's out-pointer and `addr` its
    // address, both of this very call, passed unchanged.
    unsafe { f(handle, addr) }
}

/// `cuMemMap`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemMap")]
pub fn map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemMap)?;
    // SAFETY: an address range, an offset, a handle and flags, all by
    // value; the driver validates them.
    CuError::result(unsafe { f(ptr, size, offset, handle, flags) })
}

/// `cuMemUnmap`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuMemUnmap")]
pub fn unmap(ptr: CUdeviceptr, size: usize) -> Result<(), CuError> {
    let f = sym(|t| t.cuMemUnmap)?;
    // SAFETY: an address range by value; the driver validates it.
    CuError::result(unsafe { f(ptr, size) })
}

/// `cuIpcOpenMemHandle_v2`, forwarded with the application's out-pointer.
#[doc(alias = "cuIpcOpenMemHandle_v2")]
pub fn ipc_open(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult {
    let Ok(f) = sym(|t| t.cuIpcOpenMemHandle_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `dptr` is the application's out-pointer of this very call,
    // passed unchanged; `handle` is a 64-byte value.
    unsafe { f(dptr, handle, flags) }
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

/// `cuMemGetInfo_v2`, forwarded with the application's out-pointers.
#[doc(alias = "cuMemGetInfo_v2")]
pub fn get_info(free: *mut usize, total: *mut usize) -> CUresult {
    let Ok(f) = sym(|t| t.cuMemGetInfo_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: `free` and `total` are the application's out-pointers of this
    // very call, passed unchanged.
    unsafe { f(free, total) }
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
