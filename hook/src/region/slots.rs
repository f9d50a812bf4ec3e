//! Process slots (spec §2.6), never compacted: a free slot (pid 0, status 0)
//! is reused in place, `proc_num` is only a high-water mark, so no process's
//! slot index ever changes (HAMi's compaction moves slots under other
//! processes' cached pointers).
//!
//! Everything here runs under the region lock, except the read-only scans.

use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::region::{status, ProcSlot, SharedRegion, MAX_DEVICES, MAX_PROCS};

/// Why no slot could be had.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("all {MAX_PROCS} process slots of the region are taken by live processes")]
    Full,
}

/// Zeroes a slot's counters (usage, NVML samples) and its seqlock.
fn zero_counters(slot: &ProcSlot) {
    for dev in 0..MAX_DEVICES {
        let m = &slot.used[dev];
        m.context_size.store(0, SeqCst);
        m.module_size.store(0, SeqCst);
        m.data_size.store(0, SeqCst);
        m.total.store(0, SeqCst);
        slot.monitorused[dev].store(0, SeqCst);
        slot.device_util[dev].sm_util.store(0, SeqCst);
    }
}

/// Claims a slot for `pid`: a slot that already carries `pid` (PID reuse
/// after a crash), else the first free slot below `proc_num`, else the next
/// one, raising `proc_num`. Returns the slot index.
pub fn register(region: &SharedRegion, pid: i32) -> Result<usize, SlotError> {
    let n = region.proc_count();
    let own = (0..n).find(|&i| region.procs[i].pid.load(SeqCst) == pid);
    let index = match own {
        Some(i) => i,
        None => {
            let free = (0..n).find(|&i| {
                let s = &region.procs[i];
                s.status.load(SeqCst) == status::EXITED
                    && s.pid.compare_exchange(0, pid, SeqCst, SeqCst).is_ok()
            });
            match free {
                Some(i) => i,
                None if n < MAX_PROCS => {
                    region.procs[n].pid.store(pid, SeqCst);
                    region.proc_num.store(n as i32 + 1, SeqCst);
                    n
                }
                None => return Err(SlotError::Full),
            }
        }
    };
    let slot = &region.procs[index];
    zero_counters(slot);
    slot.seqlock.store(0, SeqCst);
    slot.hostpid.store(0, SeqCst);
    slot.status.store(status::RUNNING, SeqCst);
    slot.pid.store(pid, SeqCst);
    Ok(index)
}

/// Frees slot `index`: counters zeroed first, then `status = 0`, `pid = 0`.
pub fn release(region: &SharedRegion, index: usize) {
    let Some(slot) = region.procs.get(index) else {
        return;
    };
    zero_counters(slot);
    slot.seqlock.store(0, SeqCst);
    slot.hostpid.store(0, SeqCst);
    slot.status.store(status::EXITED, SeqCst);
    slot.pid.store(0, SeqCst);
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
        // State is the first field after the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z') | Some('X') | Some('x')
        ),
        // No /proc entry (or no /proc): trust kill().
        Err(_) => rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM),
    }
}

/// Frees every slot below `proc_num` whose process is dead (not `except`).
/// Returns how many were reclaimed.
pub fn reclaim_dead(region: &SharedRegion, except: i32, alive: impl Fn(i32) -> bool) -> usize {
    let mut n = 0;
    for i in 0..region.proc_count() {
        let pid = region.procs[i].pid.load(SeqCst);
        if pid != 0 && pid != except && !alive(pid) {
            vlog!(crate::log::INFO, "reclaiming slot {i} of dead pid {pid}");
            release(region, i);
            n += 1;
        } else if pid == 0 && region.procs[i].status.load(SeqCst) != status::EXITED {
            // A HAMi-core exit leaves counters and status behind; normalise.
            release(region, i);
        }
    }
    n
}
