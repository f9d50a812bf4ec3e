//! The container's shared SM-limit state: a small file next to the region
//! (`<region>.sm`), mapped `MAP_SHARED` by every process of the container
//! (the hook's `sidecar.rs` maps it; docs/sm-limit.md, "The sidecar
//! file").
//!
//! The v1.2 region has no spare per-region field, so the token buckets live
//! here, in our own `#[repr(C)]` layout with a magic and a version. HAMi's
//! monitor only reads files ending in `.cache`, so it never sees this one.
//! One bucket per device, each on its own cache line.
//!
//! Each version only gives a name to words that were reserved, and so read
//! zero, in older files; zero means "unknown" in every field. So any file
//! from version `MIN_VERSION` on is used as it is. Version 5 appends the
//! daemon's plan per device (`DevPlan`), which a version-4 file lacks until
//! a newer hook extends it (the daemon writes only into a file that long).
//!
//! The plan is the only word from outside the container that decides the
//! container's turns and priority holds: `vgpu daemon` writes it
//! (`loader/src/daemon/plan/`), from the runtime specs and NVML, into each
//! container's own sidecar; the hook reads nothing of any other container's.

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::region::MAX_DEVICES;
use crate::shared_file::Header;

/// `"vgpusm01"` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"vgpusm01");
pub const VERSION: u32 = 5;
/// The oldest layout this code reads (its reserved words are zero).
pub const MIN_VERSION: u32 = 1;
/// Set in `ctx_bytes` when a size is stored (a size may be 0).
const CTX_KNOWN: u64 = 1 << 63;

/// One device's bucket (`hook/src/sm/admission/gcra.rs`): 64 bytes.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DevBucket {
    /// GCRA "theoretical arrival time": CLOCK_MONOTONIC ns at which the
    /// container's budget is spent (0 = never charged).
    pub tat: AtomicU64,
    /// GPU-ns charged by the container (correction included, refunds and
    /// settlements applied), wrapping; the feedback loop reads its rate.
    pub charged_ns: AtomicU64,
    /// Launches admitted after a wait (diagnostics).
    pub throttled: AtomicU64,
    /// The device's CUDA context size, exactly measured by a process of the
    /// container, `| CTX_KNOWN`; 0 = not measured yet (v2).
    pub ctx_bytes: AtomicU64,
    /// The correction factor on every charge, `f64` bits; 0 = 1 (v3;
    /// `hook/src/sm/correction/mod.rs`).
    pub gain: AtomicU64,
    /// The feedback leader's lease: CLOCK_MONOTONIC ns it runs out, low 20
    /// bits replaced by the leader's pid; 0 = none (v3).
    pub lease: AtomicU64,
    /// CLOCK_MONOTONIC ns of the leader's last measurement (while recent,
    /// the leader publishes every process's measured `sm_util`) (v3).
    pub measured_at: AtomicU64,
    /// While the container runs in turns with others: CLOCK_MONOTONIC ns
    /// its admitted work is due to drain (v4).
    pub busy_until: AtomicU64,
}

impl DevBucket {
    /// The context size stored by [`Self::set_ctx_bytes`], if any.
    pub fn ctx_bytes(&self) -> Option<u64> {
        let v = self.ctx_bytes.load(Acquire);
        (v & CTX_KNOWN != 0).then_some(v & !CTX_KNOWN)
    }

    /// Stores an exactly measured context size (the last writer wins; all
    /// writers measured the same thing).
    pub fn set_ctx_bytes(&self, bytes: u64) {
        self.ctx_bytes
            .store((bytes & !CTX_KNOWN) | CTX_KNOWN, Release);
    }
}

/// One device's plan (v5): the first line is written by the daemon only
/// (`pwrite`, under `seq`), the second by the container's hook, for the
/// daemon to read. 128 bytes.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DevPlan {
    /// Odd while the daemon writes the line; readers retry or keep their
    /// last plan (`DevPlan::read`).
    pub seq: AtomicU64,
    /// CLOCK_MONOTONIC ns until which the plan stands; a plan past it (or
    /// 0: never planned) means no daemon plans this GPU, and the container
    /// keeps to its own SM limit alone.
    pub planned_until: AtomicU64,
    /// The container's turn (`node::encode_turn`); 0 = none.
    pub turn: AtomicU64,
    /// Until when a container of higher priority counts as active on the
    /// GPU: this one keeps its queue short.
    pub hold_until: AtomicU64,
    /// When the higher containers' queued work drains, as they state it,
    /// bounded by the daemon: this one queues nothing before.
    pub high_inflight_until: AtomicU64,
    /// Until when a block by HAMi's monitor may be about a higher container
    /// (it lags activity by seconds): the hold answers it instead.
    pub outranked_until: AtomicU64,
    pub daemon_reserved: [AtomicU64; 2],
    /// CLOCK_MONOTONIC ns of the container's last accounted launch here.
    pub launched: AtomicU64,
    /// CLOCK_MONOTONIC ns the container last used most of its share.
    pub wants: AtomicU64,
    /// CLOCK_MONOTONIC ns its queued work drains, by its learnt costs.
    pub inflight_until: AtomicU64,
    pub hook_reserved: [AtomicU64; 5],
}

