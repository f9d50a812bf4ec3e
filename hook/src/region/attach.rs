//! Creating or attaching the region file, initialising it (first creator
//! wins), and this process's registration in it.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use vgpu_common::lock;
use vgpu_common::proc_identity::ProcIdentity;
use vgpu_common::region::{
    rules, ProcSlot, SharedRegion, MAGIC, MAJOR_VERSION, MAX_DEVICES, MINOR_VERSION, REGION_SIZE,
};
use vgpu_common::view::{RegionError, RegionFile};

use super::shadow::{self, Shadow};
use super::slots::{self, SlotError};
use super::usage::{self, Kind};
use crate::config::Config;

/// How long a live lock holder may keep the region before we go on without
/// the lock (slot claims are CAS-protected, so that stays safe).
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Least interval between two reclaims on behalf of a query.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error("region {path}: {source}")]
    Slot { path: PathBuf, source: SlotError },
}

/// This process's view of the region and its slot.
#[derive(Debug)]
pub struct Attachment {
    file: RegionFile,
    me: ProcIdentity,
    /// `monotonic_ms` of the last reclaim (`reclaim_now_and_then`); 0 = none.
    last_reclaim_ms: AtomicU64,
    /// OFD locks do not exclude threads sharing the file description.
    mutex: Mutex<()>,
    /// Limits and own usage, to refill the mapping if the file is truncated
    /// (boxed: the SIGBUS handler holds its address).
    shadow: Box<Shadow>,
}

impl Attachment {
    /// Creates or attaches the region at `cfg.region_path`, initialises a
    /// fresh one from `cfg`, and registers a slot for `pid` (a process of
    /// this PID namespace: its identity is read from `/proc`).
    pub fn open(cfg: &Config, pid: i32) -> Result<Self, AttachError> {
        let me = if u32::try_from(pid) == Ok(std::process::id()) {
            ProcIdentity::read_dir(std::path::Path::new("/proc/self"), pid)
        } else {
            ProcIdentity::read(std::path::Path::new("/proc"), pid, pid)
        };
        let file = RegionFile::create_or_open(&cfg.region_path)?;
        let shadow = Box::<Shadow>::default();
        // Until the region's own limits are read, a truncation falls back on
        // the ones this process was given.
        for (dev, &limit) in cfg.mem_limit.iter().enumerate() {
            shadow.see_limit(dev, limit);
        }
        crate::sigbus_guard::guard(
            crate::sigbus_guard::Kind::Region,
            file.region() as *const SharedRegion as *const u8,
            REGION_SIZE,
            Some(&cfg.region_path),
            Some(shadow::repair),
            &*shadow as *const Shadow as usize,
        );
        let att = Self {
            file,
            me,
            last_reclaim_ms: AtomicU64::new(0),
            mutex: Mutex::new(()),
            shadow,
        };
        let path = cfg.region_path.clone();
        let slot = att.with_lock(|r| {
            if r.is_initialized() {
                check_existing(r, cfg);
            } else {
                initialise(r, cfg);
            }
            slots::reclaim_dead(r, &me, slots::probe);
            slots::register(r, &me)
        });
        let slot = slot.map_err(|source| AttachError::Slot { path, source })?;
        att.shadow.see_limits(att.region());
        att.shadow.set_slot(slot, &me);
        vlog!(
            crate::log::INFO,
            "registered in slot {} of {}",
            slot,
            att.file.path().display()
        );
        Ok(att)
    }

    pub fn region(&self) -> &SharedRegion {
        self.file.region()
    }

    /// This process's slot: the shadow holds it, since re-publishing after
    /// a truncation may move it (`Shadow::refill_slot`).
    #[inline]
    pub fn slot_index(&self) -> usize {
        self.shadow.slot()
    }

    #[cfg(test)]
    pub fn pid(&self) -> i32 {
        self.me.pid
    }

    /// This process's own slot.
    #[inline]
    pub fn slot(&self) -> Option<&ProcSlot> {
        self.region().procs.get(self.slot_index())
    }

