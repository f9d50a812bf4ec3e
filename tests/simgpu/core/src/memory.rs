//! Device-memory accounting. The truth is each slot's `used[dev]`; a device's
//! usage is their sum, so a process killed between two stores can never make
//! the device total disagree with the per-process figures. Reservations check
//! capacity under the [`ShmLock`]; releases are a saturating atomic
//! subtraction on the caller's own slot.

use std::sync::atomic::Ordering;

use crate::lock::ShmLock;
use crate::shm::Shm;
use crate::SimError;

/// Bytes in use on `dev`, summed over live processes.
pub fn device_used(shm: &Shm, dev: u32) -> u64 {
    let d = dev as usize;
    shm.live_slots()
        .map(|(_, s)| s.used.get(d).map_or(0, |u| u.load(Ordering::Relaxed)))
        .fold(0u64, u64::saturating_add)
}

/// `(free, total)` of `dev`.
pub fn device_info(shm: &Shm, dev: u32) -> (u64, u64) {
    let total = shm.config().memory;
    (total.saturating_sub(device_used(shm, dev)), total)
}

/// Reserves `bytes` on `dev` for `slot`; fails with
/// [`SimError::OutOfMemory`] when the device has less free.
pub fn reserve(shm: &Shm, slot: u32, dev: u32, bytes: u64) -> Result<(), SimError> {
    let s = shm.slot(slot).ok_or(SimError::NoSlot)?;
    if shm.device(dev).is_none() {
        return Err(SimError::InvalidDevice(dev));
    }
    let cell = &s.used[dev as usize];
    let _lock = ShmLock::acquire(shm, slot + 1);
    let (free, _) = device_info(shm, dev);
    if bytes > free {
        return Err(SimError::OutOfMemory {
            requested: bytes,
            free,
        });
    }
    cell.fetch_add(bytes, Ordering::AcqRel);
    Ok(())
}

/// Releases `bytes` on `dev` held by `slot` (never below zero).
pub fn release(shm: &Shm, slot: u32, dev: u32, bytes: u64) {
    if let Some(cell) = shm.slot(slot).and_then(|s| s.used.get(dev as usize)) {
        let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
    }
}

/// Records a context created (+1) or destroyed (-1) by `slot` on `dev`.
pub fn count_context(shm: &Shm, slot: u32, dev: u32, delta: i32) {
    if let Some(cell) = shm.slot(slot).and_then(|s| s.contexts.get(dev as usize)) {
        let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            Some(v.saturating_add_signed(delta))
        });
    }
}
