//! Region files the daemon keeps open, keyed by the file's (dev, inode): a
//! container's processes all name the same file, and HAMi's directory on
//! the host is that file too, so each is mapped once.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_common::view::{Access, RegionError, RegionFile};

use crate::regions::discover::ContainerRef;

/// (st_dev, st_ino) of a region file.
pub type RegionKey = (u64, u64);

/// One open region.
#[derive(Debug)]
pub struct OpenRegion {
    pub file: RegionFile,
    /// The path as its processes name it (`CUDA_DEVICE_MEMORY_SHARED_CACHE`),
    /// or the host path for a region found under HAMi's directory.
    pub shown_path: PathBuf,
    /// Pod and container from HAMi's `<podUID>_<ctrName>` directory.
    pub owner: Option<ContainerRef>,
    /// cgroup id of a process using it (identity when there is no owner).
    pub cgroup_id: Option<u64>,
    last_used: Instant,
}

impl OpenRegion {
    /// Stores a process's SM utilization of device `dev` in its slot, where
    /// HAMi's monitor reads it.
    pub fn write_sm_util(&self, slot: usize, dev: usize, pct: u64) {
        let r = self.file.region();
        if let Some(s) = r.procs.get(slot) {
            if let Some(u) = s.device_util.get(dev) {
                u.sm_util.store(pct, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// Why a region could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no region file at {0}")]
    Missing(PathBuf),
    #[error(transparent)]
    Region(#[from] RegionError),
}

/// The cache.
#[derive(Debug, Default)]
pub struct RegionCache {
    open: HashMap<RegionKey, OpenRegion>,
}

impl RegionCache {
    /// The region at `host_path` (as reachable from the daemon), opening it
    /// read-write on first use. `shown` is the path to report.
    pub fn get_or_open(
        &mut self,
        host_path: &Path,
        shown: &Path,
    ) -> Result<(RegionKey, &mut OpenRegion), OpenError> {
        let md =
            std::fs::metadata(host_path).map_err(|_| OpenError::Missing(host_path.to_owned()))?;
        let key = (md.dev(), md.ino());
        let entry = match self.open.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let file = RegionFile::open(host_path, Access::ReadWrite)?;
                v.insert(OpenRegion {
                    file,
                    shown_path: shown.to_owned(),
                    owner: ContainerRef::of_file(host_path),
                    cgroup_id: None,
                    last_used: Instant::now(),
                })
            }
        };
        entry.last_used = Instant::now();
        Ok((key, entry))
    }

    /// An open region.
    pub fn get(&self, key: &RegionKey) -> Option<&OpenRegion> {
        self.open.get(key)
    }

    /// Marks `key` as still in use.
    pub fn touch(&mut self, key: &RegionKey) {
        if let Some(r) = self.open.get_mut(key) {
            r.last_used = Instant::now();
        }
    }

    /// Every open region.
    pub fn iter(&self) -> impl Iterator<Item = (&RegionKey, &OpenRegion)> {
        self.open.iter()
    }

    /// Unmaps regions nobody used for `idle`.
    pub fn evict_idle(&mut self, idle: Duration) {
        self.open.retain(|_, r| r.last_used.elapsed() < idle);
    }
}
