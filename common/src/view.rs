//! A safe view over a mapped region file.
//!
//! The file is mapped `MAP_SHARED` and every field of [`SharedRegion`] is an
//! atomic, so a shared reference into the mapping is sound however other
//! processes write it. The one hazard Rust cannot rule out is another process
//! truncating the file (SIGBUS on access); vgpu never truncates a region.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use memmap2::MmapRaw;

use crate::region::{SharedRegion, FILE_SIZE, MAGIC, MAJOR_VERSION, REGION_SIZE};

/// Why a region file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("cannot open region file {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot size region file {path}: {source}")]
    Resize { path: PathBuf, source: io::Error },
    #[error("cannot map region file {path}: {source}")]
    Map { path: PathBuf, source: io::Error },
    #[error(
        "{path} is {size} bytes, shorter than a v1 shared region ({REGION_SIZE} bytes): \
         truncated, or an old v0 region"
    )]
    Truncated { path: PathBuf, size: u64 },
    #[error("{path} is not a HAMi shared region (magic {magic:#x}, expected {MAGIC:#x})")]
    Foreign { path: PathBuf, magic: u32 },
    #[error(
        "{path} has region version {major}.{minor}; vgpu understands major version {MAJOR_VERSION}"
    )]
    Version {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
}

/// How to open an existing region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

/// A mapped region file.
#[derive(Debug)]
pub struct RegionFile {
    map: MmapRaw,
    file: File,
    path: PathBuf,
    writable: bool,
}

impl RegionFile {
    /// Opens an existing, initialised v1 region. Nothing is written, whatever
    /// the file holds: a foreign or damaged file is an error.
    pub fn open(path: &Path, access: Access) -> Result<Self, RegionError> {
        let writable = access == Access::ReadWrite;
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|source| RegionError::Open {
                path: path.to_owned(),
                source,
            })?;
        let size = file_len(&file, path)?;
        let header = read_header(&file, path)?;
        validate(path, size, header)?;
        Self::map(file, path, writable)
    }

    /// Opens the region at `path`, creating the file (mode 0666, HAMi's, so
    /// every user of the container can attach) if it does not exist.
    /// The returned region may still be uninitialised: the caller
    /// initialises it under the region lock. A file that exists with other
    /// content is refused, never overwritten.
    pub fn create_or_open(path: &Path) -> Result<Self, RegionError> {
        let open_err = |source| RegionError::Open {
            path: path.to_owned(),
            source,
        };
        let (file, _) = crate::shared_file::open_or_create(path).map_err(open_err)?;
        let size = file_len(&file, path)?;
        if size == 0 {
            // Fresh file: size it. Racing creators both extend to the same
            // length, which is harmless. Make it world-writable without
            // touching the process umask (HAMi calls umask(0)).
            file.set_len(FILE_SIZE)
                .map_err(|source| RegionError::Resize {
                    path: path.to_owned(),
                    source,
                })?;
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        } else {
            let header = read_header(&file, path)?;
            if header.magic != 0 || size < REGION_SIZE as u64 {
                validate(path, size, header)?;
            }
        }
        Self::map(file, path, true)
    }

    fn map(file: File, path: &Path, writable: bool) -> Result<Self, RegionError> {
        let map = crate::shared_file::map(&file, REGION_SIZE, writable).map_err(|source| {
            RegionError::Map {
                path: path.to_owned(),
                source,
            }
        })?;
        Ok(Self {
            map,
            file,
            path: path.to_owned(),
            writable,
        })
    }

    /// The region. On a read-only view, only loads are allowed: a store
    /// faults. Use [`Access::ReadWrite`] for anything that writes.
    pub fn region(&self) -> &SharedRegion {
        // SAFETY: the mapping is `REGION_SIZE` bytes, page aligned (so
        // aligned for `SharedRegion`, align 8), lives as long as `self`, and
        // `SharedRegion` consists only of atomics, so any bytes are a valid
        // value and concurrent writes by other processes are not data races.
        unsafe { &*(self.map.as_ptr() as *const SharedRegion) }
    }

    /// The open file, for the region lock.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

