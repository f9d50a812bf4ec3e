//! Timing events and stream capture: what the SM limiter asks the driver on
//! its own behalf (never through the hooked exports).

use std::ffi::c_int;

use super::{sym, CuError};
use crate::ffi::*;

/// Runs `f` with the calling thread's stream-capture mode swapped to
/// relaxed (restored after), so that the hook's own event calls never
/// invalidate a graph capture another thread runs in the default global
/// mode, where an event query from any thread is "unsafe". Without the
/// call, `f` runs as it is.
#[doc(alias = "cuThreadExchangeStreamCaptureMode")]
pub fn with_relaxed_capture<T>(f: impl FnOnce() -> T) -> T {
    let Ok(exchange) = sym(|t| t.cuThreadExchangeStreamCaptureMode) else {
        return f();
    };
    let mut mode: c_int = CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a live local the driver reads and writes one int of.
    let swapped = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
    let r = f();
    if swapped {
        // SAFETY: as above; `mode` now holds the thread's previous mode.
        let _ = unsafe { exchange(&mut mode) };
    }
    r
}

/// A new event in the current context.
///
/// # Errors
/// The driver's code; `CUDA_ERROR_UNKNOWN` for a NULL event.
#[doc(alias = "cuEventCreate")]
pub fn create(flags: std::ffi::c_uint) -> Result<CUevent, CuError> {
    let f = sym(|t| t.cuEventCreate)?;
    let mut ev: CUevent = std::ptr::null_mut();
    // SAFETY: `ev` is a live local the driver writes one handle to.
    CuError::result(unsafe { f(&mut ev, flags) })?;
    if ev.is_null() {
        return Err(CuError(CUDA_ERROR_UNKNOWN));
    }
    Ok(ev)
}

/// Destroys an event [`create`] returned.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuEventDestroy_v2")]
pub fn destroy(ev: CUevent) -> Result<(), CuError> {
    let f = sym(|t| t.cuEventDestroy_v2)?;
    // SAFETY: plain handle argument; the driver validates it.
    CuError::result(unsafe { f(ev) })
}

/// Records `ev` into `stream`.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuEventRecord")]
pub fn record(ev: CUevent, stream: CUstream) -> Result<(), CuError> {
    let f = sym(|t| t.cuEventRecord)?;
    // SAFETY: plain handle arguments; the driver validates them.
    CuError::result(unsafe { f(ev, stream) })
}

/// Whether `ev` has completed: `Ok` when it has, `CUDA_ERROR_NOT_READY`
/// while it has not.
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuEventQuery")]
pub fn query(ev: CUevent) -> Result<(), CuError> {
    let f = sym(|t| t.cuEventQuery)?;
    // SAFETY: plain handle argument; the driver validates it.
    CuError::result(unsafe { f(ev) })
}

/// The time between two completed events, in ms (`cuEventElapsedTime_v2`
/// where the driver has it).
///
/// # Errors
/// The driver's code.
#[doc(alias = "cuEventElapsedTime")]
#[doc(alias = "cuEventElapsedTime_v2")]
pub fn elapsed_ms(start: CUevent, end: CUevent) -> Result<f32, CuError> {
    let f = sym(|t| t.cuEventElapsedTime_v2.or(t.cuEventElapsedTime))?;
    let mut ms: f32 = 0.0;
    // SAFETY: `ms` is a live local the driver writes one float to; both
    // versions have this signature.
    CuError::result(unsafe { f(&mut ms, start, end) })?;
    Ok(ms)
}

/// `stream`'s capture status (`CU_STREAM_CAPTURE_STATUS_*`).
///
/// # Errors
/// The driver's code (the legacy stream while another thread captures in
/// global mode); `CUDA_ERROR_NOT_FOUND` when the driver lacks the call.
#[doc(alias = "cuStreamIsCapturing")]
pub fn capture_status(stream: CUstream) -> Result<c_int, CuError> {
    let f = sym(|t| t.cuStreamIsCapturing)?;
    let mut status: c_int = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a live local the driver writes one int to.
    CuError::result(unsafe { f(stream, &mut status) })?;
    Ok(status)
}
