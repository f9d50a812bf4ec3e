//! What the region's values mean, for every reader: the hook that enforces
//! them, the daemon that exports and checks them, and the commands that
//! show them. Each rule is written here once, so that no two readers can
//! disagree about a region (HAMi-core's meanings, `src/multiprocess/` of
//! <https://github.com/Project-HAMi/HAMi-core>).

use core::fmt;
use core::num::NonZeroU8;
use core::sync::atomic::Ordering::SeqCst;

use super::{ProcSlot, SharedRegion, MAX_DEVICES};

/// How an unlimited SM share is shown (metrics, `vgpu top`, `vgpu
/// inspect`, the daemon's expected limits): a whole GPU.
pub const SM_UNLIMITED: u64 = 100;

/// An SM limit in force: a share of the device from 1 to 99 percent. Only
/// [`sm_limit`] makes one, so "no limit" is `None`, never a value that a
/// reader must remember to test for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SmLimit(NonZeroU8);

impl SmLimit {
    /// The limit in percent (1 to 99).
    #[inline]
    pub const fn percent(self) -> u32 {
        self.0.get() as u32
    }
}

impl fmt::Display for SmLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The SM limit an `sm_limit` cell sets, or `None`: 0 (unset) and anything
/// from 100 up mean no limit.
#[inline]
pub const fn sm_limit(raw: u64) -> Option<SmLimit> {
    if raw > 0 && raw < SM_UNLIMITED {
        // raw is 1..=99: it fits a u8 and is not 0.
        match NonZeroU8::new(raw as u8) {
            Some(n) => Some(SmLimit(n)),
            None => None,
        }
    } else {
        None
    }
}

/// What a cell holding a limit in percent (the region's, the hook's own
/// atomics) stores for `limit`: 0 for none, which
/// [`sm_limit`] reads back as `None`.
#[inline]
pub const fn sm_limit_cell(limit: Option<SmLimit>) -> u32 {
    match limit {
        Some(l) => l.percent(),
        None => 0,
    }
}

/// [`sm_limit`] as a percent where [`SM_UNLIMITED`] (100) means none, the
/// one form every reader shows.
#[inline]
pub const fn sm_limit_shown(raw: u64) -> u64 {
    match sm_limit(raw) {
        Some(l) => l.percent() as u64,
        None => SM_UNLIMITED,
    }
}

/// The device-memory limit a `limit` cell sets, in bytes, or `None`: 0
/// means no limit.
#[inline]
pub const fn memory_limit(raw: u64) -> Option<u64> {
    if raw == 0 {
        None
    } else {
        Some(raw)
    }
}

/// The container's usage of `dev`: `total` summed over the live slots
/// (`pid` not 0) of `slots`. Which slots to sum is the caller's: the hook
/// covers every slot it has seen in use, the daemon `proc_num`'s.
pub fn used_by_slots(slots: &[ProcSlot], dev: usize) -> u64 {
    if dev >= MAX_DEVICES {
        return 0;
    }
    slots
        .iter()
        .filter(|s| s.pid.load(SeqCst) != 0)
        .map(|s| s.used[dev].total.load(SeqCst))
        .fold(0u64, u64::saturating_add)
}

impl SharedRegion {
    /// [`sm_limit`] of device `dev` (`None` also past the last device).
    pub fn sm_limit_of(&self, dev: usize) -> Option<SmLimit> {
        self.sm_limit
            .get(dev)
            .and_then(|c| sm_limit(c.load(SeqCst)))
    }

    /// [`memory_limit`] of device `dev` (`None` also past the last device).
    pub fn memory_limit_of(&self, dev: usize) -> Option<u64> {
        self.limit
            .get(dev)
            .and_then(|c| memory_limit(c.load(SeqCst)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_a_hundred_up_are_no_sm_limit() {
        for (raw, want) in [
            (0, None),
            (1, Some(1)),
            (99, Some(99)),
            (100, None),
            (150, None),
        ] {
            assert_eq!(sm_limit(raw).map(SmLimit::percent), want, "{raw}");
            assert_eq!(
                sm_limit(u64::from(sm_limit_cell(sm_limit(raw)))),
                sm_limit(raw)
            );
        }
        assert_eq!(sm_limit(u64::MAX), None);
        assert_eq!(sm_limit_shown(0), 100);
        assert_eq!(sm_limit_shown(150), 100);
        assert_eq!(sm_limit_shown(30), 30);
    }

    #[test]
    fn zero_is_no_memory_limit() {
        assert_eq!(memory_limit(0), None);
        assert_eq!(memory_limit(1 << 30), Some(1 << 30));
    }
}
