//! Host-PID fill: the hook registers its slot under its namespace PID and
//! cannot know its host PID inside a PID namespace; the daemon sees both in libcuda and
//! writes `hostpid` into the slot, so NVML's per-process samples (keyed by
//! host PID) can be attributed to it.

use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use vgpu_common::region::status;
use vgpu_common::region_io::IoError;
use vgpu_common::region_place::region_place;

use crate::daemon::apply::{self, Expect, Field, Target, Write};
use crate::daemon::collect::procfs::{env_lookup, ProcIdentity, Procfs};
use crate::daemon::collect::region_cache::{Full, RegionCache, RegionKey, Tenant};
use crate::regions::open::{open_in_process, Access, OpenError};

/// Processes of one region found in one poll share one read of it.
const FRESH: Duration = Duration::from_millis(50);

/// Where a process's slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotRef {
    pub region: RegionKey,
    pub slot: usize,
}

/// Why a process has no slot (yet).
#[derive(Debug, thiserror::Error)]
pub enum Miss {
    /// `/proc/<pid>/environ` is gone or unreadable.
    #[error("cannot read the environment of host pid {0}")]
    Environ(u32),
    /// The region file named by the process does not exist.
    #[error("no region file {0} (hook not loaded, or not initialised yet)")]
    NoRegion(PathBuf),
    /// The region exists but cannot be used.
    #[error("region {path}: {source}")]
    BadRegion {
        path: PathBuf,
        #[source]
        source: Unusable,
    },
    /// The region has no slot with this namespace PID (among the slots the
    /// daemon reads of it); the region is open in the cache.
    #[error("region {path} has no slot for pid {ns_pid}")]
    NoSlot {
        path: PathBuf,
        ns_pid: u32,
        region: RegionKey,
    },
}

impl Miss {
    /// The region the process names, when it is open though no slot of it
    /// is the process's: its limits are still judged.
    pub fn region(&self) -> Option<RegionKey> {
        match self {
            Miss::NoSlot { region, .. } => Some(*region),
            _ => None,
        }
    }
}

/// Why a region file a process names cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Full(#[from] Full),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// What an attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filled {
    pub at: SlotRef,
    /// Whether `hostpid` was written (false: it already held the right value).
    pub wrote: bool,
}

/// The region path a process uses, as it names it.
pub fn region_path_of(procfs: &Procfs, host_pid: u32) -> Result<PathBuf, Miss> {
    let raw = procfs
        .environ(host_pid)
        .map_err(|_| Miss::Environ(host_pid))?;
    Ok(region_place(|name| env_lookup(&raw, name)).0.path())
}

/// Finds the slot of process `me` (host PID `host_pid`) and writes its host
/// PID. The path the process names is resolved inside its own root (never
/// through a symlink, never to a non-regular file).
pub fn fill(
    procfs: &Procfs,
    cache: &mut RegionCache,
    host_pid: u32,
    me: &ProcIdentity,
    cgroup_id: u64,
) -> Result<Filled, Miss> {
    let shown = region_path_of(procfs, host_pid)?;
    let bad = |e: Unusable| Miss::BadRegion {
        path: shown.clone(),
        source: e,
    };
    let file =
        open_in_process(&procfs.dir(host_pid), &shown, Access::ReadWrite).map_err(|e| match e {
            OpenError::Missing { .. } => Miss::NoRegion(shown.clone()),
            e => bad(e.into()),
        })?;
    let (key, open) = cache
        .insert(file, &shown, Tenant::Cgroup(cgroup_id))
        .map_err(|e| bad(e.into()))?;
    if open.cgroup_id.is_none() {
        open.cgroup_id = Some(cgroup_id);
    }
    let region = open.snapshot(FRESH).map_err(|e| bad(e.into()))?;
    let slot = find_slot(region, me).ok_or(Miss::NoSlot {
        path: shown.clone(),
        ns_pid: u32::try_from(me.pid).unwrap_or(0),
        region: key,
    })?;
    let at = SlotRef { region: key, slot };
    let wrote = apply::to_region(&open.file, &the_write(at, me, host_pid)).written();
    Ok(Filled { at, wrote })
}

/// Re-checks a filled slot: `Some(wrote)` while it still belongs to `me`
/// (rewriting `hostpid` if something reset it, e.g. the hook's registration
/// racing the first fill), `None` when the slot was freed or taken by
/// another process, or the region is gone. Reads only the slot's identity
/// words.
pub fn refresh(cache: &RegionCache, at: SlotRef, me: &ProcIdentity, host_pid: u32) -> Option<bool> {
    let file = &cache.get(&at.region)?.file;
    let (_, now_host, st) = file.slot_head(at.slot).ok()?;
    if st == status::EXITED || !is_slot_of(&file.slot_identity(at.slot).ok()?, me) {
        return None;
    }
    let host = i32::try_from(host_pid).ok()?;
    Some(now_host != host && apply::to_region(file, &the_write(at, me, host_pid)).written())
}