    /// This slot's `status` word (suspend/resume).
    pub fn status_word(&self) -> Option<&std::sync::atomic::AtomicI32> {
        self.region()
            .procs
            .get(self.slot_index())
            .map(|s| &s.status)
    }

    /// The slot's `hostpid` when someone (the daemon, or our own context
    /// measurement) filled it.
    pub fn host_pid(&self) -> Option<u32> {
        let h = self
            .region()
            .procs
            .get(self.slot_index())?
            .hostpid
            .load(SeqCst);
        u32::try_from(h).ok().filter(|h| *h != 0)
    }

    /// Fills the slot's `hostpid` if it is still 0.
    pub fn set_host_pid(&self, pid: u32) {
        let (Some(s), Ok(pid)) = (
            self.region().procs.get(self.slot_index()),
            i32::try_from(pid),
        ) else {
            return;
        };
        if s.hostpid.compare_exchange(0, pid, SeqCst, SeqCst).is_ok() {
            vlog!(crate::log::INFO, "host pid {pid} recorded in the slot");
        }
    }

    /// Runs `f` under the region lock (in-process mutex + OFD record lock,
    /// which the kernel drops if this process dies). If a *live* holder
    /// keeps it past `LOCK_WAIT`, `f` runs anyway, loudly.
    pub fn with_lock<R>(&self, f: impl FnOnce(&SharedRegion) -> R) -> R {
        crate::sigbus_guard::report_losses();
        let _inproc = self.mutex.lock().unwrap_or_else(|p| p.into_inner());
        let region = self.file.region();
        match lock::lock_timeout(self.file.file(), LOCK_WAIT) {
            Ok(Some(guard)) => {
                region.owner_pid.store(self.me.pid as u64, SeqCst);
                let r = f(region);
                region.owner_pid.store(0, SeqCst);
                drop(guard);
                r
            }
            Ok(None) => {
                vlog!(
                    crate::log::ERROR,
                    "region lock of {} held by live pid {} for {LOCK_WAIT:?}; going on without it",
                    self.file.path().display(),
                    region.owner_pid.load(SeqCst)
                );
                f(region)
            }
            Err(e) => {
                vlog!(
                    crate::log::ERROR,
                    "region lock failed ({e}); going on without it"
                );
                f(region)
            }
        }
    }

    /// Publishes again what a truncation wiped from the region this
    /// process is attached to: its header and limits, and this process's
    /// own slot. The process that faulted on the truncated file re-attached
    /// it (`crate::sigbus_guard`) and refilled its own; the others find the file
    /// already extended, zeroed, and refill theirs here before they next
    /// count anything, so the container's sum holds every process that
    /// allocates again. Two relaxed loads in the common case.
    #[inline]
    pub fn republish_if_wiped(&self) {
        let r = self.region();
        if r.initialized_flag.load(Relaxed) != MAGIC {
            self.shadow.refill(r);
        } else if self
            .slot()
            .is_none_or(|s| s.pid.load(Relaxed) != self.me.pid)
        {
            self.shadow.refill_slot(r);
        }
    }

    /// Whether the region's header is wiped (a truncation this process has
    /// not yet repaired): a limit read from it means nothing.
    #[inline]
    pub fn wiped(&self) -> bool {
        self.region().initialized_flag.load(SeqCst) != MAGIC
    }

    /// Refreshes the shadow's copy of `dev`'s limit (what a truncated
    /// region is refilled with).
    pub fn see_limit(&self, dev: usize) {
        // The shadow keeps the cell as the region holds it: 0 for none.
        self.shadow
            .see_limit(dev, usage::limit(self.region(), dev).unwrap_or(0));
    }

    /// Mirrors in the shadow what `crate::memory::limit` just counted in
    /// this process's slot.
    pub fn note_reserved(&self, dev: usize, bytes: u64, kind: Kind) {
        self.shadow.add(dev, bytes, kind);
    }

    /// Mirrors in the shadow what `crate::memory::limit::release_counted` just
    /// took back from this process's slot.
    pub fn note_released(&self, dev: usize, bytes: u64, kind: Kind) {
        self.shadow.sub(dev, bytes, kind);
    }

