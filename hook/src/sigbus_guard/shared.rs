//! The hook's own shared file (the container's sidecar), mapped through `vgpu_common::shared_file` for the process's whole life
//! and guarded against truncation.
//!
//! Any process that can write these files can truncate them: the mappings
//! are guarded (`super`), so a truncation re-attaches every process to the
//! file, zeroed, instead of a SIGBUS. Zero is a valid state of the layout
//! (no bucket charged, no plan): the container's processes go on sharing
//! one bucket, and follow the daemon's plan again once it re-writes it.

use std::path::Path;

use vgpu_common::shared_file::{self, MapError, Sizing};
use vgpu_common::sidecar::SmShared;

/// A `#[repr(C)]` layout shared through a file.
///
/// # Safety
/// Every bit pattern must be a valid value (all fields atomics), since the
/// file's bytes are whatever another process wrote.
pub(crate) unsafe trait SharedFile: Sized + Sync + 'static {
    /// What the file is, for the truncation guard's log.
    const KIND: crate::sigbus_guard::Kind;
    /// Who may size the file when it is found short.
    const SIZING: Sizing;

    /// Stamps a zeroed file or checks an existing one's magic and version.
    fn stamp(&self) -> Result<(), (u64, u32)>;
}

// SAFETY: `SmShared` is all atomics (common/src/sidecar.rs asserts its
// layout).
unsafe impl SharedFile for SmShared {
    const KIND: crate::sigbus_guard::Kind = crate::sigbus_guard::Kind::Sidecar;
    const SIZING: Sizing = Sizing::AnyOpener;

    fn stamp(&self) -> Result<(), (u64, u32)> {
        self.init_or_check()
    }
}

/// Maps (creating if needed) the file at `path` as a `T`, for the process's
/// whole life (forks included).
pub(crate) fn open<T: SharedFile>(path: &Path) -> Result<&'static T, MapError> {
    let size = std::mem::size_of::<T>();
    let map = shared_file::create_and_map(path, size, T::SIZING)?;
    let p = map.as_mut_ptr();
    // Never unmapped: the process (and its forks) uses it to the end.
    std::mem::forget(map);
    crate::sigbus_guard::guard(T::KIND, p, size, Some(path), None, 0);
    // SAFETY: the mapping is `size_of::<T>()` bytes, page-aligned, never
    // unmapped, and `T: SharedFile` is valid for any bit pattern with shared
    // access through atomics only.
    let t: &'static T = unsafe { &*(p as *const T) };
    t.stamp().map_err(|(magic, version)| MapError::Foreign {
        path: path.to_owned(),
        magic,
        version,
    })?;
    Ok(t)
}