#[derive(Debug, Clone, Copy)]
struct Header {
    magic: u32,
    major: u32,
    minor: u32,
}

fn file_len(file: &File, path: &Path) -> Result<u64, RegionError> {
    file.metadata()
        .map(|m| m.len())
        .map_err(|source| RegionError::Open {
            path: path.to_owned(),
            source,
        })
}

fn read_header(file: &File, path: &Path) -> Result<Header, RegionError> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 12];
    let n = file
        .read_at(&mut buf, 0)
        .map_err(|source| RegionError::Open {
            path: path.to_owned(),
            source,
        })?;
    if n < buf.len() {
        buf[n..].fill(0);
    }
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    Ok(Header {
        magic: word(0),
        major: word(4),
        minor: word(8),
    })
}

fn validate(path: &Path, size: u64, h: Header) -> Result<(), RegionError> {
    let path = path.to_owned();
    if size >= 4 && h.magic != MAGIC as u32 {
        return Err(RegionError::Foreign {
            path,
            magic: h.magic,
        });
    }
    if size < REGION_SIZE as u64 {
        return Err(RegionError::Truncated { path, size });
    }
    if h.major != MAJOR_VERSION {
        return Err(RegionError::Version {
            path,
            major: h.major,
            minor: h.minor,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn init(region: &SharedRegion) {
        region.major_version.store(1, Ordering::Relaxed);
        region.minor_version.store(2, Ordering::Relaxed);
        region.initialized_flag.store(MAGIC, Ordering::Release);
    }

    #[test]
    fn create_then_open_sees_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.cache");
        let a = RegionFile::create_or_open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE);
        init(a.region());
        a.region().limit[3].store(1 << 30, Ordering::Relaxed);
        a.region().procs[7].hostpid.store(4242, Ordering::Relaxed);
        let b = RegionFile::open(&path, Access::ReadOnly).unwrap();
        assert_eq!(b.region().limit[3].load(Ordering::Relaxed), 1 << 30);
        assert_eq!(b.region().procs[7].hostpid.load(Ordering::Relaxed), 4242);
        // Byte positions HAMi's monitor reads.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[0..4], &[0x4e, 0xf7, 0x2f, 0x01]);
        assert_eq!(&bytes[4..8], &1u32.to_le_bytes());
        assert_eq!(
            &bytes[1600 + 3 * 8..1600 + 4 * 8],
            &(1u64 << 30).to_le_bytes()
        );
        let hostpid_at = 1856 + 7 * 1960 + 4;
        assert_eq!(&bytes[hostpid_at..hostpid_at + 4], &4242i32.to_le_bytes());
    }

    #[test]
    fn bad_files_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        type Case = (&'static str, Vec<u8>, fn(&RegionError) -> bool);
        let cases: Vec<Case> = vec![
            ("short", vec![0x4e, 0xf7, 0x2f, 0x01, 1, 0, 0, 0], |e| {
                matches!(e, RegionError::Truncated { .. })
            }),
            ("foreign", b"hello world, not a region".to_vec(), |e| {
                matches!(e, RegionError::Foreign { .. })
            }),
            (
                "major2",
                {
                    let mut v = vec![0u8; FILE_SIZE as usize];
                    v[0..4].copy_from_slice(&MAGIC.to_le_bytes());
                    v[4..8].copy_from_slice(&2u32.to_le_bytes());
                    v
                },
                |e| matches!(e, RegionError::Version { major: 2, .. }),
            ),
        ];
        for (name, bytes, is_expected) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, &bytes).unwrap();
            for open in [
                |p: &Path| RegionFile::open(p, Access::ReadWrite),
                |p: &Path| RegionFile::create_or_open(p),
            ] {
                let err = open(&path).expect_err(name);
                assert!(is_expected(&err), "{name}: {err}");
                assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} unchanged");
            }
        }
        let missing = RegionFile::open(&dir.path().join("none"), Access::ReadOnly);
        assert!(matches!(missing, Err(RegionError::Open { .. })));
    }
}