    /// Counts memory that already exists, without a limit check: GPU code
    /// the driver loaded (`crate::memory::modules`); a refusal could not
    /// take it back.
    pub fn add_unchecked(&self, dev: usize, bytes: u64, kind: Kind) {
        if let Some(s) = self.region().procs.get(self.slot_index()) {
            usage::add(s, dev, bytes, kind);
            self.shadow.add(dev, bytes, kind);
        }
    }

    /// Frees the slots of dead processes of this namespace; how many.
    pub fn reclaim(&self) -> usize {
        self.last_reclaim_ms.store(monotonic_ms(), Relaxed);
        self.with_lock(|r| slots::reclaim_dead(r, &self.me, slots::probe))
    }

    /// [`Self::reclaim`] at most once per [`RECLAIM_EVERY`], for queries
    /// (cuMemGetInfo, nvmlDeviceGetMemoryInfo) that should not count the memory of processes that
    /// have exited since.
    pub fn reclaim_now_and_then(&self) {
        let now = monotonic_ms();
        let last = self.last_reclaim_ms.load(Relaxed);
        if (last == 0 || now.saturating_sub(last) >= RECLAIM_EVERY.as_millis() as u64)
            && self
                .last_reclaim_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.reclaim();
        }
    }
}

impl Drop for Attachment {
    /// The mapping goes with `file`: the handler must forget it first.
    fn drop(&mut self) {
        crate::sigbus_guard::unguard(self.file.region() as *const SharedRegion as *const u8);
    }
}

/// Milliseconds since the first call, plus one (0 means "never").
pub(crate) fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    // +1 so that 0 keeps meaning "never".
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

fn initialise(r: &SharedRegion, cfg: &Config) {
    r.major_version.store(MAJOR_VERSION, SeqCst);
    r.minor_version.store(MINOR_VERSION, SeqCst);
    r.sm_init_flag.store(0, SeqCst);
    r.owner_pid.store(0, SeqCst);
    for dev in 0..MAX_DEVICES {
        r.limit[dev].store(cfg.mem_limit[dev], SeqCst);
        r.sm_limit[dev].store(cfg.sm_limit[dev], SeqCst);
    }
    // An unlocked glibc `sem_t` (value 1, no waiters, shared), so a HAMi-core
    // process attaching later still works.
    for sem in [&r.sem, &r.sem_postinit] {
        for (i, w) in sem.iter().enumerate() {
            w.store(u32::from(i == 0), SeqCst);
        }
    }
    r.utilization_switch.store(1, SeqCst);
    r.recent_kernel.store(2, SeqCst);
    r.priority.store(cfg.priority, SeqCst);
    // `proc_num` is left alone: zero in a fresh file, and a region whose
    // magic was zeroed may still hold live slots (registration finds them).
    r.initialized_flag.store(MAGIC, SeqCst);
    vlog!(
        crate::log::INFO,
        "created region with limits {:?}",
        &cfg.mem_limit[..4]
    );
}

fn check_existing(r: &SharedRegion, cfg: &Config) {
    let minor = r.minor_version.load(SeqCst);
    if minor != MINOR_VERSION {
        vlog!(
            crate::log::WARN,
            "region minor version {minor}, expected {MINOR_VERSION}"
        );
    }
    // The first creator's limits win (HAMi). Say so once, and only where this
    // process asked for a different limit: a process started without the
    // variable (a shell, nvidia-smi) has nothing to disagree about.
    let differs: Vec<String> = (0..MAX_DEVICES)
        .filter_map(|dev| {
            let (have, want) = (r.limit[dev].load(SeqCst), cfg.mem_limit[dev]);
            (rules::memory_limit(want).is_some() && have != want)
                .then(|| format!("device {dev}: {have} (asked {want})"))
        })
        .collect();
    if !differs.is_empty() {
        vlog!(
            crate::log::WARN,
            "the region's memory limits win over this process's: {}",
            differs.join(", ")
        );
    }
}
