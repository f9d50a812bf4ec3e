//! The one way vgpu maps or reads a file shared between processes: the
//! region (`view`), the container's sidecar (`sidecar`) and the node's
//! tables (`node`).
//!
//! - [`create_and_map`]: create (mode 0666 whatever the umask: other
//!   containers' users share these files), grow with zeroes, map shared
//!   read-write. The hook's sidecar and node tables.
//! - [`map`]: map an already opened file, read-only or read-write. The
//!   region, which is validated before it is mapped.
//! - [`read_copy`]: copy a layout out of a file with `pread`, never mapping
//!   it. Readers of a file a tenant can truncate (`vgpu turns`), which
//!   would otherwise SIGBUS.
//! - [`Header`]: the magic, version and size words the sidecar and the
//!   node table start with, stamped by the first process and checked by
//!   the others.
//!
//! Every layout mapped or copied through here must be valid for any bit
//! pattern (all fields atomics, no padding): the bytes are whatever another
//! process wrote.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

/// Why a shared file could not be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: mmap failed: {source}")]
    Map {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a vgpu file of this kind (magic {magic:#x}, version {version})")]
    Foreign {
        path: PathBuf,
        magic: u64,
        version: u32,
    },
}

/// Opens `path` read-write, creating it with mode 0666, grows it with
/// zeroes to `size` bytes (idempotent, so racing creators agree) and maps
/// its first `size` bytes shared read-write.
pub fn create_and_map(path: &Path, size: usize) -> Result<MmapRaw, MapError> {
    let io = |source| MapError::Io {
        path: path.to_owned(),
        source,
    };
    let file = open_or_create(path).map_err(io)?;
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    if file.metadata().map_err(io)?.len() < size as u64 {
        file.set_len(size as u64).map_err(io)?;
    }
    map(&file, size, true).map_err(|source| MapError::Map {
        path: path.to_owned(),
        source,
    })
}

/// Opens `path` read-write, creating it (mode 0666 before the umask) if
/// it does not exist; an existing file is never truncated.
pub fn open_or_create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
}

/// Maps the first `len` bytes of `file` shared, read-write or read-only.
pub fn map(file: &File, len: usize, writable: bool) -> io::Result<MmapRaw> {
    let mut opts = MmapOptions::new();
    opts.len(len);
    if writable {
        opts.map_raw(file)
    } else {
        opts.map_raw_read_only(file)
    }
}

/// Why [`read_copy`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Read(#[source] io::Error),
    /// The file ended after this many bytes.
    #[error("the file ends after {0} bytes")]
    Short(u64),
}

/// A layout copied out of a file: the bytes read into a zeroed `T`.
///
/// # Safety
/// `T` must be valid for any bit pattern and have no padding (all fields
/// atomic integers, as the layout's compile-time asserts show).
pub unsafe fn read_copy<T: Default>(file: &File) -> Result<Box<T>, CopyError> {
    let size = std::mem::size_of::<T>();
    let mut t = Box::<T>::default();
    let p = &mut *t as *mut T as *mut u8;
    // SAFETY: `p` points at the `size` bytes of a `T` we own exclusively;
    // the caller guarantees any bytes are a valid `T`.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, size) };
    let mut done = 0;
    while done < size {
        match file.read_at(&mut buf[done..], done as u64) {
            Ok(0) => return Err(CopyError::Short(done as u64)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CopyError::Read(e)),
        }
    }
    Ok(t)
}

/// The header words a stamped shared file starts with.
#[derive(Debug, Clone, Copy)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_file_is_shared_sized_and_world_writable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let a = create_and_map(&p, 4096).unwrap();
        let b = create_and_map(&p, 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes of the same file.
        unsafe {
            a.as_mut_ptr().add(100).write(42);
            assert_eq!(b.as_ptr().add(100).read(), 42);
        }
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.len(), 4096);
        assert_eq!(md.permissions().mode() & 0o777, 0o666);
    }

    #[test]
    fn a_copy_needs_the_whole_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, 7u64.to_le_bytes()).unwrap();
        let f = File::open(&p).unwrap();
        // SAFETY: `AtomicU64` is valid for any bits, no padding.
        let v = unsafe { read_copy::<AtomicU64>(&f) }.unwrap();
        assert_eq!(v.load(Relaxed), 7);
        // SAFETY: as above.
        let short = unsafe { read_copy::<[AtomicU64; 2]>(&f) };
        assert!(matches!(short, Err(CopyError::Short(8))));
    }

    #[test]
    fn a_header_is_stamped_once_and_checked() {
        let (m, v, s) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let h = Header {
            magic: &m,
            version: &v,
            size: &s,
        };
        assert_eq!(h.stamp_or_check(9, 3, 64, 1..=3), Ok(()));
        assert_eq!((v.load(Relaxed), s.load(Relaxed)), (3, 64));
        assert_eq!(h.stamp_or_check(9, 3, 64, 1..=3), Ok(()));
        assert_eq!(h.stamp_or_check(9, 2, 64, 1..=2), Err((9, 3)));
        assert_eq!(h.stamp_or_check(8, 3, 64, 1..=3), Err((9, 3)));
    }
}
