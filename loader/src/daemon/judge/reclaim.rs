//! Freeing the slots of dead processes. The hook keeps its slot until its
//! process is dead (the driver holds the memory until then), so once a
//! container's last process exits nobody in it frees the slot, and its
//! usage would count against the limit until `vgpu cleanup` or a new
//! registration. The daemon, which sees host PIDs, frees it as `vgpu
//! cleanup` does.
//!
//! Only a death proven from the kernel's view counts: the slot records an
//! identity (`pidns`, `start`: vgpu's hook) and a host PID, and
//! `/proc/<hostpid>` is gone or is another process (another start time or
//! PID namespace). Never judged: a slot the daemon matched to a process it
//! tracks (alive), one without an identity (HAMi-core's hook, whose PID
//! cannot be told from another namespace's), one without a host PID, one
//! whose process is a zombie. `hostpid` is the tenant's to write: a forged
//! one frees a slot of the tenant's own region, which it can zero anyway
//! (its usage still shows as `over_limit` by the kernel's count).
//!
//! Outside the host's PID namespace (a daemon started without `hostPID`)
//! every host PID looks gone: nothing is judged and nothing freed
//! ([`Reclaimer::new`]), and the daemon says so at start-up and in
//! `/readyz`.
//!
//! Work is bounded: at most [`MAX_CHECKS`] slots are judged and
//! [`MAX_FREES`] freed per region pass, each pass going on where the last
//! one stopped; a slot the dead-slot count found alive at its host PID
//! less than `region_view::RECHECK_ALIVE` ago is not judged again (the
//! two would read the same `/proc` entries). The region lock is tried, never waited for: a tenant can hold
//! it forever, and the region is tried again at the next scan.

use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use vgpu_common::region::{ProcSlot, MAX_DEVICES};

use crate::daemon::apply::{self, SlotFree};
use crate::daemon::collect::procfs::{ProcIdentity, Procfs};
use crate::daemon::collect::region_cache::{RegionCache, RegionKey};
use crate::daemon::judge::hostpid::SlotRef;
use crate::host_pidns::NotHost;
use vgpu_common::reclaim;

/// Slots judged (a `/proc` look-up each) per scan.
pub const MAX_CHECKS: usize = 256;
/// Slots freed per scan.
pub const MAX_FREES: usize = 32;

/// Where the next scan starts, across scans.
#[derive(Debug, Default)]
pub struct Reclaimer {
    cursor: Option<(RegionKey, usize)>,
    /// Why this process cannot judge host PIDs, if it cannot: then it
    /// frees nothing.
    refused: Option<NotHost>,
}

impl Reclaimer {
    /// A reclaimer for a process that sees host PIDs (`Ok`) or not.
    pub fn new(host_pids: Result<(), NotHost>) -> Self {
        Self {
            cursor: None,
            refused: host_pids.err(),
        }
    }

    /// One scan's share: judges and frees slots of the regions in `cache`,
    /// skipping those in `tracked` (slots of live processes the daemon
    /// knows) and those `alive_lately` says were found alive moments ago
    /// (region, slot index, slot as read). Returns how many were freed;
    /// their regions are read anew.
    pub fn run(
        &mut self,
        cache: &mut RegionCache,
        procfs: &Procfs,
        tracked: &HashSet<SlotRef>,
        alive_lately: &dyn Fn(RegionKey, usize, &ProcSlot) -> bool,
    ) -> usize {
        if self.refused.is_some() {
            return 0;
        }
        let mut keys: Vec<RegionKey> = cache.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        let (first, mut from) = match self.cursor.take() {
            Some((key, slot)) => match keys.binary_search(&key) {
                Ok(i) => (i, slot),
                Err(i) => (i % keys.len().max(1), 0),
            },
            None => (0, 0),
        };
        let (mut checks, mut freed) = (0, 0);
        let order: Vec<RegionKey> = keys[first..]
            .iter()
            .chain(&keys[..first])
            .copied()
            .collect();
        for key in order {
            let Some(open) = cache.get(&key) else {
                continue;
            };
            let Some(snap) = open.last_snapshot() else {
                from = 0;
                continue;
            };
            let slots = snap.active_slots();
            let mut dead = Vec::new();
            let mut next = None;
            for (i, s) in slots.iter().enumerate().skip(from) {
                if checks >= MAX_CHECKS || freed + dead.len() >= MAX_FREES {
                    next = Some(i);
                    break;
                }
                let rec = ProcIdentity {
                    pid: s.pid.load(SeqCst),
                    pidns: s.pidns.load(SeqCst),
                    start: s.start.load(SeqCst),
                };
                let hostpid = s.hostpid.load(SeqCst);
                if !judgeable(&rec, hostpid)
                    || tracked.contains(&SlotRef {
                        region: key,
                        slot: i,
                    })
                    || alive_lately(key, i, s)
                {
                    continue;
                }
                checks += 1;
                if proven_dead(procfs, &rec, hostpid) {
                    dead.push(SlotFree {
                        slot: i,
                        rec,
                        hostpid,
                        bytes: (0..MAX_DEVICES)
                            .map(|dev| s.used_total(dev))
                            .fold(0, u64::saturating_add),
                    });
                }
            }
            from = 0;
            if !dead.is_empty() {
                let n = apply::free_slots(&open.file, &dead, |d| {
                    proven_dead(procfs, &d.rec, d.hostpid)
                });
                if n > 0 {
                    freed += n;
                    if let Some(open) = cache.get_mut(&key) {
                        if let Err(e) = open.snapshot(Duration::ZERO) {
                            tracing::debug!("{e}");
                        }
                    }
                }
            }
            if let Some(i) = next {
                self.cursor = Some((key, i));
                return freed;
            }
        }
        freed
    }
}

