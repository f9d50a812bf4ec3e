//! The container's shared SM-limit state: a small file next to the region
//! (`<region>.sm`), mapped `MAP_SHARED` by every process of the container.
//!
//! The v1.2 region has no spare per-region field, so the token buckets live
//! here, in our own `#[repr(C)]` layout with a magic and a version. HAMi's
//! monitor only reads files ending in `.cache`, so it never sees this one.
//! One bucket per device, each on its own cache line.
//!
//! Each version only gives a name to words that were reserved, and so read
//! zero, in older files; zero means "unknown" in every field. So any file
//! from version `MIN_VERSION` on is used as it is. docs/sm-limit.md
//! ("The sidecar file") lists what each version added.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use vgpu_common::region::MAX_DEVICES;

use super::mapfile::{self, FileError, Header, SharedFile};

/// `"vgpusm01"` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"vgpusm01");
pub const VERSION: u32 = 4;
/// The oldest layout this code reads (its reserved words are zero).
pub const MIN_VERSION: u32 = 1;
/// Set in `ctx_bytes` when a size is stored (a size may be 0).
const CTX_KNOWN: u64 = 1 << 63;

/// One device's bucket (see `bucket`): 64 bytes.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DevBucket {
    /// GCRA "theoretical arrival time": CLOCK_MONOTONIC ns at which the
    /// container's budget is spent (0 = never charged).
    pub tat: AtomicU64,
    /// GPU-ns charged by the container (gain included, refunds and
    /// settlements applied), wrapping; the feedback loop reads its rate.
    pub charged_ns: AtomicU64,
    /// Launches admitted after a wait (diagnostics).
    pub throttled: AtomicU64,
    /// The device's CUDA context size, exactly measured by a process of the
    /// container, `| CTX_KNOWN`; 0 = not measured yet (v2).
    pub ctx_bytes: AtomicU64,
    /// The charge correction, `f64` bits; 0 = 1 (v3, `sm::feedback`).
    pub gain: AtomicU64,
    /// The feedback leader's lease: CLOCK_MONOTONIC ns it runs out, low 20
    /// bits replaced by the leader's pid; 0 = none (v3).
    pub lease: AtomicU64,
    /// CLOCK_MONOTONIC ns of the leader's last measurement (while recent,
    /// the leader publishes every process's measured `sm_util`) (v3).
    pub measured_at: AtomicU64,
    /// While the container runs in turns with others (`sm::phase`):
    /// CLOCK_MONOTONIC ns its admitted work is due to drain (v4).
    pub busy_until: AtomicU64,
}

impl DevBucket {
    /// The context size stored by [`Self::set_ctx_bytes`], if any.
    pub fn ctx_bytes(&self) -> Option<u64> {
        let v = self.ctx_bytes.load(Acquire);
        (v & CTX_KNOWN != 0).then_some(v & !CTX_KNOWN)
    }

    /// The published charge correction.
    pub fn gain(&self) -> f64 {
        super::feedback::decode(self.gain.load(Relaxed))
    }

