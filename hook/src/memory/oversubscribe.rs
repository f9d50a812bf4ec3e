//! `CUDA_OVERSUBSCRIBE`: a plain device allocation (`cuMemAlloc_v2`,
//! `cuMemAllocPitch_v2`) that the container's limit admits but the device
//! cannot hold is served from pinned host memory mapped into the device's
//! address space. HAMi's scheduler hands out more memory than the card has
//! when `deviceMemoryScaling` is above 1; without this, a container well
//! inside its own limit gets `CUDA_ERROR_OUT_OF_MEMORY` once its neighbours
//! fill the card. The program keeps running, slower (its kernels reach that
//! memory over PCIe or C2C).
//!
//! The device is not filled to the brim: an allocation that would leave less
//! than `VGPU_OVERSUBSCRIBE_RESERVE` (512 MiB) free on it goes to the host
//! at once ([`on_device`]). What cannot go there needs that room: GPU code
//! loaded at a library's first launch (cuDNN, cuBLAS), and what libraries
//! allocate on the device past the hook or outside these two entry points.
//!
//! The reservation is taken first, as for any allocation (a request over
//! the limit never gets here), and stays: host-backed bytes count against
//! the limit like device bytes. They are also published per device in the
//! slot's `host_bytes` word for `vgpu inspect` and the daemon's metrics.
//!
//! Other paths never overflow (docs/hook.md says why): VMM handles, IPC
//! export, stream-ordered and pool allocations, arrays, managed memory.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{LazyLock, Mutex};

use vgpu_common::region::MAX_DEVICES;

use super::track::{Entry, Tracker};
use crate::driver;
use crate::driver::{Context, Memory};
use crate::ffi::*;
use crate::region::Kind;
use crate::state::Process;

/// Host-backed allocations alive in this process: while 0, a free costs
/// one relaxed load here and never touches [`TABLE`].
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// This process's host-backed bytes per device. The slot's word is stored
/// from it under the lock (a wiped slot gets the right value at the next
/// change); only overflows and their frees take it, never the common path.
static HOST_BYTES: Mutex<[u64; MAX_DEVICES]> = Mutex::new([0; MAX_DEVICES]);
/// Host-backed allocations: device address → what it holds.
static TABLE: LazyLock<Tracker> = LazyLock::new(Tracker::new);

/// A plain allocation of `bytes` made by `alloc` on the device: always
/// without oversubscription; with it, only while the device would keep its
/// reserve free (one `cuMemGetInfo`; when that fails, the device decides),
/// else answered `CUDA_ERROR_OUT_OF_MEMORY` for [`or_host`] to serve.
pub fn on_device(d: &impl Memory, bytes: u64, alloc: impl FnOnce() -> CUresult) -> CUresult {
    let c = crate::state::config();
    if !c.oversubscribe {
        return alloc();
    }
    let Some((free, _)) = d.mem_info() else {
        return alloc();
    };
    let room = (free as u64).saturating_sub(c.oversubscribe_reserve);
    if bytes <= room {
        return alloc();
    }
    vlog_once!(
        crate::log::INFO,
        "{} MiB free on the device, {} MiB of it kept for GPU code and libraries: allocations that do not fit the rest are served from host memory",
        free >> 20,
        c.oversubscribe_reserve >> 20
    );
    CUDA_ERROR_OUT_OF_MEMORY
}

/// After the driver answered `rc` to a plain device allocation of `bytes`
/// on `dev` (already reserved against the limit): when the device is full
/// and oversubscription is on, serves it from mapped host memory, writes
/// its address to `dptr` and returns `CUDA_SUCCESS`; otherwise returns
/// `rc` unchanged.
pub fn or_host(
    driver: &(impl Context + Memory),
    p: &Process,
    rc: CUresult,
    dev: usize,
    bytes: u64,
    dptr: *mut CUdeviceptr,
) -> CUresult {
    if rc != CUDA_ERROR_OUT_OF_MEMORY || !crate::state::config().oversubscribe {
        return rc;
    }
    match host_backed(driver, p, dev, bytes) {
        Some(d) if write(dptr, d) => CUDA_SUCCESS,
        Some(d) => {
            let _ = free(p, d);
            rc
        }
        None => rc,
    }
}

