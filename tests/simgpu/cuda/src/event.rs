//! Events: a recorded event holds the time its stream's queued work ends.
//! Recorded into a capturing stream it is *captured* instead (see
//! `capture.rs`) until it is recorded again into a normal stream.

use std::ffi::c_uint;

use crate::state::with;
use crate::{guard, put, CUresult, CuErr, Handle};

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 0x2;

/// An event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub flags: u32,
    /// Completion time (monotonic ns) of the last record, None if never.
    pub time: Option<u64>,
    /// The capture (its id) the event was last recorded into, if it was.
    pub capture: Option<Handle>,
}

/// `cuEventCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    guard(|| {
        if ph.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            d.current_ctx()?;
            let h = d.new_handle();
            d.events.insert(
                h,
                Event {
                    flags,
                    time: None,
                    capture: None,
                },
            );
            Ok(h)
        })?;
        put!(ph, h);
        Ok(())
    })
}

/// `cuEventDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            d.events.remove(&ev).ok_or(CuErr::InvalidHandle)?;
            Ok(())
        })
    })
}

fn record(ev: Handle, stream: Handle, per_thread: bool) -> Result<(), CuErr> {
    with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        let t = d.stream_end_of(&r).max(simgpu::clock::mono_ns());
        let capture = d.captures.get(&r.key).map(|c| c.id);
        let e = d.events.get_mut(&ev).ok_or(CuErr::InvalidHandle)?;
        e.capture = capture;
        if capture.is_none() {
            e.time = Some(t);
        }
        Ok(())
    })
}

/// `cuEventRecord`: completes when the stream's queued work ends (into a
/// capturing stream: the event is captured).
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: Handle, stream: Handle) -> CUresult {
    guard(|| record(ev, stream, false))
}

/// `cuEventRecord_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(ev: Handle, stream: Handle) -> CUresult {
    guard(|| record(ev, stream, true))
}

/// `cuEventRecordWithFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    ev: Handle,
    stream: Handle,
    _flags: c_uint,
) -> CUresult {
    guard(|| record(ev, stream, false))
}

/// `cuEventRecordWithFlags_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    ev: Handle,
    stream: Handle,
    _flags: c_uint,
) -> CUresult {
    guard(|| record(ev, stream, true))
}

/// The completion time of an event a thread waits for or queries: an
/// "unsafe" call during a capture, and an error on a captured event.
fn time_of(ev: Handle) -> Result<Option<u64>, CuErr> {
    with(|d| {
        let time = d.events.get(&ev).ok_or(CuErr::InvalidHandle)?.time;
        d.check_unsafe(None)?;
        d.check_captured(ev)?;
        Ok(time)
    })
}

/// `cuEventSynchronize`: sleeps until the event completes.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: Handle) -> CUresult {
    guard(|| match time_of(ev)? {
        Some(t) => crate::stream::wait_and_settle(t),
        None => Ok(()),
    })
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until it completes.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: Handle) -> CUresult {
    guard(|| match time_of(ev)? {
        Some(t) if simgpu::clock::mono_ns() < t => Err(CuErr::NotReady),
        _ => Ok(()),
    })
}

fn elapsed(ms: *mut f32, start: Handle, end: Handle) -> Result<(), CuErr> {
    let (s, e) = with(|d| {
        let s = *d.events.get(&start).ok_or(CuErr::InvalidHandle)?;
        let e = *d.events.get(&end).ok_or(CuErr::InvalidHandle)?;
        d.check_captured(start)?;
        d.check_captured(end)?;
        Ok((s, e))
    })?;
    if (s.flags | e.flags) & DISABLE_TIMING != 0 {
        return Err(CuErr::InvalidHandle);
    }
    let (Some(ts), Some(te)) = (s.time, e.time) else {
        return Err(CuErr::InvalidHandle);
    };
    if simgpu::clock::mono_ns() < ts.max(te) {
        return Err(CuErr::NotReady);
    }
    put!(ms, (te as f64 - ts as f64) as f32 / 1e6);
    Ok(())
}

/// `cuEventElapsedTime`: milliseconds between two completed events.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    guard(|| elapsed(ms, start, end))
}

/// `cuEventElapsedTime_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    guard(|| elapsed(ms, start, end))
}
