//! Region files the daemon keeps open, keyed by the file's (dev, inode): a
//! container's processes all name the same file, and HAMi's directory on
//! the host is that file too, so each is opened once.
//!
//! Nothing is mapped (a tenant truncating its file must not SIGBUS a root
//! daemon): each region holds its descriptor and the copy of its last
//! [`RegionIo::snapshot`]. A region whose file was deleted, truncated or
//! turned into something else is dropped at the next refresh.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_common::region::{DeviceUtil, ProcSlot, MAX_DEVICES, MAX_PROCS};
use vgpu_common::region_io::{slot_offset, IoError, RegionIo, RegionSnapshot};

use crate::regions::discover::ContainerRef;

/// (st_dev, st_ino) of a region file.
pub type RegionKey = (u64, u64);

/// At most this many regions are kept open: every process names one file,
/// so a node never has that many containers' worth of them legitimately.
pub const MAX_OPEN: usize = 1024;

/// One open region.
#[derive(Debug)]
pub struct OpenRegion {
    pub file: RegionIo,
    snap: Option<(RegionSnapshot, Instant)>,
    /// The path as its processes name it (`CUDA_DEVICE_MEMORY_SHARED_CACHE`),
    /// or the host path for a region found under HAMi's directory.
    pub shown_path: PathBuf,
    /// Pod and container from HAMi's `<podUID>_<ctrName>` directory, set
    /// only for a region found under `--regions-root`: the directory of a
    /// path a process names is the tenant's to call anything
    /// (`region_owner`).
    pub owner: Option<ContainerRef>,
    /// cgroup id of a process using it (identity when there is no owner).
    pub cgroup_id: Option<u64>,
    last_used: Instant,
}

impl OpenRegion {
    /// A copy of the region no older than `max_age`, read anew if needed.
    pub fn snapshot(&mut self, max_age: Duration) -> Result<&RegionSnapshot, IoError> {
        if let Some((_, at)) = &self.snap {
            if at.elapsed() > max_age {
                self.snap = None;
            }
        }
        let (s, _) = match self.snap.take() {
            Some(fresh) => self.snap.insert(fresh),
            None => self.snap.insert((self.file.snapshot()?, Instant::now())),
        };
        Ok(s)
    }

    /// The copy the last refresh read, if any.
    pub fn last_snapshot(&self) -> Option<&RegionSnapshot> {
        self.snap.as_ref().map(|(s, _)| s)
    }

    /// Stores a process's SM utilization of device `dev` in slot `slot`,
    /// where HAMi's monitor reads it, if the slot still holds host PID
    /// `host_pid` (the daemon's own fill; a slot freed and taken by another
    /// process meanwhile keeps its value).
    pub fn write_sm_util(
        &self,
        slot: usize,
        host_pid: u32,
        dev: usize,
        pct: u64,
    ) -> Result<(), IoError> {
        if slot >= MAX_PROCS || dev >= MAX_DEVICES {
            return Ok(());
        }
        let (_, hostpid, _) = self.file.slot_head(slot)?;
        if i64::from(hostpid) != i64::from(host_pid) {
            return Ok(());
        }
        let at = slot_offset(slot)
            + (offset_of!(ProcSlot, device_util)
                + dev * size_of::<DeviceUtil>()
                + offset_of!(DeviceUtil, sm_util)) as u64;
        self.file.write_u64(at, pct)
    }
}

/// Why a region could not be added.
#[derive(Debug, thiserror::Error)]
#[error("{MAX_OPEN} regions are open already; {0} is not tracked")]
pub struct Full(pub PathBuf);

/// The cache.
#[derive(Debug, Default)]
pub struct RegionCache {
    open: HashMap<RegionKey, OpenRegion>,
}

impl RegionCache {
    /// Adds the opened region `file` unless its inode is open already (then
    /// the new descriptor is dropped and the entry kept). `shown` is the
    /// path to report.
    pub fn insert(
        &mut self,
        file: RegionIo,
        shown: &Path,
    ) -> Result<(RegionKey, &mut OpenRegion), Full> {
        let key = file.key();
        let n = self.open.len();
        let entry = match self.open.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(_) if n >= MAX_OPEN => {
                return Err(Full(shown.to_owned()))
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(OpenRegion {
                file,
                snap: None,
                shown_path: shown.to_owned(),
                owner: None,
                cgroup_id: None,
                last_used: Instant::now(),
            }),
        };
        entry.last_used = Instant::now();
        Ok((key, entry))
    }

    /// An open region.
    pub fn get(&self, key: &RegionKey) -> Option<&OpenRegion> {
        self.open.get(key)
    }

    /// An open region, to read anew.
    pub fn get_mut(&mut self, key: &RegionKey) -> Option<&mut OpenRegion> {
        self.open.get_mut(key)
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

    /// Re-reads every region; drops those whose file is deleted or can no
    /// longer be read as a region (truncated, rewritten as something else).
    pub fn refresh(&mut self) {
        self.open.retain(|_, r| {
            if r.file.is_deleted() {
                tracing::debug!("{}: deleted, no longer tracked", r.shown_path.display());
                return false;
            }
            match r.snapshot(Duration::ZERO) {
                Ok(_) => true,
                Err(e) => {
                    tracing::info!("{e}; no longer tracked");
                    false
                }
            }
        });
    }

    /// Closes regions nobody used for `idle`.
    pub fn evict_idle(&mut self, idle: Duration) {
        self.open.retain(|_, r| r.last_used.elapsed() < idle);
    }
}
