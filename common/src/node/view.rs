//! A read-only copy of a node table, for `vgpu turns`: nothing is written,
//! not even the header of an empty file.
//!
//! The table sits in a directory every container of the node can write, so
//! it is never mapped here (a tenant truncating it would SIGBUS the reader):
//! it is opened without following a symlink or blocking on a FIFO, checked
//! on the descriptor, and copied with `pread` (`shared_file::read_copy`).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;

use super::{NodeFile, MAGIC, MIN_VERSION, SIZE, VERSION};
use crate::shared_file::CopyError;

/// Why a node table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open node table {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read node table {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a regular file: refused")]
    NotRegular { path: PathBuf },
    #[error("{path} is {size} bytes, shorter than a node table ({SIZE} bytes)")]
    Short { path: PathBuf, size: u64 },
    /// `magic` and `version` are for callers; the message does not echo
    /// the file's bytes.
    #[error("{path} is not a vgpu node table this version reads (expected version {VERSION})")]
    Foreign {
        path: PathBuf,
        magic: u64,
        version: u32,
    },
}

/// A copy of a node table.
#[derive(Debug)]
pub struct NodeView {
    table: Box<NodeFile>,
    path: PathBuf,
}

impl NodeView {
    /// Opens the table at `path` (`O_NOFOLLOW | O_NONBLOCK`) and copies it.
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|source| ReadError::Open {
                path: path.to_owned(),
                source,
            })?;
        Self::from_file(&file, path)
    }

    /// Copies the table from an opened descriptor, checking it first.
    pub fn from_file(file: &File, path: &Path) -> Result<Self, ReadError> {
        let md = file.metadata().map_err(|source| ReadError::Open {
            path: path.to_owned(),
            source,
        })?;
        if !md.file_type().is_file() {
            return Err(ReadError::NotRegular {
                path: path.to_owned(),
            });
        }
        let short = |size| ReadError::Short {
            path: path.to_owned(),
            size,
        };
        if md.len() < SIZE as u64 {
            return Err(short(md.len()));
        }
        // SAFETY: every field of `NodeFile` is an atomic integer and the
        // layout has no padding (node/mod.rs asserts), so any bytes are valid.
        let table =
            unsafe { crate::shared_file::read_copy::<NodeFile>(file) }.map_err(|e| match e {
                CopyError::Short(size) => short(size),
                CopyError::Read(source) => ReadError::Read {
                    path: path.to_owned(),
                    source,
                },
            })?;
        let (magic, version) = (table.magic.load(Acquire), table.version.load(Acquire));
        if magic != MAGIC || !(MIN_VERSION..=VERSION).contains(&version) {
            return Err(ReadError::Foreign {
                path: path.to_owned(),
                magic,
                version,
            });
        }
        Ok(Self {
            table,
            path: path.to_owned(),
        })
    }

    /// The table.
    pub fn table(&self) -> &NodeFile {
        &self.table
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    /// The bytes of a table stamped with `magic`, whose member 0 is
    /// container 7 at 30 %.
    fn bytes(magic: u64) -> Vec<u8> {
        let t = NodeFile::default();
        t.magic.store(magic, Relaxed);
        t.version.store(VERSION, Relaxed);
        t.size.store(SIZE as u32, Relaxed);
        t.members[0].owner.store(7, Relaxed);
        t.members[0].limit.store(30, Relaxed);
        // SAFETY: `NodeFile` is `SIZE` bytes of plain atomics, no padding
        // (the layout asserts), so every byte is initialised.
        unsafe { std::slice::from_raw_parts(&t as *const NodeFile as *const u8, SIZE) }.to_vec()
    }

    #[test]
    fn a_table_is_read_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vgpu-sm-GPU-1");
        std::fs::write(&p, bytes(MAGIC)).unwrap();
        let v = NodeView::open(&p).unwrap();
        assert_eq!(v.table().members[0].owner.load(Relaxed), 7);
        assert_eq!(v.table().members[0].limit.load(Relaxed), 30);

        std::fs::write(&p, bytes(0x1234)).unwrap();
        assert!(matches!(
            NodeView::open(&p),
            Err(ReadError::Foreign { magic: 0x1234, .. })
        ));
        std::fs::write(&p, [0u8; 64]).unwrap();
        assert!(matches!(
            NodeView::open(&p),
            Err(ReadError::Short { size: 64, .. })
        ));
        assert!(matches!(
            NodeView::open(&dir.path().join("none")),
            Err(ReadError::Open { .. })
        ));
        // Neither a symlink to a table nor a FIFO (which would block a
        // plain open) is read.
        std::fs::write(&p, bytes(MAGIC)).unwrap();
        let ln = dir.path().join("vgpu-sm-ln");
        std::os::unix::fs::symlink(&p, &ln).unwrap();
        assert!(matches!(NodeView::open(&ln), Err(ReadError::Open { .. })));
        let fifo = dir.path().join("vgpu-sm-fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            NodeView::open(&fifo),
            Err(ReadError::NotRegular { .. })
        ));
    }
}
