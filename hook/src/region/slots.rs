//! Process slots, never compacted: a free slot (pid 0, status 0) is reused
//! in place, `proc_num` is only a high-water mark, so no process's slot
//! index ever changes. (HAMi-core's `clear_proc_slot_nolock` compacts by
//! copying the last slot into a hole, under other processes' cached slot
//! pointers.)
//!
//! Nothing in the region is trusted to find a free slot: a slot is claimed
//! by a compare-and-swap of its `pid` from 0, over all `MAX_PROCS` slots
//! whatever `proc_num` says, so a lowered `proc_num` or a zeroed magic never
//! makes a live slot look free. A slot names its process by
//! [`ProcIdentity`] (namespace PID, PID namespace inode, start time): slots of
//! processes in another PID namespace are never taken over nor reclaimed
//! from here (only the daemon, which sees host PIDs, can judge them).
//! Whether a slot's process is dead, and the writes that free its slot, are
//! [`vgpu_common::reclaim`]'s, shared with the daemon and `vgpu cleanup`.
//!
//! Everything here runs under the region lock, except the read-only scans.

use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::proc_identity::{is_dead_state, ProcIdentity};
use vgpu_common::reclaim::{self, SlotStore as _};
use vgpu_common::region::{status, ProcSlot, SharedRegion, MAX_PROCS};

use super::usage;

/// Why no slot could be had.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("all {MAX_PROCS} process slots of the region are taken by live processes")]
    Full,
}

/// Whether slot `s` is recorded in the PID namespace of `me` (or records
/// none: a HAMi-core process, judged as HAMi does, by PID alone).
fn same_namespace(s: &ProcSlot, me: &ProcIdentity) -> bool {
    let ns = s.pidns.load(SeqCst);
    ns == 0 || me.pidns == 0 || ns == me.pidns
}

/// One past the highest slot in use, found by reading every slot; raises
/// `proc_num` to it (repairing a lowered one for every reader, HAMi's
/// monitor included) and the bound this process sums usage over.
fn high_water(region: &SharedRegion) -> usize {
    let n = region
        .procs
        .iter()
        .rposition(|s| s.pid.load(SeqCst) != 0)
        .map_or(0, |i| i + 1);
    region.proc_num.fetch_max(n as i32, SeqCst);
    usage::see_slots(n);
    n
}

/// Claims a slot for `me`: the one that already carries its PID in its
/// namespace (a dead predecessor with a reused PID, or this process before
/// an `exec`: either way its memory is gone), else the first free one,
/// claimed by CAS. Returns the slot index.
pub fn register(region: &SharedRegion, me: &ProcIdentity) -> Result<usize, SlotError> {
    let own = region
        .procs
        .iter()
        .position(|s| s.pid.load(SeqCst) == me.pid && same_namespace(s, me));
    let index = match own {
        Some(i) => i,
        None => region
            .procs
            .iter()
            .position(|s| {
                s.status.load(SeqCst) == status::EXITED
                    && s.pid.compare_exchange(0, me.pid, SeqCst, SeqCst).is_ok()
            })
            .ok_or(SlotError::Full)?,
    };
    let slot = &region.procs[index];
    let Ok(()) = region.zero_counters(index);
    slot.seqlock.store(0, SeqCst);
    slot.hostpid.store(0, SeqCst);
    slot.pidns.store(me.pidns, SeqCst);
    slot.start.store(me.start, SeqCst);
    slot.status.store(status::RUNNING, SeqCst);
    slot.pid.store(me.pid, SeqCst);
    region.proc_num.fetch_max(index as i32 + 1, SeqCst);
    high_water(region);
    Ok(index)
}

/// Frees slot `index` whatever process it holds ([`reclaim::free`]:
/// counters, identity and status zeroed first, then `pid`): a test's way to
/// make a process's slot vanish under it.
#[cfg(test)]
pub fn release(region: &SharedRegion, index: usize) {
    let Some(slot) = region.procs.get(index) else {
        return;
    };
    let Ok(_) = reclaim::free(region, index, slot.pid.load(SeqCst));
}

/// Whether `pid` (in this PID namespace) is a live, non-zombie process.
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !is_dead_state(&stat),
        // No /proc entry (or no /proc): trust kill().
        Err(_) => rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM),
    }
}

/// What `/proc` says of live, non-zombie `pid` of this PID namespace: its
/// PID namespace inode and start time (0 when unreadable); `None` when it
/// is dead.
pub fn probe(pid: i32) -> Option<(u64, u64)> {
    if !pid_alive(pid) {
        return None;
    }
    let id = ProcIdentity::read(std::path::Path::new("/proc"), pid, pid);
    Some((id.pidns, id.start))
}