/// [`or_host`] for `cuMemAllocPitch_v2`: the pitch is the width rounded up
/// to `align` (the bound the caller reserved for).
pub fn or_host_pitched(
    driver: &(impl Context + Memory),
    p: &Process,
    rc: CUresult,
    dev: usize,
    (width, height, align): (usize, usize, u64),
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
) -> CUresult {
    if rc != CUDA_ERROR_OUT_OF_MEMORY || !crate::state::config().oversubscribe {
        return rc;
    }
    let Some((row, bytes)) = (width as u64)
        .checked_next_multiple_of(align)
        .and_then(|row| Some((row, row.checked_mul(height as u64)?)))
    else {
        return rc;
    };
    let Ok(row) = usize::try_from(row) else {
        return rc;
    };
    match host_backed(driver, p, dev, bytes) {
        Some(d) if write(pitch, row) && write(dptr, d) => CUDA_SUCCESS,
        Some(d) => {
            let _ = free(p, d);
            rc
        }
        None => rc,
    }
}

/// Mapped pinned host memory of `bytes` whose device address is its host
/// address (unified addressing), tracked and published; `None` when the
/// driver refuses it or maps it elsewhere.
fn host_backed(
    driver: &(impl Context + Memory),
    p: &Process,
    dev: usize,
    bytes: u64,
) -> Option<CUdeviceptr> {
    let size = usize::try_from(bytes).ok()?;
    let host = match driver.host_alloc_mapped(size) {
        Ok(h) => h,
        Err(e) => {
            vlog_once!(
                crate::log::WARN,
                "device {dev} is full and {bytes} bytes of host memory were refused too ({e}); \
                 the allocation fails"
            );
            return None;
        }
    };
    let d = match driver.host_device_pointer(host) {
        Ok(d) if d == host as u64 => d,
        other => {
            // Without unified addressing the two addresses differ and a
            // free of the device address could not find the host block.
            vlog_once!(
                crate::log::WARN,
                "mapped host memory at {host:#x} has device address {other:?}: no host overflow"
            );
            let _ = driver.free_host(host);
            return None;
        }
    };
    TABLE.insert(d, Entry::here(driver, dev, bytes, Kind::Data));
    LIVE.fetch_add(1, Relaxed);
    change(p, dev, |v| v.saturating_add(bytes));
    vlog_once!(
        crate::log::INFO,
        "device {dev} is full: CUDA_OVERSUBSCRIBE serves allocations from host memory (first: {bytes} bytes); they count against the limit"
    );
    Some(d)
}

/// The free of `dptr` if it is host-backed (`cuMemFreeHost`), else `None`
/// (the caller frees device memory). While none is alive: one relaxed load.
pub fn free(p: &Process, dptr: CUdeviceptr) -> Option<CUresult> {
    if LIVE.load(Relaxed) == 0 {
        return None;
    }
    let e = TABLE.remove(dptr)?;
    match driver::live().free_host(dptr as usize) {
        Ok(()) => {
            forget(p, e);
            Some(CUDA_SUCCESS)
        }
        Err(err) => {
            TABLE.insert(dptr, e);
            Some(err.code())
        }
    }
}

/// Forgets the host-backed allocations for which `f` holds: their context
/// is gone and the driver freed them with it.
pub fn released_where(p: &Process, f: impl Fn(&Entry) -> bool) {
    if LIVE.load(Relaxed) == 0 {
        return;
    }
    for e in TABLE.drain_where(f) {
        forget(p, e);
    }
}

fn forget(p: &Process, e: Entry) {
    LIVE.fetch_sub(1, Relaxed);
    change(p, e.dev, |v| v.saturating_sub(e.bytes));
}

/// This process's host-backed bytes on `dev` (its own count, not the
/// slot's word, which the tenant could write).
pub fn on_host(dev: usize) -> u64 {
    if LIVE.load(Relaxed) == 0 {
        return 0;
    }
    let all = HOST_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    all.get(dev).copied().unwrap_or(0)
}

/// Applies `f` to the process's host-backed bytes of `dev` and publishes
/// the result in its slot.
fn change(p: &Process, dev: usize, f: impl FnOnce(u64) -> u64) {
    let mut all = HOST_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    let Some(total) = all.get_mut(dev) else {
        return;
    };
    *total = f(*total);
    if let Some(m) = p.att.slot().and_then(|s| s.used.get(dev)) {
        m.host_bytes.store(*total, Relaxed);
    }
}
