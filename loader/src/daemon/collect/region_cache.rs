//! Region files the daemon keeps open, keyed by the file's (dev, inode): a
//! container's processes all name the same file, and HAMi's directory on
//! the host is that file too, so each is opened once.
//!
//! Nothing is mapped (a tenant truncating its file must not SIGBUS a root
//! daemon): each region holds its descriptor and a copy of what it really
//! holds (header, device table, the slots in use; see
//! [`RegionSnapshot`]), re-read in place at every refresh. A region whose
//! file was deleted, truncated or turned into something else is dropped at
//! the next refresh.
//!
//! What one container (a [`Tenant`]) costs is bounded: at most
//! [`TENANT_REGIONS`] open regions and [`TENANT_SLOTS`] slots read over all
//! of them. A region past the first bound is not opened; slots past the
//! second are not read (its processes get no host-PID fill, which only
//! hurts that container). Both are counted in [`Overruns`] for the metrics.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_common::region::MAX_PROCS;
use vgpu_common::region_io::{IoError, RegionIo, RegionSnapshot};

use crate::regions::discover::ContainerRef;

/// (st_dev, st_ino) of a region file.
pub type RegionKey = (u64, u64);

/// At most this many regions are kept open on the node: four for each of
/// 1000 containers; each costs a descriptor and a few pages.
pub const MAX_OPEN: usize = 4096;

/// Regions one container may have open. HAMi gives a container one; a
/// process may name its own, so a few more are legitimate, a hundred not.
pub const TENANT_REGIONS: usize = 8;

/// Slots read per container, over all its regions: a container with more
/// CUDA processes than this is far past what a shared GPU serves, and each
/// slot read costs 1960 bytes.
pub const TENANT_SLOTS: usize = 128;

/// Who a region is charged to: the container directory HAMi made for it
/// (under the regions root, a name the device plugin chose), or the cgroup
/// of the first process found using it (the kernel's word). Never a path a
/// tenant names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tenant {
    Dir(PathBuf),
    Cgroup(u64),
}

/// Tenants that hit a bound, per bound, at the last refresh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overruns {
    /// Containers refused a region since the last refresh because they
    /// had [`TENANT_REGIONS`] open.
    pub regions_refused: usize,
    /// Containers whose regions claim more than [`TENANT_SLOTS`] slots.
    pub slots_capped: usize,
}

/// One open region.
#[derive(Debug)]
pub struct OpenRegion {
    pub file: RegionIo,
    /// The copy, reused by every read; valid when `read_at` is set.
    copy: RegionSnapshot,
    read_at: Option<Instant>,
    /// Slots a read may copy: this region's share of its tenant's budget.
    slot_cap: usize,
    tenant: Tenant,
    /// `tenant`'s number in the cache (cheap to sort and key by).
    tenant_no: u32,
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
        let fresh = self.read_at.is_some_and(|at| at.elapsed() <= max_age);
        if !fresh {
            self.read_at = None;
            self.file.refresh(&mut self.copy, self.slot_cap)?;
            self.read_at = Some(Instant::now());
        }
        Ok(&self.copy)
    }

    /// The copy the last refresh read, if any.
    pub fn last_snapshot(&self) -> Option<&RegionSnapshot> {
        self.read_at.map(|_| &self.copy)
    }

    /// Who the region is charged to.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }
}

/// Why a region could not be added.
#[derive(Debug, thiserror::Error)]
pub enum Full {
    #[error("{MAX_OPEN} regions are open already; {0} is not tracked")]
    Node(PathBuf),
    #[error(
        "its container has {TENANT_REGIONS} regions open already (the most one container \
         may have); {0} is not tracked"
    )]
    Tenant(PathBuf),
}

/// The cache.
#[derive(Debug)]
pub struct RegionCache {
    /// Slots read per tenant ([`TENANT_SLOTS`] but in tests).
    tenant_slots: usize,
    open: HashMap<RegionKey, OpenRegion>,
    /// Per tenant: its number and how many regions it has open.
    per_tenant: HashMap<Tenant, (u32, usize)>,
    next_tenant_no: u32,
    overruns: Overruns,
    /// Tenants refused a region since the last refresh.
    refused: BTreeSet<Tenant>,
}

