//! Where an allocation is refused: the container-wide memory limit.
//!
//! Every entry point that takes device memory calls [`reserve`] before the
//! driver (or, for a size known only afterwards, right after it); `None`
//! becomes `CUDA_ERROR_OUT_OF_MEMORY`. The [`Reservation`] it returns is
//! taken back when dropped (the driver call failed, the caller returned
//! early) unless committed, so no error path can leak a count. This module
//! is the one writer of the process's own counters: [`reserve`] on the way
//! in, [`release_counted`] (a free) on the way out, each updating the slot and the
//! shadow together. The shared words themselves (slot counters, limits) are
//! `crate::region::usage`'s.
//!
//! Reservation is optimistic (Dekker style, every access `SeqCst`): a
//! process first *adds* the request to its own slot, then sums `total` over
//! every live slot. If the sum passes the limit it takes the request back
//! and fails. Of two processes reserving at once, at least one sees the
//! other's addition (both add before they read, in one total order), so two
//! can both fail spuriously ([`reserve`] retries a few times) but can never
//! both pass the limit. No lock, no syscall.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use vgpu_common::region::{SharedRegion, MAX_DEVICES};

use crate::region::attach::monotonic_ms;
use crate::region::usage::{self, Kind};
use crate::region::Attachment;
use crate::world::{self, Clock, NodeFiles};

/// Optimistic reservation attempts before an allocation is refused.
const RESERVE_ATTEMPTS: u32 = 4;
/// The first wait between two attempts (doubled each time).
const BACKOFF_NS: u64 = 50_000;

/// Bytes of one kind on one device, counted in this process's slot and in
/// its shadow by [`reserve`]: taken back when dropped, unless
/// [`Reservation::commit`]ted once the driver call succeeded. A value on
/// the stack: no lock, no allocation.
#[must_use = "a reservation is taken back when dropped; commit it once the driver call succeeded"]
pub struct Reservation<'a> {
    att: &'a Attachment,
    dev: usize,
    bytes: u64,
    kind: Kind,
}

impl Reservation<'_> {
    /// Keeps the bytes counted; the free of the object releases them
    /// ([`release_counted`]).
    #[inline]
    pub fn commit(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        release_counted(self.att, self.dev, self.bytes, self.kind);
    }
}

/// Counts `bytes` of `kind` on `dev` if the container stays within the
/// limit; `None` (nothing counted) refuses the allocation. Retries a few
/// times (another process may have been mid-reservation) and reclaims dead
/// processes' slots once before refusing.
pub fn reserve(att: &Attachment, dev: usize, bytes: u64, kind: Kind) -> Option<Reservation<'_>> {
    crate::suspend::ensure_running();
    let region = att.region();
    let mut reclaimed = false;
    // A region file renamed over ours: join it (at most one `stat` a second).
    let world = world::live();
    world.follow_files(world.now());
    att.republish_if_wiped();
    att.see_limit(dev);
    for attempt in 0..RESERVE_ATTEMPTS {
        if try_reserve(region, att.slot_index(), dev, bytes, kind) {
            if att.wiped() {
                // Truncated meanwhile: the limit read may have been the
                // wiped file's 0 ("none"). Take it back, republish, retry.
                if let Some(s) = region.procs.get(att.slot_index()) {
                    usage::sub(s, dev, bytes, kind);
                }
                att.republish_if_wiped();
                continue;
            }
            att.note_reserved(dev, bytes, kind);
            return Some(Reservation {
                att,
                dev,
                bytes,
                kind,
            });
        }
        if !reclaimed {
            reclaimed = true;
            if att.reclaim() > 0 {
                continue;
            }
        }
        world.sleep_until(world.now().saturating_add(BACKOFF_NS << attempt));
    }
    refused_log(
        dev,
        bytes,
        usage::container_used(region, dev),
        usage::limit(region, dev).unwrap_or(0),
    );
    None
}

/// [`reserve`] and keep: for tests that count without a driver call.
#[cfg(test)]
pub fn reserve_committed(att: &Attachment, dev: usize, bytes: u64, kind: Kind) -> bool {
    reserve(att, dev, bytes, kind)
        .map(Reservation::commit)
        .is_some()
}

