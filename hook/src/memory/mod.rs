//! Memory accounting: every entry point that takes device memory reserves
//! before the driver call and releases on failure (`counted`; the limit
//! check that refuses an allocation is [`limit::reserve`]), and every
//! free releases what was counted (`uncounted`); frees of objects the hook
//! never saw are forwarded unchanged.

#![forbid(unsafe_code)]

pub mod alloc;
pub mod array;
pub mod async_pool;
pub mod context;
pub mod driver;
pub mod graph;
pub mod info;
pub mod ipc;
pub mod limit;
pub mod modules;
pub mod oversubscribe;
pub mod track;
pub mod vmm;

#[cfg(test)]
mod tests;

use vgpu_common::region::MAX_DEVICES;

use crate::ffi::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::region::Kind;
use crate::state::Process;
use driver::Driver;
use track::{Entry, Tracker};

/// The process state and the current context's device, when the call should
/// be counted; `None` means forward unchanged.
pub fn target(d: &impl Driver) -> Option<(&'static Process, usize)> {
    let p = crate::state::process()?;
    let dev = d.current_device()?;
    if dev >= MAX_DEVICES {
        vlog_once!(
            crate::log::WARN,
            "device {dev} is beyond the region's {MAX_DEVICES}; not counted"
        );
        return None;
    }
    modules::reconcile_now_and_then(p, d, dev);
    Some((p, dev))
}

/// Reserves `bytes` on `dev`, runs `call` (which returns the driver's result
/// and the new object's key), and tracks the object; on a refused
/// reservation returns `CUDA_ERROR_OUT_OF_MEMORY` without calling the
/// driver, on a driver failure releases the reservation.
pub fn counted(
    p: &Process,
    tracker: &Tracker,
    dev: usize,
    bytes: u64,
    kind: Kind,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    counted_as(p, tracker, Entry::here(dev, bytes, kind), call)
}

/// [`counted`] for an object described by `e` (one not bound to the current
/// context, say).
pub fn counted_as(
    p: &Process,
    tracker: &Tracker,
    e: Entry,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    if !limit::reserve(&p.att, e.dev, e.bytes, e.kind) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let (rc, key) = call();
    if rc != CUDA_SUCCESS || key == 0 {
        p.att.release(e.dev, e.bytes, e.kind);
        return rc;
    }
    if let Some(old) = tracker.insert(key, e) {
        // The driver handed out a key we still track: its free escaped us.
        p.att.release(old.dev, old.bytes, old.kind);
    }
    rc
}

/// Runs a free of `key`; on success releases what was counted for it.
/// Unknown keys are simply forwarded.
pub fn uncounted(
    p: &Process,
    tracker: &Tracker,
    key: u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let entry = tracker.remove(key);
    let rc = call();
    if let Some(e) = entry {
        if rc == CUDA_SUCCESS {
            p.att.release(e.dev, e.bytes, e.kind);
        } else {
            tracker.insert(key, e);
        }
    }
    rc
}