/// The daemon's line of a [`DevPlan`], as one consistent reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanWords {
    pub planned_until: u64,
    pub turn: u64,
    pub hold_until: u64,
    pub high_inflight_until: u64,
    pub outranked_until: u64,
}

impl PlanWords {
    /// The words in file order after `seq`, as the daemon writes them.
    pub fn to_bytes(self) -> [u8; 40] {
        let mut b = [0u8; 40];
        let w = [
            self.planned_until,
            self.turn,
            self.hold_until,
            self.high_inflight_until,
            self.outranked_until,
        ];
        for (i, v) in w.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// What the hook states about its own activity (a [`DevPlan`]'s second
/// line), as the daemon reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnWords {
    pub launched: u64,
    pub wants: u64,
    pub inflight_until: u64,
}

impl OwnWords {
    /// Decodes the line's first 24 bytes.
    pub fn from_bytes(b: &[u8; 24]) -> Self {
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        Self {
            launched: w(0),
            wants: w(1),
            inflight_until: w(2),
        }
    }
}

impl DevPlan {
    /// The daemon's words, read consistently (a few tries while the daemon
    /// writes); `None` when no consistent reading was had.
    pub fn read(&self) -> Option<PlanWords> {
        for _ in 0..4 {
            let s1 = self.seq.load(Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let w = PlanWords {
                planned_until: self.planned_until.load(Acquire),
                turn: self.turn.load(Acquire),
                hold_until: self.hold_until.load(Acquire),
                high_inflight_until: self.high_inflight_until.load(Acquire),
                outranked_until: self.outranked_until.load(Acquire),
            };
            std::sync::atomic::fence(Acquire);
            if self.seq.load(Relaxed) == s1 {
                return Some(w);
            }
        }
        None
    }

    /// Moves the instant `w` forward to `now` (never back: several
    /// processes of the container write it).
    pub fn advance(w: &AtomicU64, now: u64) {
        w.fetch_max(now, Relaxed);
    }

    /// Notes `cost_ns` of work queued at `now`: it drains at
    /// `max(inflight_until, now) + cost`.
    pub fn queued(&self, now: u64, cost_ns: u64) {
        let _ = self.inflight_until.fetch_update(Relaxed, Relaxed, |t| {
            Some(t.max(now).saturating_add(cost_ns))
        });
    }
}

/// The whole file.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SmShared {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    /// `size_of::<SmShared>()` as written by the creator.
    pub size: AtomicU32,
    /// The container's own id, drawn by its first process; 0 = not yet
    /// (v4).
    pub container: AtomicU64,
    pub reserved: [AtomicU64; 5],
    pub devs: [DevBucket; MAX_DEVICES],
    /// The daemon's plan per device (v5).
    pub plans: [DevPlan; MAX_DEVICES],
}

pub const SIZE: usize = std::mem::size_of::<SmShared>();
/// Where the plans start in the file.
pub const PLANS_AT: usize = 64 + 64 * MAX_DEVICES;
/// A plan's size in the file.
pub const PLAN_BYTES: usize = 128;
/// The daemon's words within a plan, after `seq` (at 0).
pub const PLAN_WORDS_AT: usize = 8;
/// The hook's words within a plan.
pub const OWN_WORDS_AT: usize = 64;

/// The file offset of device `dev`'s plan.
pub fn plan_at(dev: usize) -> u64 {
    (PLANS_AT + dev * PLAN_BYTES) as u64
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<DevBucket>() == 64);
    assert!(align_of::<DevBucket>() == 64);
    assert!(offset_of!(DevBucket, tat) == 0);
    assert!(offset_of!(DevBucket, charged_ns) == 8);
    assert!(offset_of!(DevBucket, throttled) == 16);
    assert!(offset_of!(DevBucket, ctx_bytes) == 24);
    assert!(offset_of!(DevBucket, gain) == 32);
    assert!(offset_of!(DevBucket, lease) == 40);
    assert!(offset_of!(DevBucket, measured_at) == 48);
    assert!(offset_of!(DevBucket, busy_until) == 56);
    assert!(offset_of!(SmShared, magic) == 0);
    assert!(offset_of!(SmShared, version) == 8);
    assert!(offset_of!(SmShared, size) == 12);
    assert!(offset_of!(SmShared, container) == 16);
    assert!(offset_of!(SmShared, reserved) == 24);
    assert!(offset_of!(SmShared, devs) == 64);
    assert!(size_of::<DevPlan>() == 128);
    assert!(offset_of!(DevPlan, seq) == 0);
    assert!(offset_of!(DevPlan, planned_until) == PLAN_WORDS_AT);
    assert!(offset_of!(DevPlan, outranked_until) == 40);
    assert!(offset_of!(DevPlan, launched) == OWN_WORDS_AT);
    assert!(offset_of!(DevPlan, inflight_until) == 80);
    assert!(offset_of!(SmShared, plans) == PLANS_AT);
    assert!(SIZE == 64 + 64 * MAX_DEVICES + 128 * MAX_DEVICES);
};