/// Takes back `bytes` of `kind` on `dev` that a committed [`Reservation`]
/// counted (the object was freed), from the slot and the shadow.
pub fn release_counted(att: &Attachment, dev: usize, bytes: u64, kind: Kind) {
    if let Some(s) = att.region().procs.get(att.slot_index()) {
        usage::sub(s, dev, bytes, kind);
        att.note_released(dev, bytes, kind);
    }
}

/// One optimistic attempt: true when `bytes` are now counted in `slot` and
/// the container stays within the limit; false (nothing counted) otherwise.
pub fn try_reserve(region: &SharedRegion, slot: usize, dev: usize, bytes: u64, kind: Kind) -> bool {
    let Some(s) = region.procs.get(slot) else {
        return false;
    };
    if dev >= MAX_DEVICES {
        return false;
    }
    let lim = usage::limit(region, dev);
    if lim.is_some_and(|l| bytes > l) {
        return false;
    }
    usage::add(s, dev, bytes, kind);
    if lim.is_none_or(|l| usage::container_used(region, dev) <= l) {
        return true;
    }
    usage::sub(s, dev, bytes, kind);
    false
}

/// Refusals are frequent where frameworks probe for memory: the first one
/// per device is a warning, later ones are debug lines, and their count is
/// summarised as a warning at most once per [`REFUSAL_SUMMARY`].
const REFUSAL_SUMMARY: Duration = Duration::from_secs(10);

struct Refusals {
    /// Refusals not yet summarised (the first one is never counted here).
    pending: AtomicU64,
    /// Monotonic ms of the last summary (or of the first refusal); 0 = none yet.
    last_ms: AtomicU64,
}

static REFUSALS: [Refusals; MAX_DEVICES] = [const {
    Refusals {
        pending: AtomicU64::new(0),
        last_ms: AtomicU64::new(0),
    }
}; MAX_DEVICES];

/// What to log for a refusal at `now_ms`: `Some(n)` = a warning (`n`
/// refusals summarised; 0 for the first), `None` = a debug line.
fn refusal_action(r: &Refusals, now_ms: u64) -> Option<u64> {
    let last = r.last_ms.load(Relaxed);
    if last == 0
        && r.last_ms
            .compare_exchange(0, now_ms, Relaxed, Relaxed)
            .is_ok()
    {
        return Some(0);
    }
    r.pending.fetch_add(1, Relaxed);
    let last = r.last_ms.load(Relaxed);
    if now_ms.saturating_sub(last) >= REFUSAL_SUMMARY.as_millis() as u64
        && r.last_ms
            .compare_exchange(last, now_ms, Relaxed, Relaxed)
            .is_ok()
    {
        return Some(r.pending.swap(0, Relaxed));
    }
    None
}

fn refused_log(dev: usize, bytes: u64, used: u64, limit: u64) {
    let Some(r) = REFUSALS.get(dev) else {
        return;
    };
    match refusal_action(r, monotonic_ms()) {
        Some(0) => vlog!(
            crate::log::WARN,
            "device {dev}: {bytes} bytes refused, container uses {used} of limit {limit} \
             (further refusals are logged at debug level, counted every {REFUSAL_SUMMARY:?})"
        ),
        Some(n) => vlog!(
            crate::log::WARN,
            "device {dev}: {n} allocations refused since the last report; latest {bytes} bytes, \
             container uses {used} of limit {limit}"
        ),
        None => vlog!(
            crate::log::DEBUG,
            "device {dev}: {bytes} bytes refused, container uses {used} of limit {limit}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_warn_once_then_summarise_every_ten_seconds() {
        let r = Refusals {
            pending: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        };
        assert_eq!(refusal_action(&r, 1), Some(0));
        for t in 2..1000 {
            assert_eq!(refusal_action(&r, t), None);
        }
        assert_eq!(refusal_action(&r, 10_001), Some(999));
        assert_eq!(refusal_action(&r, 10_002), None);
        assert_eq!(refusal_action(&r, 20_000), None);
        assert_eq!(refusal_action(&r, 20_001), Some(3));
    }
}