/// Whether a slot can be judged at all: in use, with an identity and a
/// host PID.
fn judgeable(rec: &ProcIdentity, hostpid: i32) -> bool {
    rec.pid > 0 && rec.pidns != 0 && rec.start != 0 && hostpid > 0
}

/// Whether the process a slot records (`rec`, at host PID `hostpid`) is
/// provably dead ([`reclaim::is_dead`] of what `/proc/<hostpid>` shows).
/// Anything unreadable is not a proof; a zombie still has its identity, so
/// it is not dead yet.
fn proven_dead(procfs: &Procfs, rec: &ProcIdentity, hostpid: i32) -> bool {
    let Ok(host) = u32::try_from(hostpid) else {
        return false;
    };
    if procfs.gone(host) {
        return reclaim::is_dead(rec, None);
    }
    let now = procfs.identity(host, u32::try_from(rec.pid).unwrap_or(0));
    reclaim::is_dead(rec, Some(&now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::collect::region_cache::Tenant;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::lock;
    use vgpu_common::region::{status, MAGIC, MAJOR_VERSION, MAX_PROCS};
    use vgpu_common::region_io::RegionIo;
    use vgpu_common::view::RegionFile;

    /// A fake `/proc/<pid>` with a PID namespace (a file's inode stands for
    /// it) and a start time; returns the namespace inode.
    fn fake_proc(dir: &Path, pid: u32, start: u64) -> u64 {
        let p = dir.join("proc").join(pid.to_string());
        std::fs::create_dir_all(p.join("ns")).unwrap();
        std::fs::write(p.join("ns/pid"), "").unwrap();
        let zeros = "0 ".repeat(18);
        std::fs::write(p.join("stat"), format!("{pid} (p) S {zeros}{start} 0")).unwrap();
        std::fs::metadata(p.join("ns/pid")).unwrap().ino()
    }

    struct Fx {
        dir: tempfile::TempDir,
        file: RegionFile,
        cache: RegionCache,
        key: RegionKey,
    }

    fn fixture() -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let file = RegionFile::create_or_open(&path).unwrap();
        let r = file.region();
        r.major_version.store(MAJOR_VERSION, Relaxed);
        r.initialized_flag.store(MAGIC, Relaxed);
        let io = RegionIo::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap(),
            &path,
            true,
        )
        .unwrap();
        // Every slot: the tests fill more than one container may use.
        let mut cache = RegionCache::with_tenant_slots(MAX_PROCS);
        let key = cache.insert(io, &path, Tenant::Cgroup(1)).unwrap().0;
        Fx {
            dir,
            file,
            cache,
            key,
        }
    }

    impl Fx {
        /// Slot `i` of namespace PID 1 with identity (`ns`, `start`) at
        /// host PID `host`, counting 1 MiB.
        fn slot(&self, i: usize, ns: u64, start: u64, host: i32) {
            let r = self.file.region();
            let s = &r.procs[i];
            s.pid.store(1, Relaxed);
            s.status.store(status::RUNNING, Relaxed);
            s.pidns.store(ns, Relaxed);
            s.start.store(start, Relaxed);
            s.hostpid.store(host, Relaxed);
            s.used[0].total.store(1 << 20, Relaxed);
            r.proc_num.fetch_max(i as i32 + 1, Relaxed);
        }

        fn run(&mut self, r: &mut Reclaimer, tracked: &HashSet<SlotRef>) -> usize {
            self.cache.refresh();
            let procfs = Procfs::at(self.dir.path().join("proc"));
            r.run(&mut self.cache, &procfs, tracked, &|_, _, _| false)
        }

        fn pids(&self) -> Vec<i32> {
            let r = self.file.region();
            (0..r.proc_num.load(Relaxed) as usize)
                .map(|i| r.procs[i].pid.load(Relaxed))
                .collect()
        }
    }

    #[test]
    fn only_proven_deaths_are_freed() {
        let mut fx = fixture();
        let live_ns = fake_proc(fx.dir.path(), 100, 5000);
        let other_ns = fake_proc(fx.dir.path(), 101, 6000);
        fx.slot(0, live_ns, 5000, 100); // alive, same identity
        fx.slot(1, live_ns, 4000, 200); // no /proc/200: dead
        fx.slot(2, live_ns, 4000, 100); // 100 started later: dead
        fx.slot(3, other_ns + 1, 6000, 101); // 101 is in another namespace: dead
        fx.slot(4, 0, 0, 200); // no identity (HAMi-core): never judged
        fx.slot(5, live_ns, 4000, 0); // no host PID: never judged
        fx.slot(6, live_ns, 4000, 200); // dead, but a tracked process's
        let tracked = HashSet::from([SlotRef {
            region: fx.key,
            slot: 6,
        }]);
        let mut r = Reclaimer::default();
        assert_eq!(fx.run(&mut r, &tracked), 3);
        assert_eq!(fx.pids(), vec![1, 0, 0, 0, 1, 1, 1]);
        let reg = fx.file.region();
        for i in 1..=3 {
            let s = &reg.procs[i];
            assert_eq!(s.status.load(Relaxed), status::EXITED, "slot {i}");
            assert_eq!(s.used[0].total.load(Relaxed), 0, "slot {i}");
            assert_eq!((s.pidns.load(Relaxed), s.hostpid.load(Relaxed)), (0, 0));
        }
        assert_eq!(reg.procs[0].used[0].total.load(Relaxed), 1 << 20);
        // The cache was read anew: the freed slots no longer count.
        let snap = fx.cache.get(&fx.key).unwrap().last_snapshot().unwrap();
        assert_eq!(snap.procs[1].pid.load(Relaxed), 0);
        assert_eq!(fx.run(&mut r, &tracked), 0);
    }

    /// A slot the dead-slot count found alive moments ago is not judged
    /// again; once that answer is stale, it is.
    #[test]
    fn a_slot_found_alive_lately_waits_for_its_next_judgement() {
        let mut fx = fixture();
        let ns = fake_proc(fx.dir.path(), 100, 5000);
        fx.slot(0, ns, 4000, 200); // no /proc/200: dead
        fx.slot(1, ns, 4000, 200);
        let key = fx.key;
        let procfs = Procfs::at(fx.dir.path().join("proc"));
        let mut r = Reclaimer::default();
        fx.cache.refresh();
        let lately = |k: RegionKey, i: usize, s: &ProcSlot| {
            k == key && i == 0 && s.hostpid.load(Relaxed) == 200
        };
        assert_eq!(r.run(&mut fx.cache, &procfs, &HashSet::new(), &lately), 1);
        assert_eq!(fx.pids(), vec![1, 0]);
        assert_eq!(fx.run(&mut r, &HashSet::new()), 1);
        assert_eq!(fx.pids(), vec![0, 0]);
    }

    #[test]
    fn outside_the_host_pid_namespace_nothing_is_freed() {
        let mut fx = fixture();
        let ns = fake_proc(fx.dir.path(), 100, 5000);
        fx.slot(0, ns, 4000, 200); // no /proc/200: dead, seen from the host
        fx.slot(1, ns, 4000, 100); // 100 started later
        let mut r = Reclaimer::new(Err(NotHost::OtherNamespace { ino: 0xF000_0001 }));
        assert_eq!(fx.run(&mut r, &HashSet::new()), 0);
        assert_eq!(fx.pids(), vec![1, 1]);
        let mut r = Reclaimer::new(Ok(()));
        assert_eq!(fx.run(&mut r, &HashSet::new()), 2);
    }

    #[test]
    fn a_held_lock_is_not_waited_for() {
        let mut fx = fixture();
        let ns = fake_proc(fx.dir.path(), 100, 5000);
        fx.slot(0, ns, 4000, 200);
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.file.path())
            .unwrap();
        let held = lock::try_lock(&other).unwrap().expect("lock");
        let mut r = Reclaimer::default();
        let t = std::time::Instant::now();
        assert_eq!(fx.run(&mut r, &HashSet::new()), 0);
        assert!(t.elapsed() < Duration::from_millis(500));
        assert_eq!(fx.pids(), vec![1]);
        drop(held);
        assert_eq!(fx.run(&mut r, &HashSet::new()), 1);
        assert_eq!(fx.pids(), vec![0]);
    }

    #[test]
    fn work_per_scan_is_bounded_and_resumes() {
        let mut fx = fixture();
        let ns = fake_proc(fx.dir.path(), 100, 5000);
        for i in 0..MAX_FREES + 8 {
            fx.slot(i, ns, 4000, 200);
        }
        let mut r = Reclaimer::default();
        assert_eq!(fx.run(&mut r, &HashSet::new()), MAX_FREES);
        assert_eq!(fx.run(&mut r, &HashSet::new()), 8);
        assert!(fx.pids().iter().all(|&p| p == 0));
        // Live slots cost a check each: at most MAX_CHECKS per scan, and
        // a dead slot behind them is reached at a later scan.
        let n = 1024.min(MAX_CHECKS + 10);
        for i in 0..n {
            fx.slot(i, ns, 5000, 100);
        }
        fx.slot(n, ns, 4000, 200);
        assert_eq!(fx.run(&mut r, &HashSet::new()), 0);
        assert_eq!(fx.run(&mut r, &HashSet::new()), 1);
        assert_eq!(fx.pids()[n], 0);
        assert!(fx.pids()[..n].iter().all(|&p| p == 1));
    }
}
