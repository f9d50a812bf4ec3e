//! The region's usage counters and limits, lock-free: the words the limit
//! check reads and writes. The check itself, where an allocation is
//! refused, is `crate::memory::limit`.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicU64, AtomicUsize};

use vgpu_common::region::{rules, ProcSlot, SharedRegion, MAX_PROCS};

/// The highest slot count this process has seen in use (registration and
/// reclaim scans read every slot): the usage sum covers at least these
/// slots, so lowering `proc_num` in the file hides no slot already seen.
static SEEN_SLOTS: AtomicUsize = AtomicUsize::new(0);

/// Raises the bound of [`container_used`] to `n` slots.
pub fn see_slots(n: usize) {
    SEEN_SLOTS.fetch_max(n.min(MAX_PROCS), Relaxed);
}

/// The slots the usage sum covers: `proc_num`, but never fewer than seen.
fn summed(region: &SharedRegion) -> &[ProcSlot] {
    let n = region.proc_count().max(SEEN_SLOTS.load(Relaxed));
    region.procs.get(..n).unwrap_or(&region.procs)
}

/// Which `device_memory_t` field an amount belongs to; `total` is always
/// the sum of the three. `Module` is GPU code and its data, measured from
/// NVML (`crate::memory::modules`): module loads themselves are not hooked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Context,
    Module,
    Data,
}

fn field(slot: &ProcSlot, dev: usize, kind: Kind) -> Option<(&AtomicU64, &AtomicU64)> {
    let m = slot.used.get(dev)?;
    let f = match kind {
        Kind::Context => &m.context_size,
        Kind::Module => &m.module_size,
        Kind::Data => &m.data_size,
    };
    Some((f, &m.total))
}

/// Counts one successful launch of the slot's process on `dev`: one
/// relaxed increment (only this process writes its slot's counter, readers
/// want a rate, not an order).
#[inline]
pub fn count_launch(slot: &ProcSlot, dev: usize) {
    if let Some(m) = slot.used.get(dev) {
        m.launches.fetch_add(1, Relaxed);
    }
}

/// Adds `bytes` to the slot (seqlock odd during the update, for HAMi's
/// readers).
pub fn add(slot: &ProcSlot, dev: usize, bytes: u64, kind: Kind) {
    let Some((f, total)) = field(slot, dev, kind) else {
        return;
    };
    slot.seqlock.fetch_add(1, SeqCst);
    total.fetch_add(bytes, SeqCst);
    f.fetch_add(bytes, SeqCst);
    slot.seqlock.fetch_add(1, SeqCst);
}

fn saturating_sub(a: &AtomicU64, bytes: u64) -> u64 {
    match a.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes))) {
        Ok(old) | Err(old) => old.min(bytes),
    }
}

/// Subtracts `bytes`, never below zero (an underflow is logged once and
/// the counter stays at 0). `total` loses exactly what the kind field lost.
pub fn sub(slot: &ProcSlot, dev: usize, bytes: u64, kind: Kind) {
    let Some((f, total)) = field(slot, dev, kind) else {
        return;
    };
    slot.seqlock.fetch_add(1, SeqCst);
    let removed = saturating_sub(f, bytes);
    saturating_sub(total, removed);
    slot.seqlock.fetch_add(1, SeqCst);
    if removed < bytes {
        vlog_once!(
            crate::log::WARN,
            "usage counter of device {dev} would go below zero ({kind:?}: -{bytes}, had {removed}); clamped at 0"
        );
    }
}

/// The container's usage of `dev` ([`rules::used_by_slots`] over every
/// slot seen in use).
pub fn container_used(region: &SharedRegion, dev: usize) -> u64 {
    rules::used_by_slots(summed(region), dev)
}

/// The limit of `dev` in bytes ([`rules::memory_limit`]).
pub fn limit(region: &SharedRegion, dev: usize) -> Option<u64> {
    region.memory_limit_of(dev)
}