impl Default for RegionCache {
    fn default() -> Self {
        Self::with_tenant_slots(TENANT_SLOTS)
    }
}

impl RegionCache {
    /// A cache that reads `slots` slots per tenant: [`TENANT_SLOTS`] in the
    /// daemon, more where a test needs a region with more slots in use.
    pub fn with_tenant_slots(slots: usize) -> Self {
        Self {
            tenant_slots: slots.min(MAX_PROCS),
            open: HashMap::new(),
            per_tenant: HashMap::new(),
            next_tenant_no: 0,
            overruns: Overruns::default(),
            refused: BTreeSet::new(),
        }
    }

    /// Adds the opened region `file`, charged to `tenant`, unless its inode
    /// is open already (then the new descriptor is dropped and the entry
    /// kept, whoever names it). `shown` is the path to report.
    pub fn insert(
        &mut self,
        file: RegionIo,
        shown: &Path,
        tenant: Tenant,
    ) -> Result<(RegionKey, &mut OpenRegion), Full> {
        use std::collections::hash_map::Entry;
        let key = file.key();
        let n = self.open.len();
        let entry = match self.open.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if n >= MAX_OPEN => return Err(Full::Node(shown.to_owned())),
            Entry::Vacant(v) => {
                let next = &mut self.next_tenant_no;
                let (no, held) = self.per_tenant.entry(tenant.clone()).or_insert_with(|| {
                    *next = next.wrapping_add(1);
                    (*next, 0)
                });
                if *held >= TENANT_REGIONS {
                    self.refused.insert(tenant);
                    return Err(Full::Tenant(shown.to_owned()));
                }
                *held += 1;
                let tenant_no = *no;
                v.insert(OpenRegion {
                    file,
                    copy: RegionSnapshot::zeroed(),
                    read_at: None,
                    // Until the next refresh shares the budget out.
                    slot_cap: self.tenant_slots,
                    tenant,
                    tenant_no,
                    shown_path: shown.to_owned(),
                    owner: None,
                    cgroup_id: None,
                    last_used: Instant::now(),
                })
            }
        };
        entry.last_used = Instant::now();
        Ok((key, entry))
    }

    /// Whether a region is open.
    pub fn contains(&self, key: &RegionKey) -> bool {
        self.open.contains_key(key)
    }

    /// Tenants over a bound (see [`Overruns`]).
    pub fn overruns(&self) -> Overruns {
        self.overruns
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
    /// Each tenant's [`TENANT_SLOTS`] are shared out over its regions in
    /// key order, so which slots are read is stable from scan to scan.
    pub fn refresh(&mut self) {
        let mut order: Vec<(u32, RegionKey)> =
            self.open.iter().map(|(k, r)| (r.tenant_no, *k)).collect();
        order.sort_unstable();
        let mut left: HashMap<u32, usize> = HashMap::new();
        let mut capped: HashMap<u32, bool> = HashMap::new();
        let mut gone = Vec::new();
        for (tenant, key) in &order {
            let Some(r) = self.open.get_mut(key) else {
                continue;
            };
            if r.file.is_deleted() {
                tracing::debug!("{}: deleted, no longer tracked", r.shown_path.display());
                gone.push(*key);
                continue;
            }
            let budget = left.entry(*tenant).or_insert(self.tenant_slots);
            r.slot_cap = *budget;
            match r.snapshot(Duration::ZERO) {
                Ok(copy) => {
                    let read = copy.proc_count();
                    *budget -= read.min(*budget);
                    let over = copy.claimed_slots() > read;
                    *capped.entry(*tenant).or_default() |= over;
                }
                Err(e) => {
                    tracing::info!("{e}; no longer tracked");
                    gone.push(*key);
                }
            }
        }
        let slots_capped = capped.values().filter(|&&c| c).count();
        for key in gone {
            self.remove(&key);
        }
        self.overruns = Overruns {
            regions_refused: std::mem::take(&mut self.refused).len(),
            slots_capped,
        };
    }

    /// Re-reads the regions `keys` name (each within the slots the last
    /// [`Self::refresh`] gave it) and drops those that can no longer be read
    /// as a region. A deleted file is left to the next full refresh.
    pub fn refresh_only(&mut self, keys: &[RegionKey]) {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            let Some(r) = self.open.get_mut(&key) else {
                continue;
            };
            if let Err(e) = r.snapshot(Duration::ZERO) {
                tracing::info!("{e}; no longer tracked");
                self.remove(&key);
            }
        }
    }

    /// Closes regions nobody used for `idle`.
    pub fn evict_idle(&mut self, idle: Duration) {
        let idle: Vec<RegionKey> = self
            .open
            .iter()
            .filter(|(_, r)| r.last_used.elapsed() >= idle)
            .map(|(k, _)| *k)
            .collect();
        for key in idle {
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &RegionKey) {
        if let Some(r) = self.open.remove(key) {
            if let Some((_, n)) = self.per_tenant.get_mut(&r.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_tenant.remove(&r.tenant);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::view::RegionFile;

    fn region(dir: &Path, name: &str, proc_num: i32) -> (PathBuf, RegionIo) {
        let path = dir.join(name);
        let (f, io) = crate::regions::admin::testutil::initialised_region(&path);
        let r = f.region();
        for i in 0..proc_num as usize {
            r.procs[i].pid.store(i as i32 + 1, Relaxed);
        }
        r.proc_num.store(proc_num, Relaxed);
        (path, io)
    }

    /// A partial refresh re-reads the regions named and no other, and drops
    /// a named one that is no longer a region.
    #[test]
    fn refresh_only_reads_the_regions_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = RegionCache::default();
        let (pa, io) = region(dir.path(), "a", 1);
        let a = cache.insert(io, &pa, Tenant::Cgroup(1)).unwrap().0;
        let (pb, io) = region(dir.path(), "b", 1);
        let b = cache.insert(io, &pb, Tenant::Cgroup(2)).unwrap().0;
        cache.refresh();
        for p in [&pa, &pb] {
            let f = RegionFile::create_or_open(p).unwrap();
            f.region().procs[1].pid.store(9, Relaxed);
            f.region().proc_num.store(2, Relaxed);
        }
        cache.refresh_only(&[a, a]);
        let count = |k| cache.get(&k).unwrap().last_snapshot().unwrap().proc_count();
        assert_eq!((count(a), count(b)), (2, 1));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&pb)
            .unwrap()
            .set_len(4096)
            .unwrap();
        cache.refresh_only(&[b]);
        assert!(cache.get(&b).is_none(), "a truncated region is dropped");
        assert!(cache.get(&a).is_some());
    }

    /// A tenant gets `TENANT_REGIONS` regions and its slot budget shared
    /// over them; another tenant is not affected; closing one frees room.
    #[test]
    fn a_tenant_is_held_to_its_regions_and_slots() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = RegionCache::with_tenant_slots(10);
        let greedy = Tenant::Cgroup(7);
        let mut keys = Vec::new();
        for i in 0..TENANT_REGIONS {
            let (p, io) = region(dir.path(), &format!("g{i}"), 4);
            keys.push(cache.insert(io, &p, greedy.clone()).unwrap().0);
        }
        let (p, io) = region(dir.path(), "g-extra", 4);
        assert!(matches!(
            cache.insert(io, &p, greedy.clone()),
            Err(Full::Tenant(_))
        ));
        let (p, io) = region(dir.path(), "fair", 3);
        let fair = cache.insert(io, &p, Tenant::Cgroup(8)).unwrap().0;
        cache.refresh();
        let read: usize = keys
            .iter()
            .map(|k| cache.get(k).unwrap().last_snapshot().unwrap().proc_count())
            .sum();
        assert_eq!(read, 10, "the greedy tenant's budget");
        let fair_copy = cache.get(&fair).unwrap().last_snapshot().unwrap();
        assert_eq!(fair_copy.proc_count(), 3);
        assert_eq!(
            cache.overruns(),
            Overruns {
                regions_refused: 1,
                slots_capped: 1
            }
        );
        // Refusals are counted once per refresh.
        cache.refresh();
        assert_eq!(cache.overruns().regions_refused, 0);
        // A deleted region gives its place back.
        std::fs::remove_file(dir.path().join("g0")).unwrap();
        cache.refresh();
        let (p, io) = region(dir.path(), "g-next", 1);
        assert!(cache.insert(io, &p, greedy).is_ok());
    }
}
