//! Region access for privileged processes, without a mapping.
//!
//! A region file lives in a directory its container can write. A process
//! that maps it dies of SIGBUS the moment the tenant truncates it, so the
//! daemon and the admin commands never map one: they copy what they need
//! with `pread` into an owned buffer ([`RegionSnapshot`], which derefs to
//! [`SharedRegion`] so the usual accessors work on the copy) and store
//! single fields with `pwrite` at their `offset_of!` offsets. A truncated
//! file is then a short read, an error, never a fault.
//!
//! The checks run on the opened descriptor ([`RegionIo::new`]), never on a
//! path looked at earlier: the caller opens the file however it must (the
//! loader confines the lookup to a container's root) and hands the
//! descriptor over. No message carries bytes read from the file.

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::ops::Deref;
use std::os::unix::fs::{FileExt as _, FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;

use memmap2::{Advice, MmapMut};

use crate::proc_identity::ProcIdentity;
use crate::region::{ProcSlot, SharedRegion, MAGIC, MAJOR_VERSION, MAX_PROCS, REGION_SIZE};

/// Why a region could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot stat region file {path}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is a {kind}, not a regular file: refused")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path} is {size} bytes, {} a v1 shared region ({REGION_SIZE} bytes): truncated, \
         an old v0 region or not a region; refused",
        if *size < REGION_SIZE as u64 { "shorter than" } else { "longer than" }
    )]
    Size { path: PathBuf, size: u64 },
    /// The message says nothing of the file's content: it may be any file.
    #[error("{path} is not a HAMi shared region (or not initialised yet): refused")]
    Foreign { path: PathBuf },
    #[error(
        "{path} has region version {major}.{minor}; vgpu understands major version \
         {MAJOR_VERSION}"
    )]
    Version {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("cannot read region file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} was truncated while being read (short read at offset {offset})")]
    Short { path: PathBuf, offset: u64 },
    #[error("cannot write region file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} was opened read-only; refusing to write")]
    ReadOnly { path: PathBuf },
}

/// What kind of file a mode is, for messages.
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Offset of slot `i` in the file.
pub const fn slot_offset(i: usize) -> u64 {
    (offset_of!(SharedRegion, procs) + i * size_of::<ProcSlot>()) as u64
}

/// An open region file, checked on its descriptor.
#[derive(Debug)]
pub struct RegionIo {
    file: File,
    path: PathBuf,
    writable: bool,
    dev: u64,
    ino: u64,
}

impl RegionIo {
    /// Takes an opened descriptor and checks it: a regular file, of a
    /// region's size, with a v1 header. `path` is only for messages;
    /// `writable` says whether the descriptor was opened for writing.
    pub fn new(file: File, path: &Path, writable: bool) -> Result<Self, IoError> {
        let md = file.metadata().map_err(|source| IoError::Stat {
            path: path.to_owned(),
            source,
        })?;
        if !md.file_type().is_file() {
            return Err(IoError::NotRegular {
                path: path.to_owned(),
                kind: file_kind(md.file_type()),
            });
        }
        let io = Self {
            file,
            path: path.to_owned(),
            writable,
            dev: md.dev(),
            ino: md.ino(),
        };
        // Foreign content first (a file that is no region says so, whatever
        // its size), then the size, then the version.
        let mut head = [0u8; 12];
        let n = (md.len().min(head.len() as u64)) as usize;
        io.read_exact_at(&mut head[..n], 0)?;
        let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
        if n >= 4 && i32::from_le_bytes(word(0)) != MAGIC {
            return Err(IoError::Foreign { path: io.path });
        }
        io.check_size()?;
        let (major, minor) = (u32::from_le_bytes(word(4)), u32::from_le_bytes(word(8)));
        if major != MAJOR_VERSION {
            return Err(IoError::Version {
                path: io.path,
                major,
                minor,
            });
        }
        Ok(io)
    }

    fn check_size(&self) -> Result<(), IoError> {
        let size = self
            .file
            .metadata()
            .map_err(|source| IoError::Stat {
                path: self.path.clone(),
                source,
            })?
            .len();
        if size != REGION_SIZE as u64 && size != REGION_SIZE as u64 + 1 {
            return Err(IoError::Size {
                path: self.path.clone(),
                size,
            });
        }
        Ok(())
    }

