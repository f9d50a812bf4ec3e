//! Stream capture. Between `cuStreamBeginCapture` and `cuStreamEndCapture`
//! nothing launched into the stream runs: each kernel launch (and each
//! kernel node of a graph launched into it) is appended to the capture's
//! graph, which `cuStreamEndCapture` returns for `cuGraphInstantiate*` and
//! `cuGraphLaunch`.
//!
//! What breaks a capture, as in the real driver:
//! * An event recorded into a capturing stream is *captured*: it records no
//!   time, and `cuEventQuery`, `cuEventSynchronize` and
//!   `cuEventElapsedTime(_v2)` on it fail with `CUDA_ERROR_CAPTURED_EVENT`
//!   and invalidate its capture, until it is recorded into a normal stream.
//! * "Potentially unsafe" calls fail with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate the capture that
//!   forbids them. Which captures forbid a call depends on the calling
//!   thread's mode (`cuThreadExchangeStreamCaptureMode`): in GLOBAL (the
//!   default) its own capture unless begun RELAXED, and any thread's
//!   capture begun GLOBAL; in THREAD_LOCAL only its own capture unless begun
//!   RELAXED; in RELAXED none. Querying or synchronizing the capturing
//!   stream itself is forbidden in every mode.
//!
//! An invalidated capture goes on capturing until `cuStreamEndCapture`,
//! which then fails with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and a NULL
//! graph.
//!
//! Simplifications: the unsafe calls are only the waits and queries
//! (`cuEventQuery`, `cuEventSynchronize`, `cuStreamQuery`,
//! `cuStreamSynchronize`, `cuCtxSynchronize` and the synchronous copies,
//! which wait for the default stream), not allocations; a capture is one
//! stream (no other stream joins it through `cuStreamWaitEvent`); copies,
//! memsets and stream-ordered allocations into a capturing stream are not
//! captured; nodes depend on nothing (graphs run in insertion order
//! anyway); the legacy stream has no implicit dependency on a capturing
//! stream (no `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`).

use std::cell::Cell;
use std::ffi::c_int;

use crate::graph::Node;
use crate::state::{self, with, Driver, StreamKey};
use crate::stream::Resolved;
use crate::{get, guard, put, CUresult, CuErr, Handle};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
const MODE_GLOBAL: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
const MODE_THREAD_LOCAL: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const MODE_RELAXED: c_int = 2;

/// `CU_STREAM_CAPTURE_STATUS_NONE` / `_ACTIVE` / `_INVALIDATED`.
const STATUS_NONE: c_int = 0;
const STATUS_ACTIVE: c_int = 1;
const STATUS_INVALIDATED: c_int = 2;

thread_local! {
    /// The calling thread's capture interaction mode.
    static MODE: Cell<c_int> = const { Cell::new(MODE_GLOBAL) };
}

/// A stream's capture in progress.
#[derive(Debug)]
pub(crate) struct Capture {
    /// Identifies the capture (in the events recorded into it).
    pub id: Handle,
    /// The mode it was begun in.
    mode: c_int,
    /// The thread that began it (`state::thread_key`).
    thread: u64,
    invalidated: bool,
    nodes: Vec<Node>,
}

impl Driver {
    /// The unsafe-call rule for the calling thread (see the module doc);
    /// `stream`: the stream the call waits for or queries, if any.
    pub(crate) fn check_unsafe(&mut self, stream: Option<&Resolved>) -> Result<(), CuErr> {
        let (me, mode) = (state::thread_key(), MODE.with(Cell::get));
        let mut forbidden = false;
        for (key, c) in &mut self.captures {
            let own = c.thread == me && c.mode != MODE_RELAXED;
            let forbids = stream.is_some_and(|r| r.key == *key)
                || match mode {
                    MODE_GLOBAL => own || c.mode == MODE_GLOBAL,
                    MODE_THREAD_LOCAL => own,
                    _ => false,
                };
            if forbids {
                c.invalidated = true;
                forbidden = true;
            }
        }
        if forbidden {
            Err(CuErr::StreamCaptureUnsupported)
        } else {
            Ok(())
        }
    }

    /// `CUDA_ERROR_CAPTURED_EVENT` for an event last recorded into a
    /// capture, which is invalidated if still open.
    pub(crate) fn check_captured(&mut self, ev: Handle) -> Result<(), CuErr> {
        let Some(id) = self.events.get(&ev).and_then(|e| e.capture) else {
            return Ok(());
        };
        if let Some(c) = self.captures.values_mut().find(|c| c.id == id) {
            c.invalidated = true;
        }
        Err(CuErr::CapturedEvent)
    }
}

