//! The container's sidecar (`<region>.sm`, layout in
//! `vgpu_common::sidecar`): mapped once per process, for the limiter and the
//! memory hooks alike.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vgpu_common::shared_file::MapError;
pub(crate) use vgpu_common::sidecar::{path_for, SmShared};

use crate::sigbus_guard::shared as mapfile;

/// Maps (creating if needed) the sidecar at `path`. The mapping is never
/// unmapped (it is shared by the process for its whole life, forks included).
pub(crate) fn open(path: &Path) -> Result<&'static SmShared, MapError> {
    mapfile::open(path)
}

/// The region's path, from which the sidecar's is derived: set once by
/// `config::get` (the sidecar does not read the configuration itself, so
/// that the memory hooks may use it without an import cycle through
/// `state`).
static REGION_PATH: OnceLock<PathBuf> = OnceLock::new();

/// Notes the region's path (the first call wins).
pub(crate) fn set_region_path(region: &Path) {
    let _ = REGION_PATH.set(region.to_path_buf());
}

/// The container's sidecar (buckets, correction, context sizes); `None`
/// when it cannot be used (logged once), or before the configuration was
/// read.
pub(crate) fn shared() -> Option<&'static SmShared> {
    static S: OnceLock<Option<&'static SmShared>> = OnceLock::new();
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

/// A process-private bucket set, when the sidecar cannot be used: the
/// process then takes only its part of the container's limit
/// (`sm::policy::part`).
pub(crate) fn private() -> &'static SmShared {
    let s: &'static SmShared = Box::leak(Box::default());
    let _ = s.init_or_check();
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn create_then_attach() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_for(&dir.path().join("x.cache"));
        let a = open(&p).unwrap();
        let b = open(&p).unwrap();
        a.devs[3].tat.store(42, Relaxed);
        assert_eq!(b.devs[3].tat.load(Relaxed), 42);
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            vgpu_common::sidecar::SIZE as u64
        );
    }

    #[test]
    fn foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("y.sm");
        std::fs::write(&p, vec![7u8; vgpu_common::sidecar::SIZE]).unwrap();
        assert!(matches!(open(&p), Err(MapError::Foreign { .. })));
    }

    #[test]
    fn private_buckets_are_per_call() {
        let (a, b) = (private(), private());
        assert_ne!(a.container_id(), b.container_id());
    }
}