    /// (st_dev, st_ino) of the descriptor.
    pub fn key(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The descriptor (for the region lock and the mapping scan).
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Whether the file was unlinked (no name points at it any more).
    pub fn is_deleted(&self) -> bool {
        self.file.metadata().map_or(true, |m| m.nlink() == 0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), IoError> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            match self.file.read_at(&mut buf[done..], at) {
                Ok(0) => {
                    return Err(IoError::Short {
                        path: self.path.clone(),
                        offset: at,
                    })
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(IoError::Read {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    /// Copies the header, the fields after the slots, and the slots below
    /// `proc_num` (clamped to [`MAX_PROCS`]); slots above it read as zero.
    /// At most one region's bytes are read, whatever the file says.
    pub fn snapshot(&self) -> Result<RegionSnapshot, IoError> {
        let mut snap = RegionSnapshot::zeroed();
        self.refresh(&mut snap, MAX_PROCS)?;
        Ok(snap)
    }

    /// Re-reads `snap` in place: the header, the fields after the slots,
    /// and the slots below `proc_num`, at most `max_slots` of them (a
    /// tenant's `proc_num` must not decide how much the daemon reads).
    /// Slots read last time and not now are zeroed, so the copy always
    /// shows `min(proc_num, max_slots)` slots and nothing else. Nothing is
    /// allocated: a daemon refreshing thousands of regions every scan
    /// reuses their copies. On error the copy is partly updated; callers
    /// drop it.
    pub fn refresh(&self, snap: &mut RegionSnapshot, max_slots: usize) -> Result<(), IoError> {
        let head = offset_of!(SharedRegion, procs);
        let tail = offset_of!(SharedRegion, proc_num);
        let slot = size_of::<ProcSlot>();
        // The header and as many slots as last time in one read (the count
        // rarely changes), then the tail with `proc_num`, then any slots
        // it adds: two reads in the common case.
        let was = snap.slots_read;
        let guess = was.min(max_slots);
        let bytes = snap.bytes_mut();
        self.read_exact_at(&mut bytes[..head + guess * slot], 0)?;
        self.read_exact_at(&mut bytes[tail..], tail as u64)?;
        let claimed = snap.proc_count();
        let count = claimed.min(max_slots);
        if count < claimed {
            // The copy's `proc_num` says what was read, so every accessor
            // (`active_slots`, `proc_count`) sees only real bytes.
            snap.proc_num.store(count as i32, SeqCst);
        }
        let (end, read_to) = (head + count * slot, head + guess * slot);
        if end > read_to {
            // Should this read fail, the next one still zeroes what it
            // may have written.
            snap.slots_read = count;
            let bytes = snap.bytes_mut();
            self.read_exact_at(&mut bytes[read_to..end], read_to as u64)?;
        }
        let bytes = snap.bytes_mut();
        let stale_to = head + was.max(guess) * slot;
        if stale_to > end {
            bytes[end..stale_to].fill(0);
        }
        snap.slots_read = count;
        snap.claimed = claimed;
        Ok(())
    }

    /// The identity words of slot `i`: (`pid`, `hostpid`, `status`).
    pub fn slot_head(&self, i: usize) -> Result<(i32, i32, i32), IoError> {
        let i = i.min(MAX_PROCS - 1);
        let base = slot_offset(i);
        let mut id = [0u8; 8];
        self.read_exact_at(&mut id, base)?;
        let mut st = [0u8; 4];
        self.read_exact_at(&mut st, base + offset_of!(ProcSlot, status) as u64)?;
        Ok((
            i32::from_le_bytes([id[0], id[1], id[2], id[3]]),
            i32::from_le_bytes([id[4], id[5], id[6], id[7]]),
            i32::from_le_bytes(st),
        ))
    }

    /// The identity slot `i` records (`pid`, `pidns`, `start`), read now.
    pub fn slot_identity(&self, i: usize) -> Result<ProcIdentity, IoError> {
        let i = i.min(MAX_PROCS - 1);
        let base = slot_offset(i);
        let mut pid = [0u8; 4];
        self.read_exact_at(&mut pid, base)?;
        // `pidns` and `start` are adjacent: one read.
        const _: () = assert!(offset_of!(ProcSlot, start) == offset_of!(ProcSlot, pidns) + 8);
        let mut id = [0u8; 16];
        self.read_exact_at(&mut id, base + offset_of!(ProcSlot, pidns) as u64)?;
        let (ns, start) = id.split_at(8);
        let word = |b: &[u8]| b.try_into().map(u64::from_le_bytes).unwrap_or(0);
        Ok(ProcIdentity {
            pid: i32::from_le_bytes(pid),
            pidns: word(ns),
            start: word(start),
        })
    }

    /// The 8 bytes at `offset`, read now (not from a snapshot).
    pub fn read_u64(&self, offset: u64) -> Result<u64, IoError> {
        let mut b = [0u8; 8];
        self.read_exact_at(&mut b, offset)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `bytes` at `offset`, which must lie inside the region (the
    /// file keeps its size: a write never extends it).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<(), IoError> {
        if !self.writable {
            return Err(IoError::ReadOnly {
                path: self.path.clone(),
            });
        }
        let end = offset.saturating_add(bytes.len() as u64);
        if end > REGION_SIZE as u64 {
            return Err(IoError::Write {
                path: self.path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "offset past the region"),
            });
        }
        // A tenant may have truncated the file since it was checked: a
        // write there would extend it again, so check right before.
        self.check_size()?;
        self.file
            .write_all_at(bytes, offset)
            .map_err(|source| IoError::Write {
                path: self.path.clone(),
                source,
            })
    }

    pub fn write_i32(&self, offset: u64, v: i32) -> Result<(), IoError> {
        self.write_at(offset, &v.to_le_bytes())
    }

    pub fn write_u32(&self, offset: u64, v: u32) -> Result<(), IoError> {
        self.write_at(offset, &v.to_le_bytes())
    }

    pub fn write_u64(&self, offset: u64, v: u64) -> Result<(), IoError> {
        self.write_at(offset, &v.to_le_bytes())
    }
}

/// A copy of a region, read by [`RegionIo::snapshot`] or
/// [`RegionIo::refresh`]. Derefs to [`SharedRegion`]; stores into it change
/// only the copy.
///
/// The copy lives in its own anonymous private mapping, never populated
/// up front: a page costs memory only once a read writes into it, so a
/// region whose processes use two slots costs about four pages (header,
/// slots, tail), not the 2 MB the layout spans. Reading a page never
/// written maps the kernel's shared zero page, which costs nothing either.
/// Transparent huge pages are refused on the mapping, or the kernel could
/// back a sparse copy with a whole 2 MB page.
pub struct RegionSnapshot {
    map: MmapMut,
    /// Slots the last read copied (what a smaller re-read must zero).
    slots_read: usize,
    /// Slots the file's `proc_num` claimed at the last read (clamped to
    /// [`MAX_PROCS`]); more than the copy holds when a bound cut it.
    claimed: usize,
}

impl std::fmt::Debug for RegionSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionSnapshot")
            .field("proc_num", &self.proc_num)
            .field("claimed", &self.claimed)
            .finish_non_exhaustive()
    }
}

impl RegionSnapshot {
    /// An all-zero region (every field is an atomic integer: valid).
    pub fn zeroed() -> Self {
        let map = match MmapMut::map_anon(REGION_SIZE) {
            Ok(m) => m,
            // Out of address space: as fatal as a failed allocation.
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<SharedRegion>()),
        };
        // Only a hint: without it the copy is still correct, just larger.
        let _hint = map.advise(Advice::NoHugePage);
        Self {
            map,
            slots_read: 0,
            claimed: 0,
        }
    }

    /// Slots the file's `proc_num` claimed at the last read, clamped to
    /// [`MAX_PROCS`]: above [`SharedRegion::proc_count`] of the copy when
    /// the read was bounded.
    pub fn claimed_slots(&self) -> usize {
        self.claimed
    }

    /// The bytes of the copy. Exclusive access, so writing them races with
    /// nothing.
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[..REGION_SIZE]
    }
}

impl Deref for RegionSnapshot {
    type Target = SharedRegion;
    fn deref(&self) -> &SharedRegion {
        let p = self.map.as_ptr().cast::<SharedRegion>();
        // SAFETY: the mapping is page-aligned (more than `SharedRegion`'s
        // 8) and at least `REGION_SIZE` bytes long, lives as long as
        // `self`, and any bytes are a valid `SharedRegion` (only atomic
        // integers and arrays of them), so shared references to it are
        // sound; writes go through `&mut self` only.
        unsafe { &*p }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::FILE_SIZE;
    use std::sync::atomic::Ordering::Relaxed;

    fn region_bytes(proc_num: i32) -> Vec<u8> {
        let mut v = vec![0u8; FILE_SIZE as usize];
        v[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        v[4..8].copy_from_slice(&1u32.to_le_bytes());
        let at = offset_of!(SharedRegion, proc_num);
        v[at..at + 4].copy_from_slice(&proc_num.to_le_bytes());
        v
    }

    fn open(path: &Path, w: bool) -> Result<RegionIo, IoError> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(w)
            .open(path)
            .unwrap();
        RegionIo::new(f, path, w)
    }

    #[test]
    fn snapshot_reads_fields_and_writes_land_at_hami_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let mut bytes = region_bytes(3);
        let hostpid_at = 1856 + 2 * 1960 + 4;
        bytes[hostpid_at..hostpid_at + 4].copy_from_slice(&77i32.to_le_bytes());
        // Slot 5 is above proc_num: never read.
        let pid5 = 1856 + 5 * 1960;
        bytes[pid5..pid5 + 4].copy_from_slice(&9i32.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let io = open(&path, true).unwrap();
        let snap = io.snapshot().unwrap();
        assert_eq!(snap.proc_count(), 3);
        assert_eq!(snap.procs[2].hostpid.load(Relaxed), 77);
        assert_eq!(snap.procs[5].pid.load(Relaxed), 0);
        io.write_u64(1600 + 8, 1 << 30).unwrap();
        io.write_i32(slot_offset(1) + 4, 4242).unwrap();
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len() as u64, FILE_SIZE);
        assert_eq!(&b[1608..1616], &(1u64 << 30).to_le_bytes());
        assert_eq!(&b[1856 + 1960 + 4..1856 + 1960 + 8], &4242i32.to_le_bytes());
        assert_eq!(io.slot_head(1).unwrap(), (0, 4242, 0));
        io.write_i32(slot_offset(1), 3).unwrap();
        io.write_u64(slot_offset(1) + 1944, 0xabc).unwrap();
        io.write_u64(slot_offset(1) + 1952, 99).unwrap();
        assert_eq!(
            io.slot_identity(1).unwrap(),
            ProcIdentity {
                pid: 3,
                pidns: 0xabc,
                start: 99
            }
        );
        assert!(matches!(
            io.write_u64(REGION_SIZE as u64 - 4, 1),
            Err(IoError::Write { .. })
        ));
        let ro = open(&path, false).unwrap();
        assert!(matches!(ro.write_i32(0, 1), Err(IoError::ReadOnly { .. })));
    }

    /// A bounded re-read copies at most `max_slots` slots and says what the
    /// file claimed; a smaller re-read zeroes what the last one copied.
    #[test]
    fn refresh_in_place_is_bounded_and_forgets_freed_slots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let mut bytes = region_bytes(6);
        for i in 0..6 {
            let at = 1856 + i * 1960;
            bytes[at..at + 4].copy_from_slice(&(i as i32 + 1).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let io = open(&path, true).unwrap();
        let mut snap = RegionSnapshot::zeroed();
        io.refresh(&mut snap, 4).unwrap();
        assert_eq!((snap.proc_count(), snap.claimed_slots()), (4, 6));
        assert_eq!(snap.procs[3].pid.load(Relaxed), 4);
        assert_eq!(snap.procs[4].pid.load(Relaxed), 0, "past the bound");
        let at = offset_of!(SharedRegion, proc_num);
        bytes[at..at + 4].copy_from_slice(&1i32.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        io.refresh(&mut snap, 4).unwrap();
        assert_eq!((snap.proc_count(), snap.claimed_slots()), (1, 1));
        assert_eq!(snap.procs[0].pid.load(Relaxed), 1);
        assert_eq!(snap.procs[1].pid.load(Relaxed), 0, "no longer in use");
        assert_eq!(snap.procs[3].pid.load(Relaxed), 0, "no longer in use");
    }

    #[test]
    fn truncation_is_an_error_not_a_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        std::fs::write(&path, region_bytes(1024)).unwrap();
        let io = open(&path, true).unwrap();
        assert!(io.snapshot().is_ok());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        assert!(matches!(io.snapshot(), Err(IoError::Short { .. })));
        assert!(matches!(io.slot_head(900), Err(IoError::Short { .. })));
        // A write would extend the file again: refused.
        assert!(matches!(io.write_i32(8, 1), Err(IoError::Size { .. })));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
        f.set_len(0).unwrap();
        assert!(io.snapshot().is_err());
    }

    #[test]
    fn hostile_files_are_refused_without_echoing_them() {
        let dir = tempfile::tempdir().unwrap();
        let foreign = dir.path().join("foreign");
        let mut b = region_bytes(0);
        b[0..4].copy_from_slice(b"root");
        std::fs::write(&foreign, &b).unwrap();
        let e = open(&foreign, false).unwrap_err();
        assert!(matches!(e, IoError::Foreign { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            !msg.contains("0x746f6f72") && !msg.contains("root\""),
            "{msg}"
        );
        let mut v2 = region_bytes(0);
        v2[4..8].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&foreign, &v2).unwrap();
        assert!(matches!(
            open(&foreign, false),
            Err(IoError::Version { major: 2, .. })
        ));
        let short = dir.path().join("short");
        std::fs::write(&short, &region_bytes(0)[..100]).unwrap();
        assert!(matches!(open(&short, false), Err(IoError::Size { .. })));
        let d = std::fs::File::open(dir.path()).unwrap();
        assert!(matches!(
            RegionIo::new(d, dir.path(), false),
            Err(IoError::NotRegular {
                kind: "directory",
                ..
            })
        ));
        // A proc_num far out of range reads at most MAX_PROCS slots.
        let big = dir.path().join("big");
        std::fs::write(&big, region_bytes(i32::MAX)).unwrap();
        assert_eq!(
            open(&big, false).unwrap().snapshot().unwrap().proc_count(),
            MAX_PROCS
        );
    }
}