/// A launch into `stream`: when it is capturing, appends `nodes` (what the
/// launch would run) to its capture and returns true; else false, and the
/// caller runs the launch.
pub(crate) fn captured(
    stream: Handle,
    per_thread: bool,
    nodes: impl FnOnce(&Driver) -> Result<Vec<Node>, CuErr>,
) -> Result<bool, CuErr> {
    with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        if !d.captures.contains_key(&r.key) {
            return Ok(false);
        }
        let nodes = nodes(d)?;
        if let Some(c) = d.captures.get_mut(&r.key) {
            c.nodes.extend(nodes);
        }
        Ok(true)
    })
}

fn begin(stream: Handle, per_thread: bool, mode: c_int) -> Result<(), CuErr> {
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
        return Err(CuErr::InvalidValue);
    }
    with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        if matches!(r.key, StreamKey::Legacy(_)) {
            return Err(CuErr::StreamCaptureUnsupported);
        }
        if d.captures.contains_key(&r.key) {
            return Err(CuErr::IllegalState);
        }
        let id = d.new_handle();
        let c = Capture {
            id,
            mode,
            thread: state::thread_key(),
            invalidated: false,
            nodes: Vec::new(),
        };
        d.captures.insert(r.key, c);
        Ok(())
    })
}

/// `cuStreamBeginCapture_v2`: launches into `stream` are captured from now
/// on; the legacy stream cannot be captured.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Handle, mode: c_int) -> CUresult {
    guard(|| begin(stream, false, mode))
}

/// `cuStreamBeginCapture_v2_ptsz`: NULL = the per-thread stream.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: Handle, mode: c_int) -> CUresult {
    guard(|| begin(stream, true, mode))
}

/// `cuStreamBeginCapture` (CUDA 10.0, no mode argument): a GLOBAL capture.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: Handle) -> CUresult {
    guard(|| begin(stream, false, MODE_GLOBAL))
}

fn end(stream: Handle, per_thread: bool, graph: *mut Handle) -> Result<(), CuErr> {
    if graph.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let made = with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        let c = d.captures.remove(&r.key).ok_or(CuErr::IllegalState)?;
        if c.mode != MODE_RELAXED && c.thread != state::thread_key() {
            d.captures.insert(r.key, c);
            return Err(CuErr::StreamCaptureWrongThread);
        }
        if c.invalidated {
            return Ok(None);
        }
        let h = d.new_handle();
        d.graphs.add(h, c.nodes);
        Ok(Some(h))
    })?;
    put!(graph, made.unwrap_or(0));
    made.map(|_| ()).ok_or(CuErr::StreamCaptureInvalidated)
}

/// `cuStreamEndCapture`: the captured graph, or
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and NULL.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) -> CUresult {
    guard(|| end(stream, false, graph))
}

/// `cuStreamEndCapture_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> CUresult {
    guard(|| end(stream, true, graph))
}

fn is_capturing(stream: Handle, per_thread: bool, status: *mut c_int) -> Result<(), CuErr> {
    let s = with(|d| {
        let r = d.resolve_stream(stream, per_thread)?;
        Ok(match d.captures.get(&r.key) {
            None => STATUS_NONE,
            Some(c) if c.invalidated => STATUS_INVALIDATED,
            Some(_) => STATUS_ACTIVE,
        })
    })?;
    put!(status, s);
    Ok(())
}

/// `cuStreamIsCapturing`: NONE, ACTIVE or INVALIDATED.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Handle, status: *mut c_int) -> CUresult {
    guard(|| is_capturing(stream, false, status))
}

/// `cuStreamIsCapturing_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(stream: Handle, status: *mut c_int) -> CUresult {
    guard(|| is_capturing(stream, true, status))
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's mode to
/// `*mode` and returns the previous one in `*mode`.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    guard(|| {
        with(|_| Ok(()))?;
        let new = get!(mode as *const c_int);
        if !(MODE_GLOBAL..=MODE_RELAXED).contains(&new) {
            return Err(CuErr::InvalidValue);
        }
        put!(mode, MODE.with(|m| m.replace(new)));
        Ok(())
    })
}