/// Frees every slot, other than `me`'s, whose process is provably dead: in
/// `me`'s PID namespace, and no live process with its PID, or one started
/// at another time (the PID was reused). `probe` says of a namespace PID:
/// `None` = no live process has it, `Some((pidns, start))` = a live one
/// (0 = unknown). A start time is only compared when `/proc` showed the
/// process in `me`'s namespace (a `/proc` of another namespace names
/// another process by that PID). Returns how many were reclaimed.
pub fn reclaim_dead(
    region: &SharedRegion,
    me: &ProcIdentity,
    probe: impl Fn(i32) -> Option<(u64, u64)>,
) -> usize {
    let mut n = 0;
    for i in 0..high_water(region) {
        let s = &region.procs[i];
        let pid = s.pid.load(SeqCst);
        if pid == 0 {
            if !reclaim::is_clean(s) {
                // A HAMi-core exit leaves counters and status behind; normalise.
                let Ok(()) = reclaim::clear(region, i);
            }
            continue;
        }
        if pid == me.pid || !same_namespace(s, me) {
            continue;
        }
        let recorded = ProcIdentity {
            pid,
            pidns: s.pidns.load(SeqCst),
            start: s.start.load(SeqCst),
        };
        // Only a `/proc` of `me`'s namespace names the slot's process by
        // `pid`: another one's answer is no proof either way.
        let dead = match probe(pid) {
            None => true,
            Some((pidns, start)) => {
                pidns != 0
                    && pidns == me.pidns
                    && reclaim::is_dead(&recorded, Some(&ProcIdentity { pid, pidns, start }))
            }
        };
        if dead && matches!(reclaim::free(region, i, pid), Ok(true)) {
            vlog!(crate::log::INFO, "reclaimed slot {i} of dead pid {pid}");
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_common::view::RegionFile;

    const G: u64 = 1 << 30;

    fn id(pid: i32, pidns: u64, start: u64) -> ProcIdentity {
        ProcIdentity { pid, pidns, start }
    }

    fn region() -> (tempfile::TempDir, RegionFile) {
        let dir = tempfile::tempdir().unwrap();
        let f = RegionFile::create_or_open(&dir.path().join("r.cache")).unwrap();
        (dir, f)
    }

    /// A lowered `proc_num` (0) or a zeroed magic does not make a live
    /// slot look free: the newcomer claims another one, and the live
    /// slot's usage still counts.
    #[test]
    fn a_lowered_proc_num_never_hands_out_a_live_slot() {
        let (_d, f) = region();
        let r = f.region();
        let a = register(r, &id(10, 7, 100)).unwrap();
        usage::add(&r.procs[a], 0, G, usage::Kind::Data);
        r.proc_num.store(0, SeqCst);
        r.initialized_flag.store(0, SeqCst);
        let b = register(r, &id(11, 7, 200)).unwrap();
        assert_ne!(a, b);
        assert_eq!(r.procs[a].pid.load(SeqCst), 10);
        assert_eq!(r.procs[a].used[0].total.load(SeqCst), G);
        assert!(r.proc_count() > a.max(b), "proc_num repaired");
        assert_eq!(usage::container_used(r, 0), G);
    }

    /// Two PID namespaces sharing a region, both PID 1: two slots, each
    /// keeping its own usage; neither reclaims the other's.
    #[test]
    fn the_same_pid_in_two_namespaces_gets_two_slots() {
        let (_d, f) = region();
        let r = f.region();
        let (x, y) = (id(1, 1000, 5), id(1, 2000, 5));
        let a = register(r, &x).unwrap();
        usage::add(&r.procs[a], 0, G, usage::Kind::Data);
        let b = register(r, &y).unwrap();
        assert_ne!(a, b);
        assert_eq!(r.procs[a].used[0].total.load(SeqCst), G);
        // Whatever `probe` says of PID 1, another namespace's slot is not
        // judged from here.
        assert_eq!(reclaim_dead(r, &y, |_| None), 0);
        assert_eq!(reclaim_dead(r, &x, |_| None), 0);
        assert_eq!(usage::container_used(r, 0), G);
        // The same process registering again (exec) takes its own slot back.
        assert_eq!(register(r, &x).unwrap(), a);
    }

    /// A dead process is reclaimed; so is one whose PID now belongs to a
    /// process started at another time. A live one is kept.
    #[test]
    fn dead_and_reused_pids_are_reclaimed_live_ones_kept() {
        let (_d, f) = region();
        let r = f.region();
        let me = id(1, 9, 1);
        register(r, &me).unwrap();
        let dead = register(r, &id(20, 9, 50)).unwrap();
        let reused = register(r, &id(21, 9, 60)).unwrap();
        let live = register(r, &id(22, 9, 70)).unwrap();
        for s in [dead, reused, live] {
            usage::add(&r.procs[s], 0, G, usage::Kind::Data);
        }
        let n = reclaim_dead(r, &me, |pid| match pid {
            21 => Some((9, 61)),
            22 => Some((9, 70)),
            _ => None,
        });
        assert_eq!(n, 2);
        assert_eq!(r.procs[dead].pid.load(SeqCst), 0);
        assert_eq!(r.procs[reused].pid.load(SeqCst), 0);
        assert_eq!(r.procs[live].pid.load(SeqCst), 22);
        assert_eq!(usage::container_used(r, 0), G);
    }
}
