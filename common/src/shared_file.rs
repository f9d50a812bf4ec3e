//! The one way vgpu maps or reads a file shared between processes: the
//! region (`view`) and the container's sidecar (`sidecar`).
//!
//! - [`create_and_map`]: create (mode 0666 whatever the umask: other
//!   containers' users share these files) and size, or open what another
//!   process created (never a symlink, FIFO or device, never chmod-ed;
//!   resized only where [`Sizing`] allows), and map shared read-write. The
//!   hook's sidecar.
//! - [`map`]: map an already opened file, read-only or read-write. The
//!   region, which is validated before it is mapped.
//! - [`read_copy`]: copy a layout out of a file with `pread`, never mapping
//!   it. Readers of a file a tenant can truncate, which would otherwise
//!   SIGBUS.
//! - [`Header`]: the magic, version and size words the sidecar starts
//!   with, stamped by the first process and checked by the others.
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

/// How long [`create_and_map`] waits for another process that just created
/// the file to size it.
const SIZED_WITHIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Who may size an existing file [`create_and_map`] finds too short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// Only its creator: a file in a directory other tenants write (the
    /// node's tables) is never resized by anyone else; one shorter than
    /// the layout is waited for (its creator is sizing it) for at most
    /// [`SIZED_WITHIN`], then refused.
    CreatorOnly,
    /// Any opener: a file in the container's own directory (the sidecar),
    /// which a sibling may have left short, is extended with zeroes.
    AnyOpener,
}

/// Opens `path` read-write, creating it with mode 0666 and sizing it with
/// zeroes to `size` bytes when this call creates it, and maps its first
/// `size` bytes shared read-write. A file that exists is never chmod-ed
/// ([`open_or_create`] refuses what is not a plain file); `sizing` says
/// whether one shorter than `size` may be extended.
pub fn create_and_map(path: &Path, size: usize, sizing: Sizing) -> Result<MmapRaw, MapError> {
    let io = |source| MapError::Io {
        path: path.to_owned(),
        source,
    };
    let (file, created) = open_or_create(path).map_err(io)?;
    if created {
        // Whatever the umask: other containers' users share these files.
        file.set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(io)?;
        file.set_len(size as u64).map_err(io)?;
    } else if sizing == Sizing::AnyOpener {
        if file.metadata().map_err(io)?.len() < size as u64 {
            file.set_len(size as u64).map_err(io)?;
        }
    } else {
        let deadline = std::time::Instant::now() + SIZED_WITHIN;
        while file.metadata().map_err(io)?.len() < size as u64 {
            if std::time::Instant::now() >= deadline {
                return Err(io(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("shorter than its {size} bytes; only its creator sizes it"),
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    map(&file, size, true).map_err(|source| MapError::Map {
        path: path.to_owned(),
        source,
    })
}

/// Opens `path` read-write without following a symlink or blocking (a
/// FIFO), creating it (mode 0666 before the umask) if nothing is there;
/// whether this call created it. What exists must be a regular file with
/// one link (a hard link could name a file elsewhere); it is never
/// truncated.
pub fn open_or_create(path: &Path) -> io::Result<(File, bool)> {
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(flags)
        .open(path);
    let (file, created) = match created {
        Ok(f) => (f, true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => (
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(path)?,
            false,
        ),
        Err(e) => return Err(e),
    };
    let md = file.metadata()?;
    if !md.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if std::os::unix::fs::MetadataExt::nlink(&md) != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a file with other names (hard links)",
        ));
    }
    Ok((file, created))
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
        let a = create_and_map(&p, 4096, Sizing::CreatorOnly).unwrap();
        let b = create_and_map(&p, 4096, Sizing::CreatorOnly).unwrap();
        // SAFETY: both mappings are 4096 bytes of the same file.
        unsafe {
            a.as_mut_ptr().add(100).write(42);
            assert_eq!(b.as_ptr().add(100).read(), 42);
        }
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.len(), 4096);
        assert_eq!(md.permissions().mode() & 0o777, 0o666);
    }

    /// What another tenant can put at the path in a shared directory: the
    /// file it names is never followed to, chmod-ed, resized or created,
    /// and nothing blocks.
    #[test]
    fn what_another_tenant_put_there_is_refused_and_left_as_it_is() {
        use std::os::unix::fs::{symlink, MetadataExt as _};
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"secret\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let unchanged = |p: &Path, mode: u32, len: u64| {
            let md = std::fs::symlink_metadata(p).unwrap();
            assert_eq!(
                (md.mode() & 0o777, md.len()),
                (mode, len),
                "{}",
                p.display()
            );
        };
        let link = dir.path().join("table-link");
        symlink(&victim, &link).unwrap();
        assert!(create_and_map(&link, 4096, Sizing::CreatorOnly).is_err());
        unchanged(&victim, 0o600, 7);
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret\n");
        // A dangling link: nothing is created where it points.
        let dangling = dir.path().join("dangling");
        symlink(dir.path().join("made-through-the-link"), &dangling).unwrap();
        assert!(create_and_map(&dangling, 4096, Sizing::CreatorOnly).is_err());
        assert!(!dir.path().join("made-through-the-link").exists());
        // A FIFO: refused at once, not waited on, not chmod-ed.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(create_and_map(&fifo, 4096, Sizing::CreatorOnly).is_err());
        unchanged(&fifo, 0o600, 0);
        // A hard link to a file elsewhere.
        let hard = dir.path().join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        assert!(create_and_map(&hard, 4096, Sizing::CreatorOnly).is_err());
        unchanged(&victim, 0o600, 7);
        // A plain file too short for the layout, made by someone else: not
        // extended (its creator sizes what it creates), refused soon.
        let short = dir.path().join("short");
        std::fs::write(&short, b"x").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = std::time::Instant::now();
        assert!(create_and_map(&short, 4096, Sizing::CreatorOnly).is_err());
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        unchanged(&short, 0o644, 1);
        // In the container's own directory a sibling may size it.
        assert!(create_and_map(&short, 4096, Sizing::AnyOpener).is_ok());
        unchanged(&short, 0o644, 4096);
        assert_eq!(victim.metadata().unwrap().nlink(), 2);
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
