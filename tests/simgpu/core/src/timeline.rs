//! The device's execution model and its busy intervals.
//!
//! A device runs one kernel at a time, shared by all processes, in launch
//! order: a kernel starts at `max(now, device busy_until, its stream's
//! previous end)` and ends `duration` later. Launches return at once; the
//! caller sleeps until the end time only when it synchronizes. Every kernel
//! adds a busy interval to the device's ring; a kernel that starts exactly
//! where the same process's previous interval ended extends it, so tight
//! loops of tiny kernels use one entry.

use std::sync::atomic::Ordering;

use crate::lock::ShmLock;
use crate::shm::{owner_word, DeviceState, Shm, RING};
use crate::SimError;

/// Where a launch landed on the device timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// Start of the first kernel (monotonic ns).
    pub start: u64,
    /// End of the last kernel (monotonic ns).
    pub end: u64,
}

/// Schedules kernels of the given durations back to back on `dev` for
/// `slot`, none starting before `not_before` (the stream's previous end).
pub fn schedule(
    shm: &Shm,
    slot: u32,
    dev: u32,
    not_before: u64,
    durations: &[u64],
) -> Result<Scheduled, SimError> {
    let s = shm.slot(slot).ok_or(SimError::NoSlot)?;
    let d = shm.device(dev).ok_or(SimError::InvalidDevice(dev))?;
    let owner = owner_word(slot, s.gen.load(Ordering::Relaxed));
    let _lock = ShmLock::acquire(shm, slot + 1);
    let now = crate::clock::mono_ns();
    let start = now
        .max(d.busy_until.load(Ordering::Acquire))
        .max(not_before);
    let total = durations.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let end = start.saturating_add(total);
    if total > 0 {
        append(d, start, end, owner);
        d.busy_until.store(end, Ordering::Release);
    }
    let n = durations.len() as u64;
    let di = dev as usize;
    d.launches.fetch_add(n, Ordering::Relaxed);
    d.busy_ns.fetch_add(total, Ordering::Relaxed);
    s.launches[di].fetch_add(n, Ordering::Relaxed);
    s.busy_ns[di].fetch_add(total, Ordering::Relaxed);
    Ok(Scheduled { start, end })
}

fn append(d: &DeviceState, start: u64, end: u64, owner: u64) {
    let head = d.head.load(Ordering::Acquire);
    if head > 0 {
        let last = &d.ring[((head - 1) % RING as u64) as usize];
        if last.owner.load(Ordering::Relaxed) == owner && last.end.load(Ordering::Relaxed) == start
        {
            last.end.store(end, Ordering::Release);
            return;
        }
    }
    let e = &d.ring[(head % RING as u64) as usize];
    e.start.store(start, Ordering::Relaxed);
    e.end.store(end, Ordering::Relaxed);
    e.owner.store(owner, Ordering::Relaxed);
    d.head.store(head + 1, Ordering::Release);
}

/// Visits intervals of `dev` newest first while `end > since`: `(start, end,
/// owner)`.
fn for_each_since(d: &DeviceState, since: u64, mut f: impl FnMut(u64, u64, u64)) {
    let head = d.head.load(Ordering::Acquire);
    let oldest = head.saturating_sub(RING as u64 - 1);
    let mut i = head;
    while i > oldest {
        i -= 1;
        let e = &d.ring[(i % RING as u64) as usize];
        let (s, en, o) = (
            e.start.load(Ordering::Relaxed),
            e.end.load(Ordering::Acquire),
            e.owner.load(Ordering::Relaxed),
        );
        if en <= since {
            break;
        }
        f(s, en, o);
    }
}

fn overlap(s: u64, e: u64, from: u64, to: u64) -> u64 {
    e.min(to).saturating_sub(s.max(from))
}

/// Nanoseconds `dev` was busy during `[from, to)`.
pub fn busy_between(shm: &Shm, dev: u32, from: u64, to: u64) -> u64 {
    let Some(d) = shm.device(dev) else { return 0 };
    let mut busy = 0u64;
    for_each_since(d, from, |s, e, _| busy += overlap(s, e, from, to));
    busy
}

/// How many times the device passed from one process's kernels to
/// another's during `[from, to)`: a device time-sliced between processes
/// switches at every batch, one whose processes take turns twice a turn.
pub fn owner_switches(shm: &Shm, dev: u32, from: u64, to: u64) -> u64 {
    let Some(d) = shm.device(dev) else { return 0 };
    let (mut n, mut prev) = (0u64, None);
    for_each_since(d, from, |s, e, owner| {
        if overlap(s, e, from, to) == 0 {
            return;
        }
        if prev.is_some_and(|p| p != owner) {
            n += 1;
        }
        prev = Some(owner);
    });
    n
}

/// Device utilization in percent over the `window_ns` ending now.
pub fn utilization(shm: &Shm, dev: u32, window_ns: u64) -> u32 {
    let now = crate::clock::mono_ns();
    let w = window_ns.max(1);
    let busy = busy_between(shm, dev, now.saturating_sub(w), now);
    ((busy.saturating_mul(100) + w / 2) / w).min(100) as u32
}

/// One process's share of the device in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessBusy {
    /// Slot index.
    pub slot: u32,
    /// Host PID.
    pub pid: u32,
    /// Busy nanoseconds inside the window.
    pub busy_ns: u64,
    /// End of the process's newest interval that has started (monotonic ns,
    /// capped at now).
    pub last_active: u64,
}

/// Processes (still registered) with device activity after `since` (monotonic
/// ns), with their busy time during the `window_ns` ending now.
pub fn process_busy(shm: &Shm, dev: u32, since: u64, window_ns: u64) -> Vec<ProcessBusy> {
    let Some(d) = shm.device(dev) else {
        return Vec::new();
    };
    let now = crate::clock::mono_ns();
    let from = now.saturating_sub(window_ns);
    let mut out: Vec<ProcessBusy> = Vec::new();
    for_each_since(d, since.min(from), |s, e, owner| {
        if s >= now {
            return;
        }
        let slot = (owner >> 32) as u32;
        let Some(sl) = shm.slot(slot) else { return };
        if sl.state.load(Ordering::Acquire) != 1
            || owner_word(slot, sl.gen.load(Ordering::Relaxed)) != owner
        {
            return;
        }
        let busy = overlap(s, e, from, now);
        let active = e > since;
        let entry = match out.iter_mut().find(|p| p.slot == slot) {
            Some(p) => p,
            None => {
                if !active {
                    return;
                }
                out.push(ProcessBusy {
                    slot,
                    pid: sl.pid.load(Ordering::Relaxed),
                    busy_ns: 0,
                    last_active: 0,
                });
                let Some(p) = out.last_mut() else { return };
                p
            }
        };
        entry.busy_ns += busy;
        entry.last_active = entry.last_active.max(e.min(now));
    });
    out
}
