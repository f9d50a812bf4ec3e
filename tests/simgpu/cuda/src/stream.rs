//! Streams and synchronization. A stream is just "when does its last queued
//! kernel end"; synchronizing sleeps until that time (monotonic clock), and
//! then lets memory pools release memory above their release threshold, as
//! the real driver does at synchronization points.

use std::ffi::{c_int, c_uint};

use crate::state::{self, with, Driver, StreamKey};
use crate::{guard, put, CUresult, CuErr, Handle};

/// `CU_STREAM_LEGACY`.
pub(crate) const STREAM_LEGACY: Handle = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub(crate) const STREAM_PER_THREAD: Handle = 0x2;

/// A created stream.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    pub ctx: Handle,
    pub flags: u32,
    pub priority: i32,
}

/// A resolved stream: its key, context and device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved {
    pub key: StreamKey,
    pub ctx: Handle,
    pub dev: u32,
}

impl Driver {
    /// Resolves a stream handle. NULL is the legacy stream, or the
    /// per-thread stream for `_ptsz`/`_ptds` entry points.
    pub(crate) fn resolve_stream(&self, h: Handle, per_thread: bool) -> Result<Resolved, CuErr> {
        let from_current = |per_thread: bool| -> Result<Resolved, CuErr> {
            let (ctx, dev) = self.current_ctx()?;
            let key = if per_thread {
                StreamKey::PerThread(ctx, state::thread_key())
            } else {
                StreamKey::Legacy(ctx)
            };
            Ok(Resolved { key, ctx, dev })
        };
        match h {
            0 => from_current(per_thread),
            STREAM_LEGACY => from_current(false),
            STREAM_PER_THREAD => from_current(true),
            _ => {
                let s = self.streams.get(&h).ok_or(CuErr::InvalidHandle)?;
                let dev = self.ctxs.get(&s.ctx).ok_or(CuErr::InvalidContext)?.dev;
                Ok(Resolved {
                    key: StreamKey::Created(h),
                    ctx: s.ctx,
                    dev,
                })
            }
        }
    }

    /// When the work queued on a stream ends. The legacy stream waits for
    /// everything in its context.
    pub(crate) fn stream_end_of(&self, r: &Resolved) -> u64 {
        match r.key {
            StreamKey::Legacy(ctx) => self.ctxs.get(&ctx).map_or(0, |c| c.last_end),
            k => self.stream_end.get(&k).copied().unwrap_or(0),
        }
    }

    /// Records that a stream's work now ends at `end`.
    pub(crate) fn note_end(&mut self, r: &Resolved, end: u64) {
        let e = self.stream_end.entry(r.key).or_insert(0);
        *e = (*e).max(end);
        if let Some(c) = self.ctxs.get_mut(&r.ctx) {
            c.last_end = c.last_end.max(end);
        }
    }
}

/// Waits until `deadline` (monotonic ns), then runs the post-sync hooks.
pub(crate) fn wait_and_settle(deadline: u64) -> Result<(), CuErr> {
    simgpu::clock::wait_until(deadline);
    with(|d| {
        d.settle_pools();
        Ok(())
    })
}

/// When a stream's work ends, for a thread that waits for it or queries
/// it: an "unsafe" call during a capture.
fn end_of(h: Handle, per_thread: bool) -> Result<u64, CuErr> {
    with(|d| {
        let r = d.resolve_stream(h, per_thread)?;
        d.check_unsafe(Some(&r))?;
        Ok(d.stream_end_of(&r))
    })
}

/// Synchronizes a stream.
pub(crate) fn sync_stream(h: Handle, per_thread: bool) -> Result<(), CuErr> {
    wait_and_settle(end_of(h, per_thread)?)
}

fn query_stream(h: Handle, per_thread: bool) -> Result<(), CuErr> {
    let end = end_of(h, per_thread)?;
    if simgpu::clock::mono_ns() >= end {
        Ok(())
    } else {
        Err(CuErr::NotReady)
    }
}

fn create(ph: *mut Handle, flags: c_uint, priority: c_int) -> Result<(), CuErr> {
    if ph.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let (ctx, _) = d.current_ctx()?;
        let h = d.new_handle();
        d.streams.insert(
            h,
            Stream {
                ctx,
                flags,
                priority: priority.clamp(-5, 0),
            },
        );
        Ok(h)
    })?;
    put!(ph, h);
    Ok(())
}

/// `cuStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    guard(|| create(ph, flags, 0))
}

/// `cuStreamCreateWithPriority`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut Handle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    guard(|| create(ph, flags, priority))
}

/// `cuStreamDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            d.streams.remove(&h).ok_or(CuErr::InvalidHandle)?;
            Ok(())
        })
    })
}

/// `cuStreamSynchronize`: sleeps until the stream's queued kernels end.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: Handle) -> CUresult {
    guard(|| sync_stream(h, false))
}

/// `cuStreamSynchronize_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(h: Handle) -> CUresult {
    guard(|| sync_stream(h, true))
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while kernels are queued.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(h: Handle) -> CUresult {
    guard(|| query_stream(h, false))
}

/// `cuStreamQuery_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(h: Handle) -> CUresult {
    guard(|| query_stream(h, true))
}

fn wait_event(h: Handle, ev: Handle, per_thread: bool) -> Result<(), CuErr> {
    with(|d| {
        let r = d.resolve_stream(h, per_thread)?;
        let t = d.events.get(&ev).ok_or(CuErr::InvalidHandle)?.time;
        if let Some(t) = t {
            d.note_end(&r, t);
        }
        Ok(())
    })
}

/// `cuStreamWaitEvent`: later work on the stream starts after the event.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(h: Handle, ev: Handle, _flags: c_uint) -> CUresult {
    guard(|| wait_event(h, ev, false))
}

/// `cuStreamWaitEvent_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(h: Handle, ev: Handle, _flags: c_uint) -> CUresult {
    guard(|| wait_event(h, ev, true))
}

/// `cuStreamGetCtx`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(h: Handle, pctx: *mut Handle) -> CUresult {
    guard(|| {
        let ctx = with(|d| Ok(d.resolve_stream(h, false)?.ctx))?;
        put!(pctx, ctx);
        Ok(())
    })
}

/// `cuStreamGetPriority`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(h: Handle, priority: *mut c_int) -> CUresult {
    guard(|| {
        let p = with(|d| {
            d.resolve_stream(h, false)?;
            Ok(d.streams.get(&h).map_or(0, |s| s.priority))
        })?;
        put!(priority, p);
        Ok(())
    })
}

/// `cuStreamGetFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(h: Handle, flags: *mut c_uint) -> CUresult {
    guard(|| {
        let f = with(|d| {
            d.resolve_stream(h, false)?;
            Ok(d.streams.get(&h).map_or(0, |s| s.flags))
        })?;
        put!(flags, f);
        Ok(())
    })
}

/// `cuCtxSynchronize`: waits for every kernel of the current context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let end = with(|d| {
            let (ctx, _) = d.current_ctx()?;
            d.check_unsafe(None)?;
            Ok(d.ctxs.get(&ctx).map_or(0, |c| c.last_end))
        })?;
        wait_and_settle(end)
    })
}