    /// Stores an exactly measured context size (the last writer wins; all
    /// writers measured the same thing).
    pub fn set_ctx_bytes(&self, bytes: u64) {
        self.ctx_bytes
            .store((bytes & !CTX_KNOWN) | CTX_KNOWN, Release);
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
    /// The container's id in the node's tables (`sm::node`), drawn by its
    /// first process; 0 = not yet (v4).
    pub container: AtomicU64,
    pub reserved: [AtomicU64; 5],
    pub devs: [DevBucket; MAX_DEVICES],
}

impl SmShared {
    /// The container's id, drawn at random by the first process to ask.
    pub fn container_id(&self) -> u64 {
        let id = self.container.load(Acquire);
        if id != 0 {
            return id;
        }
        let mut v = 0u64;
        // SAFETY: `v` is a live local of 8 bytes; getrandom writes at most
        // that many.
        let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
        if n != 8 || v == 0 {
            // No entropy yet (early boot): the clock and pid still tell
            // containers apart.
            v = (std::process::id() as u64) << 40 ^ now_ns() | 1;
        }
        match self.container.compare_exchange(0, v, AcqRel, Acquire) {
            Ok(_) => v,
            Err(other) => other,
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

pub const SIZE: usize = std::mem::size_of::<SmShared>();

const _: () = {
    assert!(std::mem::size_of::<DevBucket>() == 64);
    assert!(SIZE == 64 + 64 * MAX_DEVICES);
    assert!(std::mem::offset_of!(SmShared, container) == 16);
    assert!(std::mem::offset_of!(SmShared, devs) == 64);
    assert!(std::mem::offset_of!(DevBucket, busy_until) == 56);
};

pub type SidecarError = FileError;

/// The sidecar path of a region file.
pub fn path_for(region: &Path) -> PathBuf {
    let mut s = region.as_os_str().to_owned();
    s.push(".sm");
    PathBuf::from(s)
}

/// Maps (creating if needed) the sidecar at `path`. The mapping is never
/// unmapped (it is shared by the process for its whole life, forks included).
pub fn open(path: &Path) -> Result<&'static SmShared, SidecarError> {
    mapfile::open(path)
}

// SAFETY: `SmShared` is all atomics.
unsafe impl SharedFile for SmShared {
    const KIND: crate::mapguard::Kind = crate::mapguard::Kind::Sidecar;

    fn init_or_check(&self) -> Result<(), (u64, u32)> {
        init_or_check(self)
    }
}

/// Stamps a zeroed file, or checks an existing one.
pub fn init_or_check(s: &SmShared) -> Result<(), (u64, u32)> {
    let h = Header {
        magic: &s.magic,
        version: &s.version,
        size: &s.size,
    };
    h.stamp_or_check(MAGIC, VERSION, SIZE, MIN_VERSION..=VERSION)
}

/// The region's path, from which the sidecar's is derived: set once by
/// `state::config` (the sidecar does not read the configuration itself, so
/// that the memory hooks may use it without an import cycle through
/// `state`).
static REGION_PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Notes the region's path (the first call wins).
pub fn set_region_path(region: &Path) {
    let _ = REGION_PATH.set(region.to_path_buf());
}

/// The container's sidecar (buckets, gains, context sizes), mapped once
/// per process for the limiter and the memory hooks alike; `None` when it
/// cannot be used (logged once), or before the configuration was read.
pub fn shared() -> Option<&'static SmShared> {
    static S: std::sync::OnceLock<Option<&'static SmShared>> = std::sync::OnceLock::new();
    let region = REGION_PATH.get()?;
    *S.get_or_init(|| {
        let path = path_for(region);
        open(&path)
            .map_err(|e| {
                vlog!(
                    crate::log::WARN,
                    "{e}; measured context sizes are not shared with the container"
                )
            })
            .ok()
    })
}

/// A process-private bucket set, when the sidecar cannot be used (the limit
/// then holds per process instead of per container).
pub fn private() -> &'static SmShared {
    let s: &'static SmShared = Box::leak(Box::default());
    let _ = init_or_check(s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when the sidecar's layout drifts from `hook/abi.snapshot`
    /// (`cargo xtask abi --bless` rewrites it).
    #[test]
    fn abi_snapshot() {
        let mut s = String::from("# cargo xtask abi --bless rewrites this file\n");
        vgpu_common::abi_layout!(
            &mut s,
            DevBucket {
                tat,
                charged_ns,
                throttled,
                ctx_bytes,
                gain,
                lease,
                measured_at,
                busy_until,
            }
        );
        vgpu_common::abi_layout!(
            &mut s,
            SmShared {
                magic,
                version,
                size,
                container,
                reserved,
                devs
            }
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("abi.snapshot");
        if let Err(e) = vgpu_common::abi::check(&path, &s) {
            panic!("{e}");
        }
    }

    #[test]
    fn create_then_attach() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_for(&dir.path().join("x.cache"));
        assert!(p.to_string_lossy().ends_with("x.cache.sm"));
        let a = open(&p).unwrap();
        let b = open(&p).unwrap();
        a.devs[3].tat.store(42, Relaxed);
        assert_eq!(b.devs[3].tat.load(Relaxed), 42);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), SIZE as u64);
    }

    #[test]
    fn ctx_bytes_round_trip_and_v1_files_are_accepted() {
        let s = private();
        assert_eq!(s.devs[1].ctx_bytes(), None);
        s.devs[1].set_ctx_bytes(0);
        assert_eq!(s.devs[1].ctx_bytes(), Some(0));
        s.devs[1].set_ctx_bytes(64 << 20);
        assert_eq!(s.devs[1].ctx_bytes(), Some(64 << 20));
        let v1 = SmShared::default();
        v1.magic.store(MAGIC, Relaxed);
        v1.version.store(1, Relaxed);
        assert!(init_or_check(&v1).is_ok());
        assert_eq!(v1.devs[0].ctx_bytes(), None);
        assert_eq!(v1.devs[0].gain(), 1.0);
        v1.version.store(2, Relaxed);
        assert!(init_or_check(&v1).is_ok());
        v1.version.store(4, Relaxed);
        assert!(init_or_check(&v1).is_ok());
        v1.version.store(5, Relaxed);
        assert!(init_or_check(&v1).is_err());
    }

    #[test]
    fn the_container_id_is_drawn_once() {
        let s = private();
        let id = s.container_id();
        assert_ne!(id, 0);
        assert_eq!(s.container_id(), id);
        assert_ne!(private().container_id(), id);
    }

    #[test]
    fn foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("y.sm");
        std::fs::write(&p, vec![7u8; SIZE]).unwrap();
        assert!(matches!(open(&p), Err(SidecarError::Foreign { .. })));
    }
}
