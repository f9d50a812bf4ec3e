//! The limiter's shared files (the container's sidecar, the node's tables):
//! created 0666 next to others' files, grown with zeroes, mapped shared for
//! the process's whole life, and stamped with a magic and a version.
//!
//! Any process that can write these files can truncate them: the mappings
//! are guarded (`crate::mapguard`), so a truncation turns the process's view
//! into a private zeroed copy instead of a SIGBUS. Zero is a valid state of
//! both layouts (no bucket charged, no other member): the process then
//! limits itself alone.

use std::fs::OpenOptions;
use std::ops::RangeInclusive;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: mmap failed: {source}")]
    Map {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a vgpu file of this kind (magic {magic:#x}, version {version})")]
    Foreign {
        path: PathBuf,
        magic: u64,
        version: u32,
    },
}

/// A `#[repr(C)]` layout shared through a file.
///
/// # Safety
/// Every bit pattern must be a valid value (all fields atomics), since the
/// file's bytes are whatever another process wrote.
pub unsafe trait SharedFile: Sized + Sync + 'static {
    /// What the file is, for the truncation guard's log.
    const KIND: crate::mapguard::Kind;

    /// Stamps a zeroed file or checks an existing one's magic and version.
    fn init_or_check(&self) -> Result<(), (u64, u32)>;
}

/// Maps (creating if needed) the file at `path` as a `T`, for the process's
/// whole life (forks included).
pub fn open<T: SharedFile>(path: &Path) -> Result<&'static T, FileError> {
    let p = map(path, std::mem::size_of::<T>(), T::KIND)?;
    // SAFETY: the mapping is `size_of::<T>()` bytes, page-aligned, never
    // unmapped, and `T: SharedFile` is valid for any bit pattern with shared
    // access through atomics only.
    let t: &'static T = unsafe { &*(p as *const T) };
    t.init_or_check()
        .map_err(|(magic, version)| FileError::Foreign {
            path: path.to_owned(),
            magic,
            version,
        })?;
    Ok(t)
}

/// Maps `path` read-write and shared, creating it (mode 0666 whatever the
/// umask: other containers' users share these files) and growing it with
/// zeroes to `size` bytes. The mapping is never unmapped.
fn map(
    path: &Path,
    size: usize,
    kind: crate::mapguard::Kind,
) -> Result<*mut libc::c_void, FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(io)?;
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    if file.metadata().map_err(io)?.len() < size as u64 {
        // Growing with zeroes is idempotent, so racing creators agree.
        file.set_len(size as u64).map_err(io)?;
    }
    // SAFETY: a fresh shared read-write mapping of `size` bytes of a file at
    // least that long; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(FileError::Map {
            path: path.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    crate::mapguard::guard(kind, p as *const u8, size, None, 0);
    Ok(p)
}

/// The header words every shared file starts with.
pub struct Header<'a> {
    pub magic: &'a AtomicU64,
    pub version: &'a AtomicU32,
    pub size: &'a AtomicU32,
}

impl Header<'_> {
    /// Stamps a zeroed file as `(magic, version, size)`, or checks that an
    /// existing one has `magic` and a version in `accepted`; the found
    /// magic and version otherwise.
    pub fn stamp_or_check(
        &self,
        magic: u64,
        version: u32,
        size: usize,
        accepted: RangeInclusive<u32>,
    ) -> Result<(), (u64, u32)> {
        match self.magic.compare_exchange(0, magic, Release, Acquire) {
            Ok(_) => {
                self.version.store(version, Release);
                self.size.store(size as u32, Release);
                Ok(())
            }
            Err(m) if m == magic => {
                // The creator may not have stamped the version yet.
                for _ in 0..1000 {
                    match self.version.load(Acquire) {
                        0 => std::hint::spin_loop(),
                        v if accepted.contains(&v) => return Ok(()),
                        v => return Err((m, v)),
                    }
                }
                Ok(())
            }
            Err(m) => Err((m, self.version.load(Relaxed))),
        }
    }
}
