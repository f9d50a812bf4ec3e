//! Memory accounting: every entry point that takes device memory reserves
//! before the driver call and commits the reservation once the driver
//! succeeded (`counted`; the limit check that refuses an allocation is
//! [`limit::reserve`], whose reservation is taken back on any other path),
//! and every free releases what was counted (`uncounted`); frees of objects
//! the hook never saw are forwarded unchanged.

#![forbid(unsafe_code)]

pub mod alloc;
pub mod array;
pub mod async_pool;
pub mod context;
pub mod graph;
pub mod info;
pub mod ipc;
pub mod limit;
pub mod modules;
pub mod nvml_line;
pub mod oversubscribe;
pub mod track;
pub mod vmm;
pub mod vmm_lifetime;
pub mod vmm_table;

#[cfg(test)]
mod tests;

use vgpu_common::region::MAX_DEVICES;

use crate::driver::{Context, Nvml};
use crate::ffi::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::region::Kind;
use crate::state::Process;
use track::{Entry, Tracker};

/// The process state and the current context's device, when the call should
/// be counted; `None` means forward unchanged.
pub fn target(d: &(impl Context + Nvml)) -> Option<(&'static Process, usize)> {
    target_in(d, crate::state::process())
}

/// [`target`] for the process state `p` (`None`: the hook has none).
pub fn target_in<'a>(
    d: &(impl Context + Nvml),
    p: Option<&'a Process>,
) -> Option<(&'a Process, usize)> {
    let p = p?;
    let dev = d.current_device()?;
    if dev >= MAX_DEVICES {
        vlog_once!(
            crate::log::WARN,
            "device {dev} is beyond the region's {MAX_DEVICES}; not counted"
        );
        return None;
    }
    Some((p, dev))
}

/// Reserves `bytes` on `dev`, runs `call` (which returns the driver's result
/// and the new object's key), and tracks the object as one of the current
/// context the driver `d` names; on a refused
/// reservation returns `CUDA_ERROR_OUT_OF_MEMORY` without calling the
/// driver, on a driver failure releases the reservation.
pub fn counted(
    d: &impl Context,
    p: &Process,
    tracker: &Tracker,
    dev: usize,
    bytes: u64,
    kind: Kind,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    counted_as(p, tracker, Entry::here(d, dev, bytes, kind), call)
}

/// [`counted`] for an object described by `e` (one not bound to the current
/// context, say).
pub fn counted_as(
    p: &Process,
    tracker: &Tracker,
    e: Entry,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    let Some(r) = limit::reserve(&p.att, e.dev, e.bytes, e.kind) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let (rc, key) = call();
    if rc != CUDA_SUCCESS || key == 0 {
        return rc;
    }
    r.commit();
    if let Some(old) = tracker.insert(key, e) {
        // The driver handed out a key we still track: its free escaped us.
        limit::release_counted(&p.att, old.dev, old.bytes, old.kind);
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
            limit::release_counted(&p.att, e.dev, e.bytes, e.kind);
        } else {
            tracker.insert(key, e);
        }
    }
    rc
}