impl SmShared {
    /// The container's id, drawn at random by the first process to ask.
    pub fn container_id(&self) -> u64 {
        let id = self.container.load(Acquire);
        if id != 0 {
            return id;
        }
        // Random keys from std (which reads the kernel's randomness without
        // needing glibc's `getrandom`, absent before 2.25: a direct call made
        // the hook unloadable on older images), mixed with the pid and the
        // clock, which alone still tell containers apart.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u64(now_ns());
        let v = h.finish() | 1;
        match self.container.compare_exchange(0, v, AcqRel, Acquire) {
            Ok(_) => v,
            Err(other) => other,
        }
    }

    /// Stamps a zeroed file, or checks an existing one's magic and version
    /// (the found ones otherwise).
    pub fn init_or_check(&self) -> Result<(), (u64, u32)> {
        let h = Header {
            magic: &self.magic,
            version: &self.version,
            size: &self.size,
        };
        h.stamp_or_check(MAGIC, VERSION, SIZE, MIN_VERSION..=VERSION)
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// The sidecar path of a region file.
pub fn path_for(region: &Path) -> PathBuf {
    let mut s = region.as_os_str().to_owned();
    s.push(".sm");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn ctx_bytes_round_trip_and_older_files_are_accepted() {
        let s = SmShared::default();
        assert!(s.init_or_check().is_ok());
        assert_eq!(s.devs[1].ctx_bytes(), None);
        s.devs[1].set_ctx_bytes(0);
        assert_eq!(s.devs[1].ctx_bytes(), Some(0));
        s.devs[1].set_ctx_bytes(64 << 20);
        assert_eq!(s.devs[1].ctx_bytes(), Some(64 << 20));
        let v1 = SmShared::default();
        v1.magic.store(MAGIC, Relaxed);
        v1.version.store(1, Relaxed);
        assert!(v1.init_or_check().is_ok());
        assert_eq!(v1.devs[0].ctx_bytes(), None);
        assert_eq!(v1.devs[0].gain.load(Relaxed), 0, "reads as no correction");
        v1.version.store(2, Relaxed);
        assert!(v1.init_or_check().is_ok());
        v1.version.store(4, Relaxed);
        assert!(v1.init_or_check().is_ok());
        v1.version.store(5, Relaxed);
        assert!(v1.init_or_check().is_ok());
        v1.version.store(6, Relaxed);
        assert_eq!(v1.init_or_check(), Err((MAGIC, 6)));
    }

    #[test]
    fn a_plan_is_read_whole_or_not_at_all() {
        let s = SmShared::default();
        let p = &s.plans[2];
        assert_eq!(p.read(), Some(PlanWords::default()));
        p.turn.store(7, Relaxed);
        p.seq.store(1, Relaxed);
        assert_eq!(p.read(), None, "the daemon is writing");
        p.seq.store(2, Relaxed);
        assert_eq!(p.read().map(|w| w.turn), Some(7));
        // The bytes the daemon writes land on the words the hook reads.
        let w = PlanWords {
            planned_until: 1,
            turn: 2,
            hold_until: 3,
            high_inflight_until: 4,
            outranked_until: 5,
        };
        let b = w.to_bytes();
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        p.queued(100, 5);
        p.queued(90, 5);
        assert_eq!(p.inflight_until.load(Relaxed), 110);
        let mut own = [0u8; 24];
        own[16..].copy_from_slice(&110u64.to_le_bytes());
        assert_eq!(OwnWords::from_bytes(&own).inflight_until, 110);
    }

    #[test]
    fn the_container_id_is_drawn_once() {
        let s = SmShared::default();
        let id = s.container_id();
        assert_ne!(id, 0);
        assert_eq!(s.container_id(), id);
        assert_ne!(SmShared::default().container_id(), id);
    }

    #[test]
    fn the_path_is_next_to_the_region() {
        let p = path_for(Path::new("/tmp/vgpu/x.cache"));
        assert_eq!(p, Path::new("/tmp/vgpu/x.cache.sm"));
    }
}
