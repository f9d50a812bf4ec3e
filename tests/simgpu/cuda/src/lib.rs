//! Simulated `libcuda.so.1`: the CUDA driver API over the simulated device
//! of the `simgpu` crate. See `docs/simgpu.md`.
//!
//! Every export is a `pub unsafe extern "C" fn cu…` whose body runs inside
//! [`guard`]: a panic becomes `CUDA_ERROR_UNKNOWN`, never an unwind into C.
//! Handles are opaque numbers checked against the process's tables, so a
//! stale or foreign handle is an error code, not a crash. Device pointers
//! are fake addresses, unique within the process and never dereferenced;
//! host and managed memory is real.

mod array;
mod capture;
mod control;
mod ctx;
mod device;
mod error;
mod event;
mod graph;
mod ipc;
mod launch;
mod mem;
mod memcpy;
mod module;
mod pool;
mod procaddr;
mod state;
mod stream;
mod vmm;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use error::CuErr;

/// `CUresult`.
pub type CUresult = u32;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// `CUdevice`.
pub type CUdevice = i32;
/// Any opaque handle (`CUcontext`, `CUstream`, …) as a number.
pub type Handle = usize;

/// Runs an entry point's body: maps `Err` to its code and a panic to
/// `CUDA_ERROR_UNKNOWN`.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), CuErr>) -> CUresult {
    control::count_call();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e as CUresult,
        Err(_) => CuErr::Unknown as CUresult,
    }
}

/// Writes a value through an out-pointer of the C caller; NULL is
/// `CUDA_ERROR_INVALID_VALUE` (returned from the enclosing closure).
macro_rules! put {
    ($p:expr, $v:expr) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::CuErr::InvalidValue);
        }
        // SAFETY: a non-NULL out-pointer from the C caller, which the API
        // contract requires to be valid for a write of its type.
        unsafe { p.write($v) }
    }};
}
pub(crate) use put;

/// Reads a struct the C caller passes by pointer; NULL is
/// `CUDA_ERROR_INVALID_VALUE`.
macro_rules! get {
    ($p:expr) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::CuErr::InvalidValue);
        }
        // SAFETY: a non-NULL pointer from the C caller, which the API
        // contract requires to point to a valid, initialised value.
        unsafe { p.read() }
    }};
}
pub(crate) use get;

/// Reads a NUL-terminated string argument; NULL or non-UTF-8 is
/// `CUDA_ERROR_INVALID_VALUE`.
macro_rules! cstr {
    ($p:expr) => {{
        let p: *const std::ffi::c_char = $p;
        if p.is_null() {
            return Err($crate::CuErr::InvalidValue);
        }
        // SAFETY: a non-NULL string from the C caller, which the API
        // contract requires to be NUL-terminated and live for the call.
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        s.to_str().map_err(|_| $crate::CuErr::InvalidValue)?
    }};
}
pub(crate) use cstr;

/// Copies `s` (NUL-terminated, truncated) into the C buffer `buf` of `len`
/// bytes.
pub(crate) fn write_cstr(buf: *mut std::ffi::c_char, len: i32, s: &str) -> Result<(), CuErr> {
    if buf.is_null() || len <= 0 {
        return Err(CuErr::InvalidValue);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller's buffer is valid for `len` bytes (API contract);
    // we write n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        buf.add(n).write(0);
    }
    Ok(())
}
