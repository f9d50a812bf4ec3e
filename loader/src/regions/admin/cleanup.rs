//! `vgpu cleanup`: frees the slots of dead processes ([`reclaim::free`]),
//! zeroes leftovers in free slots and lowers `proc_num` over trailing free
//! slots, under the region lock.

use std::mem::offset_of;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use vgpu_common::lock;
use vgpu_common::reclaim;
use vgpu_common::region::{SharedRegion, MAX_DEVICES};
use vgpu_common::region_io::RegionIo;

use super::AdminError;
use crate::regions::liveness::{Alive, AliveBy, Mappers};
use crate::regions::summary::owner_liveness;

/// How long cleanup waits for the region lock before refusing.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes the region lock for an admin change, or says who holds it.
fn take_lock<'a>(
    file: &'a RegionIo,
    mappers: &Mappers,
) -> Result<lock::RegionLockGuard<'a>, AdminError> {
    let lock_err = |source| AdminError::Lock {
        path: file.path().to_owned(),
        source,
    };
    if let Some(g) = lock::lock_timeout(file.file(), LOCK_WAIT).map_err(lock_err)? {
        return Ok(g);
    }
    let r = file.snapshot()?;
    let owner = r.owner_pid.load(SeqCst);
    match owner_liveness(&r, mappers) {
        Some(a) if a.alive => Err(AdminError::HeldByLive {
            path: file.path().to_owned(),
            pid: owner,
            host_pid: a.host_pid,
        }),
        _ => Err(AdminError::HeldByUnknown {
            path: file.path().to_owned(),
            owner,
        }),
    }
}

/// A slot cleanup freed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reclaimed {
    pub slot: usize,
    pub pid: i32,
    pub hostpid: i32,
    pub by: AliveBy,
    pub total_bytes: u64,
}

/// What cleanup did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CleanupReport {
    /// Dead processes' slots, freed.
    pub reclaimed: Vec<Reclaimed>,
    /// Free slots (pid 0) whose leftover counters or status were zeroed.
    pub normalised: Vec<usize>,
    /// Slots whose liveness could not be decided (no host PID and `/proc`
    /// not fully readable): left alone.
    pub undecided: Vec<usize>,
    pub proc_num_before: i32,
    pub proc_num_after: i32,
}

