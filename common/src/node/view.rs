//! A read-only view of a node table, for `vgpu turns`: nothing is written,
//! not even the header of an empty file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;

use memmap2::{MmapOptions, MmapRaw};

use super::{NodeFile, MAGIC, MIN_VERSION, SIZE, VERSION};

/// Why a node table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open node table {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot map node table {path}: {source}")]
    Map { path: PathBuf, source: io::Error },
    #[error("{path} is {size} bytes, shorter than a node table ({SIZE} bytes)")]
    Short { path: PathBuf, size: u64 },
    #[error(
        "{path} is not a vgpu node table this version reads (magic {magic:#x}, version \
         {version}; expected {MAGIC:#x}, version {VERSION})"
    )]
    Foreign {
        path: PathBuf,
        magic: u64,
        version: u32,
    },
}

/// A mapped node table, read-only.
#[derive(Debug)]
pub struct NodeView {
    map: MmapRaw,
    path: PathBuf,
}

impl NodeView {
    /// Maps the table at `path` read-only and checks its header.
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        let open_err = |source| ReadError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let size = file.metadata().map_err(open_err)?.len();
        if size < SIZE as u64 {
            return Err(ReadError::Short {
                path: path.to_owned(),
                size,
            });
        }
        let map = MmapOptions::new()
            .len(SIZE)
            .map_raw_read_only(&file)
            .map_err(|source| ReadError::Map {
                path: path.to_owned(),
                source,
            })?;
        let view = NodeView {
            map,
            path: path.to_owned(),
        };
        let t = view.table();
        let (magic, version) = (t.magic.load(Acquire), t.version.load(Acquire));
        if magic != MAGIC || !(MIN_VERSION..=VERSION).contains(&version) {
            return Err(ReadError::Foreign {
                path: path.to_owned(),
                magic,
                version,
            });
        }
        Ok(view)
    }

    /// The table.
    pub fn table(&self) -> &NodeFile {
        // SAFETY: the mapping is `SIZE` bytes, page-aligned (more than
        // `NodeFile`'s 64), and lives as long as `self`; every field of
        // `NodeFile` is an atomic, valid for any bytes, and only loaded
        // (a read-only mapping is never stored to).
        unsafe { &*(self.map.as_ptr() as *const NodeFile) }
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
    }
}
