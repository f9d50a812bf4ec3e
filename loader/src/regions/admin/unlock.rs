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