/// Frees the slots of dead processes under the region lock, zeroes
/// leftovers in free slots, and lowers `proc_num` over trailing free slots.
/// Live slots, and slots whose liveness cannot be decided, are untouched.
pub fn cleanup(file: &RegionIo) -> Result<CleanupReport, AdminError> {
    // Scan before locking (a registrant maps the file before it locks), then
    // decide under the lock.
    let mappers = Mappers::scan(file.file());
    let _guard = take_lock(file, &mappers)?;
    let r = file.snapshot()?;
    let proc_num_before = r.proc_num.load(SeqCst);
    let mut report = CleanupReport {
        reclaimed: Vec::new(),
        normalised: Vec::new(),
        undecided: Vec::new(),
        proc_num_before,
        proc_num_after: proc_num_before,
    };
    // Processes that registered after the scan are in the slots but not in
    // the scan: re-scan so a live newcomer is never taken for dead.
    let mappers = Mappers::scan(file.file());
    let mut clean: Vec<bool> = r.active_slots().iter().map(reclaim::is_clean).collect();
    for (i, slot) in r.active_slots().iter().enumerate() {
        let pid = slot.pid.load(SeqCst);
        if pid == 0 {
            if !clean[i] {
                reclaim::clear(file, i)?;
                clean[i] = true;
                report.normalised.push(i);
            }
            continue;
        }
        let hostpid = slot.hostpid.load(SeqCst);
        let alive: Alive = mappers.slot_liveness(slot);
        if alive.alive {
            continue;
        }
        if !alive.is_certainly_dead() {
            report.undecided.push(i);
            continue;
        }
        let total = (0..MAX_DEVICES)
            .map(|d| slot.used_total(d))
            .fold(0, u64::saturating_add);
        if reclaim::free(file, i, pid)? {
            clean[i] = true;
            report.reclaimed.push(Reclaimed {
                slot: i,
                pid,
                hostpid,
                by: alive.by,
                total_bytes: total,
            });
        }
    }
    let mut n = clean.len();
    while n > 0 && clean[n - 1] {
        n -= 1;
    }
    let n = n as i32;
    if n != proc_num_before {
        file.write_i32(offset_of!(SharedRegion, proc_num) as u64, n)?;
    }
    report.proc_num_after = file.snapshot()?.proc_num.load(SeqCst);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regions::admin::testutil::{dead_pid, fixture, me};
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::proc_identity::ProcIdentity;
    use vgpu_common::region::status;

    const M: u64 = 1 << 20;

    /// A dead process's slot is freed, a live one's kept, a free slot's
    /// leftovers zeroed, and `proc_num` lowered over the trailing free slots.
    #[test]
    fn dead_slots_are_freed_live_ones_kept_and_proc_num_lowered() {
        let fx = fixture();
        let r = fx.r();
        let (host, id) = me();
        let dead = dead_pid();
        fx.slot(0, id, host, 100 * M);
        // A free slot a HAMi-core exit left with counters and a status.
        fx.slot(1, ProcIdentity { pid: 0, ..id }, 0, 7 * M);
        fx.slot(2, ProcIdentity { pid: 4242, ..id }, dead, 300 * M);
        fx.slot(3, ProcIdentity { pid: 4243, ..id }, dead, 5 * M);
        let report = cleanup(&fx.io).unwrap();
        let freed: Vec<_> = report
            .reclaimed
            .iter()
            .map(|c| (c.slot, c.pid, c.hostpid, c.by, c.total_bytes))
            .collect();
        assert_eq!(
            freed,
            vec![
                (2, 4242, dead, AliveBy::Hostpid, 300 * M),
                (3, 4243, dead, AliveBy::Hostpid, 5 * M)
            ]
        );
        assert_eq!(report.normalised, vec![1]);
        assert!(report.undecided.is_empty());
        assert_eq!((report.proc_num_before, report.proc_num_after), (4, 1));
        assert_eq!(r.proc_num.load(Relaxed), 1);
        for i in 1..=3 {
            assert!(reclaim::is_clean(&r.procs[i]), "slot {i}");
            assert_eq!(r.procs[i].hostpid.load(Relaxed), 0, "slot {i}");
        }
        let live = &r.procs[0];
        assert_eq!(live.pid.load(Relaxed), id.pid);
        assert_eq!(live.status.load(Relaxed), status::RUNNING);
        assert_eq!(live.used_total(0), 100 * M);
        // Nothing left to do.
        let again = cleanup(&fx.io).unwrap();
        assert!(again.reclaimed.is_empty() && again.normalised.is_empty());
    }

    /// A hostpid that names a live process of another identity (reused or
    /// forged) does not keep a slot alive.
    #[test]
    fn a_live_hostpid_of_another_identity_does_not_keep_a_slot() {
        let fx = fixture();
        let (host, id) = me();
        let other = ProcIdentity {
            start: id.start + 1,
            ..id
        };
        fx.slot(0, other, host, M);
        let report = cleanup(&fx.io).unwrap();
        // The mappers decide: this process maps the file but is not the
        // slot's. Root reads all of /proc, so they know no mapper is; without
        // root the slot may be kept (judged by PID alone), never freed by
        // its hostpid.
        assert!(report.reclaimed.iter().all(|c| c.by == AliveBy::Mapping));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(report.reclaimed.len(), 1, "{report:?}");
            assert_eq!(fx.r().procs[0].pid.load(Relaxed), 0);
        }
    }

    /// While a live process holds the region lock, nothing is freed.
    #[test]
    fn a_lock_held_by_a_live_owner_refuses_after_the_wait() {
        let fx = fixture();
        let r = fx.r();
        let (host, id) = me();
        fx.slot(0, id, host, M);
        fx.slot(1, ProcIdentity { pid: 4242, ..id }, dead_pid(), M);
        let other = fx.other_fd();
        let _held = lock::try_lock(&other).unwrap().expect("lock");
        r.owner_pid.store(id.pid as u64, Relaxed);
        let t = std::time::Instant::now();
        let e = cleanup(&fx.io).unwrap_err();
        assert!(t.elapsed() >= LOCK_WAIT);
        assert!(
            matches!(e, AdminError::HeldByLive { host_pid: Some(h), .. } if h == host),
            "{e}"
        );
        assert_eq!(r.procs[1].pid.load(Relaxed), 4242, "nothing freed");
        // An owner that names nobody: the holder is unknown.
        r.owner_pid.store(0, Relaxed);
        let e = cleanup(&fx.io).unwrap_err();
        assert!(
            matches!(e, AdminError::HeldByUnknown { owner: 0, .. }),
            "{e}"
        );
        assert_eq!(r.procs[1].pid.load(Relaxed), 4242);
    }
}
