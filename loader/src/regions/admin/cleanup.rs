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
