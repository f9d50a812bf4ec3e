//! Copies and memsets: cheap no-ops that validate their arguments. The
//! synchronous forms wait for the current context's queued kernels first,
//! as a real synchronous copy on the legacy stream does; the `_ptds` forms
//! wait for the calling thread's per-thread stream. On pinned host memory
//! used through its device address (mapped, unified addressing),
//! `cuMemsetD8_v2`, `cuMemcpyHtoD_v2` and `cuMemcpyDtoH_v2` really write:
//! a program can check what such memory holds.

use std::ffi::c_void;

use crate::mem::host_backed;
use crate::state::with;
use crate::{CUdeviceptr, CUresult, CuErr, Handle};

/// A synchronous copy: checks pointers, then waits for the default stream.
fn sync_op(ok: bool, per_thread: bool) -> CUresult {
    crate::guard(|| {
        if !ok {
            return Err(CuErr::InvalidValue);
        }
        crate::stream::sync_stream(0, per_thread)
    })
}

/// An asynchronous copy: checks pointers and the stream.
fn async_op(ok: bool, stream: Handle, per_thread: bool) -> CUresult {
    crate::guard(|| {
        if !ok {
            return Err(CuErr::InvalidValue);
        }
        with(|d| d.resolve_stream(stream, per_thread).map(|_| ()))
    })
}

fn ptrs(dst: u64, src: u64, n: usize) -> bool {
    n == 0 || (dst != 0 && src != 0)
}

/// `cuMemcpy` (unified addressing).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    sync_op(ptrs(dst, src, n), false)
}

/// `cuMemcpy_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    sync_op(ptrs(dst, src, n), true)
}

/// `cuMemcpyAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src, n), stream, false)
}

/// `cuMemcpyAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src, n), stream, true)
}

/// `cuMemcpyHtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    let rc = sync_op(ptrs(dst, src as u64, n), false);
    if rc == 0 && n > 0 && host_backed(dst, n) {
        // SAFETY: `dst..dst+n` is pinned host memory of this process (its
        // device address is its host address); `src` is the caller's
        // buffer of `n` bytes (the API's contract), non-NULL per `ptrs`.
        unsafe { std::ptr::copy(src.cast::<u8>(), dst as usize as *mut u8, n) };
    }
    rc
}

/// `cuMemcpyHtoD_v2_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    sync_op(ptrs(dst, src as u64, n), true)
}

/// `cuMemcpyDtoH_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    let rc = sync_op(ptrs(dst as u64, src, n), false);
    if rc == 0 && n > 0 && host_backed(src, n) {
        // SAFETY: `src..src+n` is pinned host memory of this process;
        // `dst` is the caller's buffer of `n` bytes, non-NULL per `ptrs`.
        unsafe { std::ptr::copy(src as usize as *const u8, dst.cast::<u8>(), n) };
    }
    rc
}

/// `cuMemcpyDtoH_v2_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    sync_op(ptrs(dst as u64, src, n), true)
}

/// `cuMemcpyDtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    sync_op(ptrs(dst, src, n), false)
}

/// `cuMemcpyDtoD_v2_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    sync_op(ptrs(dst, src, n), true)
}

/// `cuMemcpyHtoDAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src as u64, n), stream, false)
}

/// `cuMemcpyHtoDAsync_v2_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src as u64, n), stream, true)
}

/// `cuMemcpyDtoHAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst as u64, src, n), stream, false)
}

/// `cuMemcpyDtoHAsync_v2_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst as u64, src, n), stream, true)
}

/// `cuMemcpyDtoDAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src, n), stream, false)
}

/// `cuMemcpyDtoDAsync_v2_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, src, n), stream, true)
}

/// `cuMemcpy2D_v2` (descriptor not interpreted).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(copy: *const c_void) -> CUresult {
    sync_op(!copy.is_null(), false)
}

/// `cuMemcpy2DAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(copy: *const c_void, stream: Handle) -> CUresult {
    async_op(!copy.is_null(), stream, false)
}

/// `cuMemcpy3D_v2` (descriptor not interpreted).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(copy: *const c_void) -> CUresult {
    sync_op(!copy.is_null(), false)
}

/// `cuMemcpy3DAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(copy: *const c_void, stream: Handle) -> CUresult {
    async_op(!copy.is_null(), stream, false)
}

/// `cuMemsetD8_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    let rc = sync_op(ptrs(dst, 1, n), false);
    if rc == 0 && n > 0 && host_backed(dst, n) {
        // SAFETY: `dst..dst+n` is pinned host memory of this process.
        unsafe { std::ptr::write_bytes(dst as usize as *mut u8, v, n) };
    }
    rc
}

/// `cuMemsetD8_v2_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, _v: u8, n: usize) -> CUresult {
    sync_op(ptrs(dst, 1, n), true)
}

/// `cuMemsetD16_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, _v: u16, n: usize) -> CUresult {
    sync_op(ptrs(dst, 1, n), false)
}

/// `cuMemsetD32_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, _v: u32, n: usize) -> CUresult {
    sync_op(ptrs(dst, 1, n), false)
}

/// `cuMemsetD32_v2_ptds`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, _v: u32, n: usize) -> CUresult {
    sync_op(ptrs(dst, 1, n), true)
}

/// `cuMemsetD2D8_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    _pitch: usize,
    _v: u8,
    w: usize,
    h: usize,
) -> CUresult {
    sync_op(ptrs(dst, 1, w * h), false)
}

/// `cuMemsetD2D32_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    _pitch: usize,
    _v: u32,
    w: usize,
    h: usize,
) -> CUresult {
    sync_op(ptrs(dst, 1, w * h), false)
}

/// `cuMemsetD8Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    _v: u8,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, 1, n), stream, false)
}

/// `cuMemsetD8Async_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    _v: u8,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, 1, n), stream, true)
}

/// `cuMemsetD16Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    _v: u16,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, 1, n), stream, false)
}

/// `cuMemsetD32Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    _v: u32,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, 1, n), stream, false)
}

/// `cuMemsetD32Async_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    _v: u32,
    n: usize,
    stream: Handle,
) -> CUresult {
    async_op(ptrs(dst, 1, n), stream, true)
}
