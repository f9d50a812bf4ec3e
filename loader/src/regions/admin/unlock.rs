//! `vgpu unlock`: recovers the lock state after its holder died.

use std::mem::offset_of;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::lock;
use vgpu_common::region::SharedRegion;
use vgpu_common::region_io::RegionIo;

use super::AdminError;
use crate::regions::liveness::{Alive, Mappers};
use crate::regions::summary::{owner_liveness, sem_value};

/// What unlock found and did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UnlockReport {
    pub owner_pid: u64,
    pub held: bool,
    pub owner: Option<Alive>,
    /// `owner_pid` named a dead process and was cleared.
    pub cleared_owner: bool,
    /// HAMi-core's `sem` was stuck at 0 with a dead owner and was reset to 1.
    pub sem_reset: bool,
    /// `sem` is 0 but no owner is recorded: left alone.
    pub sem_zero_without_owner: bool,
}

/// Recovers the lock state after its holder died. The OFD lock itself needs
/// no recovery (the kernel dropped it); this clears a dead `owner_pid` and
/// resets HAMi-core's semaphore if a dead owner left it taken. Refuses while
/// the owner lives or an unknown holder has the lock.
pub fn unlock(file: &RegionIo) -> Result<UnlockReport, AdminError> {
    let lock_err = |source| AdminError::Lock {
        path: file.path().to_owned(),
        source,
    };
    let r = file.snapshot()?;
    let mappers = Mappers::scan(file.file());
    let owner_pid = r.owner_pid.load(SeqCst);
    let owner = owner_liveness(&r, &mappers);
    let held = lock::is_locked(file.file()).map_err(lock_err)?;
    let mut report = UnlockReport {
        owner_pid,
        held,
        owner,
        cleared_owner: false,
        sem_reset: false,
        sem_zero_without_owner: false,
    };
    match owner {
        Some(a) if a.alive => {
            let path = file.path().to_owned();
            return Err(if held {
                AdminError::HeldByLive {
                    path,
                    pid: owner_pid,
                    host_pid: a.host_pid,
                }
            } else {
                AdminError::OwnerAlive {
                    path,
                    pid: owner_pid,
                    host_pid: a.host_pid,
                }
            });
        }
        Some(a) if !a.is_certainly_dead() => {
            // Dead in our namespace only: the owner may live in a container.
            return Err(AdminError::OwnerUndecided {
                path: file.path().to_owned(),
                pid: owner_pid,
            });
        }
        _ => {}
    }
    if held {
        return Err(AdminError::HeldByUnknown {
            path: file.path().to_owned(),
            owner: owner_pid,
        });
    }
    // Exclude vgpu hooks while we clear (they record owner_pid under it).
    let Some(_guard) = lock::try_lock(file.file()).map_err(lock_err)? else {
        return Err(AdminError::HeldByUnknown {
            path: file.path().to_owned(),
            owner: file.snapshot()?.owner_pid.load(SeqCst),
        });
    };
    let r = file.snapshot()?;
    if owner_pid == 0 {
        report.sem_zero_without_owner = sem_value(&r.sem) == 0;
        return Ok(report);
    }
    // The owner is dead: a HAMi-core owner may have died inside sem_wait's
    // critical section, leaving the semaphore at 0. Its waiters use a 10 s
    // sem_timedwait, so they see the reset at their next try without a
    // futex wake (which would need a mapping of the file).
    if sem_value(&r.sem) == 0 {
        file.write_u32(offset_of!(SharedRegion, sem) as u64, 1)?;
        report.sem_reset = true;
    }
    if r.owner_pid.load(SeqCst) == owner_pid {
        file.write_u64(offset_of!(SharedRegion, owner_pid) as u64, 0)?;
        report.cleared_owner = true;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regions::admin::testutil::{dead_pid, fixture, me};
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::proc_identity::ProcIdentity;

    /// A dead owner (its slot's host PID is gone) that left HAMi-core's
    /// semaphore taken: the semaphore is reset and `owner_pid` cleared.
    #[test]
    fn a_dead_owner_is_cleared_and_its_semaphore_reset() {
        let fx = fixture();
        let r = fx.r();
        let (_, id) = me();
        fx.slot(0, ProcIdentity { pid: 4242, ..id }, dead_pid(), 0);
        r.owner_pid.store(4242, Relaxed);
        r.sem[0].store(0, Relaxed);
        let rep = unlock(&fx.io).unwrap();
        assert_eq!(rep.owner_pid, 4242);
        assert!(!rep.held);
        assert!(rep.cleared_owner && rep.sem_reset && !rep.sem_zero_without_owner);
        assert_eq!((r.owner_pid.load(Relaxed), r.sem[0].load(Relaxed)), (0, 1));
        // Again: nothing recorded, nothing done.
        let rep = unlock(&fx.io).unwrap();
        assert!(!rep.cleared_owner && !rep.sem_reset && rep.owner.is_none());
    }

    /// A live owner is never cleared, whether it holds the lock or is
    /// between taking and releasing it; an unknown holder is refused.
    #[test]
    fn a_live_owner_or_an_unknown_holder_is_refused() {
        let fx = fixture();
        let r = fx.r();
        let (host, id) = me();
        fx.slot(0, id, host, 0);
        r.owner_pid.store(id.pid as u64, Relaxed);
        r.sem[0].store(0, Relaxed);
        let e = unlock(&fx.io).unwrap_err();
        assert!(
            matches!(e, AdminError::OwnerAlive { host_pid: Some(h), .. } if h == host),
            "{e}"
        );
        let other = fx.other_fd();
        let held = lock::try_lock(&other).unwrap().expect("lock");
        let e = unlock(&fx.io).unwrap_err();
        assert!(matches!(e, AdminError::HeldByLive { .. }), "{e}");
        assert_eq!(r.owner_pid.load(Relaxed), id.pid as u64);
        assert_eq!(r.sem[0].load(Relaxed), 0, "nothing written");
        // Held, but owner_pid names nobody.
        r.owner_pid.store(0, Relaxed);
        let e = unlock(&fx.io).unwrap_err();
        assert!(
            matches!(e, AdminError::HeldByUnknown { owner: 0, .. }),
            "{e}"
        );
        drop(held);
        // Free, no owner, semaphore at 0: reported, left alone.
        let rep = unlock(&fx.io).unwrap();
        assert!(rep.sem_zero_without_owner && !rep.sem_reset);
        assert_eq!(r.sem[0].load(Relaxed), 0);
    }
}