/// Whether a slot recording `rec` can be process `me`: the same namespace
/// PID, and the same PID namespace and start time where the slot records
/// them (a HAMi-core hook records neither: PID alone, as HAMi matches).
fn is_slot_of(rec: &ProcIdentity, me: &ProcIdentity) -> bool {
    me.is_recorded_in(rec)
}

/// The live slot (status not exited) of process `me`. Namespace PIDs repeat
/// across PID namespaces (two containers sharing a region both have a PID
/// 1), so a slot that records an identity must record `me`'s; one that
/// records none is taken only when no slot records `me` exactly.
pub fn find_slot(region: &vgpu_common::region::SharedRegion, me: &ProcIdentity) -> Option<usize> {
    let mut unrecorded = None;
    for (i, s) in region.active_slots().iter().enumerate() {
        let rec = ProcIdentity {
            pid: s.pid.load(SeqCst),
            pidns: s.pidns.load(SeqCst),
            start: s.start.load(SeqCst),
        };
        if s.status.load(SeqCst) == status::EXITED || !is_slot_of(&rec, me) {
            continue;
        }
        if rec.pidns == 0 && rec.start == 0 {
            unrecorded.get_or_insert(i);
        } else {
            return Some(i);
        }
    }
    unrecorded
}

/// The fill of slot `at` with `host_pid`: it lands only while the slot
/// still records `me` and holds another value.
fn the_write(at: SlotRef, me: &ProcIdentity, host_pid: u32) -> Write {
    Write {
        target: Target::Region(at.region),
        field: Field::SlotHostPid { slot: at.slot },
        value: u64::from(host_pid),
        expect: Expect::SlotOf(*me),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::region::{MAGIC, MAJOR_VERSION};
    use vgpu_common::view::RegionFile;

    /// A fake /proc with one process whose root is `root`.
    fn fake_proc(dir: &Path, pid: u32, env: &str) {
        let p = dir.join("proc").join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("environ"), env).unwrap();
        std::os::unix::fs::symlink(dir.join("ctr"), p.join("root")).unwrap();
    }

    fn region_at(path: &Path) -> RegionFile {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let f = RegionFile::create_or_open(path).unwrap();
        let r = f.region();
        r.major_version.store(MAJOR_VERSION, Relaxed);
        r.initialized_flag.store(MAGIC, Relaxed);
        f
    }

    #[test]
    fn fills_the_slot_with_the_namespace_pid() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            1021,
            "X=1\0CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0",
        );
        let f = region_at(&dir.path().join("ctr/r/a.cache"));
        let r = f.region();
        r.proc_num.store(2, Relaxed);
        r.procs[0].pid.store(5, Relaxed);
        r.procs[0].status.store(1, Relaxed);
        r.procs[1].pid.store(1, Relaxed);
        r.procs[1].status.store(1, Relaxed);
        let procfs = Procfs::at(dir.path().join("proc"));
        let mut cache = RegionCache::default();

        let got = fill(&procfs, &mut cache, 1021, &procfs.identity(1021, 1), 77).unwrap();
        assert_eq!(got.at.slot, 1);
        assert!(got.wrote);
        assert_eq!(r.procs[1].hostpid.load(Relaxed), 1021);
        assert_eq!(r.procs[0].hostpid.load(Relaxed), 0);
        // Again: nothing to write.
        assert!(
            !fill(&procfs, &mut cache, 1021, &procfs.identity(1021, 1), 77)
                .unwrap()
                .wrote
        );
        // Something reset it: refresh rewrites.
        r.procs[1].hostpid.store(0, Relaxed);
        assert_eq!(
            refresh(&cache, got.at, &procfs.identity(1021, 1), 1021),
            Some(true)
        );
        assert_eq!(r.procs[1].hostpid.load(Relaxed), 1021);
        // The slot was freed: refresh says so.
        r.procs[1].status.store(0, Relaxed);
        assert_eq!(
            refresh(&cache, got.at, &procfs.identity(1021, 1), 1021),
            None
        );
    }

    /// Gives fake process `pid` a PID namespace (a file whose inode stands
    /// for it) and a start time; returns the namespace inode.
    fn fake_identity(dir: &Path, pid: u32, start: u64) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let p = dir.join("proc").join(pid.to_string());
        std::fs::create_dir_all(p.join("ns")).unwrap();
        std::fs::write(p.join("ns/pid"), "").unwrap();
        let zeros = "0 ".repeat(18);
        std::fs::write(p.join("stat"), format!("{pid} (prog) S {zeros}{start} 0")).unwrap();
        std::fs::metadata(p.join("ns/pid")).unwrap().ino()
    }

    /// Two PID namespaces share a region, each with a PID 1: each process
    /// gets its own slot's host PID, and a third PID 1 (a process without
    /// the hook) gets none.
    #[test]
    fn pid_1_of_two_namespaces_each_fill_their_own_slot() {
        let dir = tempfile::tempdir().unwrap();
        let env = "CUDA_DEVICE_MEMORY_SHARED_CACHE=/r/a.cache\0";
        let mut ids = Vec::new();
        for (host, start) in [(2001, 500), (2002, 600), (2003, 700)] {
            fake_proc(dir.path(), host, env);
            ids.push((host, fake_identity(dir.path(), host, start), start));
        }
        let f = region_at(&dir.path().join("ctr/r/a.cache"));
        let r = f.region();
        r.proc_num.store(2, Relaxed);
        // Slot 0 is 2002's, slot 1 is 2001's: the first PID 1 is not theirs.
        for (slot, (_, ns, start)) in [(1, ids[0]), (0, ids[1])] {
            r.procs[slot].pid.store(1, Relaxed);
            r.procs[slot].status.store(1, Relaxed);
            r.procs[slot].pidns.store(ns, Relaxed);
            r.procs[slot].start.store(start, Relaxed);
        }
        let procfs = Procfs::at(dir.path().join("proc"));
        let mut cache = RegionCache::default();
        for _ in 0..2 {
            for (host, slot) in [(2001, 1), (2002, 0)] {
                let me = procfs.identity(host, 1);
                let got = fill(&procfs, &mut cache, host, &me, 0).unwrap();
                assert_eq!(got.at.slot, slot, "host pid {host}");
                assert_eq!(refresh(&cache, got.at, &me, host), Some(false));
            }
        }
        assert_eq!(r.procs[1].hostpid.load(Relaxed), 2001);
        assert_eq!(r.procs[0].hostpid.load(Relaxed), 2002);
        let third = procfs.identity(2003, 1);
        assert!(matches!(
            fill(&procfs, &mut cache, 2003, &third, 0),
            Err(Miss::NoSlot { ns_pid: 1, .. })
        ));
        // A slot taken over by another namespace's PID 1 is no longer ours.
        let at = SlotRef {
            region: cache.iter().next().map(|(k, _)| *k).unwrap(),
            slot: 1,
        };
        r.procs[1].pidns.store(ids[2].1, Relaxed);
        assert_eq!(refresh(&cache, at, &procfs.identity(2001, 1), 2001), None);
        // A slot that records no identity (a HAMi-core hook) is matched by
        // its PID, as before.
        r.procs[1].pidns.store(0, Relaxed);
        r.procs[1].start.store(0, Relaxed);
        r.procs[1].hostpid.store(0, Relaxed);
        cache.refresh();
        let got = fill(&procfs, &mut cache, 2003, &third, 0).unwrap();
        assert_eq!((got.at.slot, got.wrote), (1, true));
        assert_eq!(r.procs[1].hostpid.load(Relaxed), 2003);
        assert_eq!(r.procs[0].hostpid.load(Relaxed), 2002, "untouched");
    }

    #[test]
    fn a_region_named_through_a_symlink_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ctr/r")).unwrap();
        let victim = region_at(&dir.path().join("host/victim.cache"));
        let v = victim.region();
        v.proc_num.store(1, Relaxed);
        v.procs[0].pid.store(1, Relaxed);
        v.procs[0].status.store(1, Relaxed);
        let target = dir.path().join("host/victim.cache");
        std::os::unix::fs::symlink(&target, dir.path().join("ctr/r/abs.cache")).unwrap();
        std::os::unix::fs::symlink(
            "../../host/victim.cache",
            dir.path().join("ctr/r/rel.cache"),
        )
        .unwrap();
        let procfs = Procfs::at(dir.path().join("proc"));
        let mut cache = RegionCache::default();
        for (pid, name) in [
            (11, "/r/abs.cache"),
            (12, "/r/rel.cache"),
            (13, "/../host/victim.cache"),
        ] {
            fake_proc(
                dir.path(),
                pid,
                &format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={name}\0"),
            );
            let got = fill(&procfs, &mut cache, pid, &procfs.identity(pid, 1), 0);
            assert!(
                matches!(&got, Err(Miss::BadRegion { .. }) | Err(Miss::NoRegion(_))),
                "{name}: {got:?}"
            );
        }
        assert_eq!(v.procs[0].hostpid.load(Relaxed), 0, "victim untouched");
        assert_eq!(cache.iter().count(), 0);
    }

    #[test]
    fn misses_say_why() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(dir.path(), 7, "A=1\0");
        let procfs = Procfs::at(dir.path().join("proc"));
        let mut cache = RegionCache::default();
        // No variable: HAMi's default path, absent here.
        assert!(matches!(
            fill(&procfs, &mut cache, 7, &procfs.identity(7, 7), 0),
            Err(Miss::NoRegion(p)) if p == Path::new("/tmp/cudevshr.cache")
        ));
        assert!(matches!(
            fill(&procfs, &mut cache, 8, &procfs.identity(8, 8), 0),
            Err(Miss::Environ(8))
        ));
        fake_proc(dir.path(), 9, "CUDA_DEVICE_MEMORY_SHARED_CACHE=/b.cache\0");
        let _f = region_at(&dir.path().join("ctr/b.cache"));
        assert!(matches!(
            fill(&procfs, &mut cache, 9, &procfs.identity(9, 3), 0),
            Err(Miss::NoSlot { ns_pid: 3, .. })
        ));
    }
}
