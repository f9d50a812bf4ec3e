//! What the region says about compute: the per-device limit, whether to
//! enforce it (`GPU_CORE_UTILIZATION_POLICY` and the monitor's
//! `utilization_switch`), and the monitor's priority feedback
//! (`recent_kernel`: HAMi's monitor sets it negative to block a lower
//! priority, HAMi-core's `rate_limiter`) in the pre-2026 HAMi order: every launch
//! marks activity and obeys blocking; the limit applies only when
//! `0 < limit < 100` and (policy force, or policy default and switch on).

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use vgpu_common::region::rules::{self, SmLimit};
use vgpu_common::region::{policy, SharedRegion, MAX_DEVICES};

/// `recent_kernel` value meaning "launched recently".
pub const ACTIVE: i32 = 2;

/// Whether the limit is enforced under `policy` with the monitor's switch.
pub fn enforced(policy_: i32, switch: i32) -> bool {
    match policy_ {
        policy::FORCE => true,
        policy::DISABLE => false,
        _ => switch == 1,
    }
}

/// One reading of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionReading {
    /// Per device (`None`: no limit there).
    pub limits: [Option<SmLimit>; MAX_DEVICES],
    pub enforce: bool,
    /// The monitor blocks this container (`recent_kernel < 0`).
    pub blocked: bool,
}

impl RegionReading {
    /// Bit `d` set when device `d` has a limit (accounting on).
    pub fn limited_mask(&self) -> u32 {
        self.limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_some())
            .fold(0, |m, (d, _)| m | (1 << d))
    }
}

/// Reads the settings (relaxed loads; the monitor writes with plain atomic
/// stores).
pub fn read(region: &SharedRegion, policy_: i32) -> RegionReading {
    let limits = std::array::from_fn(|d| rules::sm_limit(region.sm_limit[d].load(Relaxed)));
    RegionReading {
        limits,
        enforce: enforced(policy_, region.utilization_switch.load(Relaxed)),
        blocked: region.recent_kernel.load(Relaxed) < 0,
    }
}

/// The container's processes with a slot in the region (at least 1).
pub fn live_processes(region: &SharedRegion) -> u32 {
    let n = region
        .active_slots()
        .iter()
        .filter(|s| s.pid.load(Relaxed) != 0)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}

/// One process's part of a container limit of `pct` shared by `n`
/// processes that cannot share a bucket: `pct / n`, at least 1 % (no limit
/// stays none), so that together they never take more than `pct`
/// (give or take 1 % each).
pub fn part(pct: Option<SmLimit>, n: u32) -> Option<SmLimit> {
    // From 1 to `pct`: always a limit.
    pct.and_then(|p| rules::sm_limit(u64::from((p.percent() / n.max(1)).max(1))))
}

/// Marks that the container launched: `recent_kernel = 2` unless the
/// monitor blocks it (stored only when it differs, so the cache line stays
/// quiet), and `last_kernel_time = max(it, now)` at most once per second
/// (`last_written` is this process's memory of its last write).
pub fn mark_activity(region: &SharedRegion, unix_secs: u64, last_written: &AtomicU64) {
    let rk = region.recent_kernel.load(Relaxed);
    if rk >= 0 && rk != ACTIVE {
        // A CAS, so a concurrent "block" (-1) from the monitor is not lost.
        let _ = region
            .recent_kernel
            .compare_exchange(rk, ACTIVE, Relaxed, Relaxed);
    }
    if last_written.load(Relaxed) < unix_secs {
        last_written.store(unix_secs, Relaxed);
        region.last_kernel_time.fetch_max(unix_secs, Relaxed);
    }
}

/// After a block ends: the launch that waited is activity.
pub fn unblocked(region: &SharedRegion) {
    let _ = region
        .recent_kernel
        .compare_exchange(0, ACTIVE, Relaxed, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_common::view::RegionFile;

    fn region() -> (tempfile::TempDir, RegionFile) {
        let dir = tempfile::tempdir().unwrap();
        let f = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        (dir, f)
    }

    #[test]
    fn limits_and_policy() {
        assert!(enforced(policy::FORCE, 0));
        assert!(!enforced(policy::DISABLE, 1));
        assert!(enforced(policy::DEFAULT, 1));
        assert!(!enforced(policy::DEFAULT, 0));
    }

    #[test]
    fn read_the_region() {
        let (_d, f) = region();
        let r = f.region();
        r.sm_limit[0].store(30, Relaxed);
        r.sm_limit[2].store(100, Relaxed);
        r.sm_limit[3].store(5, Relaxed);
        r.utilization_switch.store(0, Relaxed);
        r.recent_kernel.store(-1, Relaxed);
        let s = read(r, policy::DEFAULT);
        assert_eq!(s.limits[0].map(SmLimit::percent), Some(30));
        assert_eq!(s.limits[2], None);
        assert_eq!(s.limited_mask(), 0b1001);
        assert!(!s.enforce && s.blocked);
        assert!(read(r, policy::FORCE).enforce);
    }

    #[test]
    fn activity_marking() {
        let (_d, f) = region();
        let r = f.region();
        let last = AtomicU64::new(0);
        r.recent_kernel.store(1, Relaxed);
        r.last_kernel_time.store(2_000, Relaxed);
        mark_activity(r, 1_000, &last);
        assert_eq!(r.recent_kernel.load(Relaxed), 2);
        // A monotonic max: an older clock reading never goes back.
        assert_eq!(r.last_kernel_time.load(Relaxed), 2_000);
        mark_activity(r, 3_000, &last);
        assert_eq!(r.last_kernel_time.load(Relaxed), 3_000);
        // Blocked stays blocked.
        r.recent_kernel.store(-1, Relaxed);
        mark_activity(r, 3_001, &last);
        assert_eq!(r.recent_kernel.load(Relaxed), -1);
        r.recent_kernel.store(0, Relaxed);
        unblocked(r);
        assert_eq!(r.recent_kernel.load(Relaxed), 2);
    }
}
