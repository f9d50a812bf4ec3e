//! Admin operations that write a region: runtime limits, reclaiming dead
//! slots, recovering the lock after its holder died, suspend and resume.
//!
//! Each one validates first and refuses (an [`AdminError`], nothing written)
//! when the operation is unsafe. None moves a slot: other processes keep
//! pointers to their own.
//!
//! The region is a file its container can write, so nothing here maps it:
//! decisions read a [`RegionIo::snapshot`] and changes are single-field
//! `pwrite`s. A signal goes only to a process proven, through a pidfd, to
//! map this very file with the slot's namespace PID.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::lock;
use vgpu_common::region::{status, DeviceMemory, DeviceUtil, ProcSlot, SharedRegion, MAX_DEVICES};
use vgpu_common::region_io::{slot_offset, IoError, RegionIo};

use super::liveness::{catches_signal, proves_slot, signal_target, Alive, AliveBy, Mappers};
use super::summary::{owner_liveness, sem_value, slot_is_clean};

/// How long cleanup waits for the region lock before refusing.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Why an admin operation refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "device {device} is out of range for {path}: it has {count} device(s) (indices 0..{count})"
    )]
    DeviceRange {
        path: PathBuf,
        device: usize,
        count: u64,
    },
    #[error("the region lock of {path} is held by live pid {pid}{}; try again later", host(.host_pid))]
    HeldByLive {
        path: PathBuf,
        pid: u64,
        host_pid: Option<i32>,
    },
    #[error(
        "the region lock of {path} is held now, but owner_pid {owner} names no live process \
         (the holder did not record itself, or a forked child inherited its descriptor); \
         refusing to touch it"
    )]
    HeldByUnknown { path: PathBuf, owner: u64 },
    #[error(
        "owner_pid {pid} of {path} is a live process{} although the lock is free \
         (it is between taking and releasing it); nothing to recover",
        host(.host_pid)
    )]
    OwnerAlive {
        path: PathBuf,
        pid: u64,
        host_pid: Option<i32>,
    },
    #[error(
        "owner_pid {pid} of {path} has no host PID and /proc could not be read in full, \
         so whether it lives in another PID namespace is unknown (run as root); nothing changed"
    )]
    OwnerUndecided { path: PathBuf, pid: u64 },
    #[error("cannot use the region lock of {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "slot {slot} (pid {pid}) has no host PID and no process mapping {path} has that PID \
         in its namespace, so it cannot be signalled safely (is the vgpu daemon running? run as root)"
    )]
    NoSignalTarget {
        path: PathBuf,
        slot: usize,
        pid: i32,
    },
    #[error(
        "pid {host_pid} (slot {slot}) does not handle {signal}: its hook does not implement \
         suspend/resume, and the signal would kill it; nothing was signalled"
    )]
    NotCaught {
        slot: usize,
        host_pid: i32,
        signal: &'static str,
    },
    #[error("cannot send {signal} to pid {host_pid} (slot {slot}): {source}")]
    Signal {
        slot: usize,
        host_pid: i32,
        signal: &'static str,
        source: std::io::Error,
    },
    #[error(
        "slot {slot} names host pid {host_pid}, but that process does not map {path} with \
         namespace pid {pid}: the slot's host PID is not trusted; nothing was signalled"
    )]
    Unproven {
        path: PathBuf,
        slot: usize,
        pid: i32,
        host_pid: i32,
    },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("timed out after {secs:.1} s: {slots} did not report {want}")]
    Timeout {
        secs: f64,
        slots: String,
        want: &'static str,
    },
}

fn host(h: &Option<i32>) -> String {
    h.map(|h| format!(" (host pid {h})")).unwrap_or_default()
}

/// Which per-device limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `limit[]`, bytes.
    Memory,
    /// `sm_limit[]`, percent.
    Sm,
}

/// Which devices an operation applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    One(usize),
    /// Every device of the region (`device_num`, or all 16 before any
    /// process recorded it).
    All,
}

/// One limit written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LimitChange {
    pub device: usize,
    pub old: u64,
    pub new: u64,
    /// Container-wide usage of the device now (bytes).
    pub used_bytes: u64,
}

fn device_count(r: &SharedRegion) -> u64 {
    r.device_num.load(SeqCst)
}

/// The devices `which` names in the region, or a range error (device must
/// be below 16 and below `device_num` when that is set).
pub fn resolve_devices(
    file: &RegionIo,
    r: &SharedRegion,
    which: Devices,
) -> Result<Vec<usize>, AdminError> {
    let n = device_count(r);
    let usable = if n == 0 {
        MAX_DEVICES
    } else {
        (n as usize).min(MAX_DEVICES)
    };
    match which {
        Devices::All => Ok((0..usable).collect()),
        Devices::One(d) if d < usable => Ok(vec![d]),
        Devices::One(device) => Err(AdminError::DeviceRange {
            path: file.path().to_owned(),
            device,
            count: usable as u64,
        }),
    }
}

fn used(r: &SharedRegion, dev: usize) -> u64 {
    r.active_slots()
        .iter()
        .filter(|s| s.pid.load(SeqCst) != 0)
        .map(|s| s.used_total(dev))
        .fold(0, u64::saturating_add)
}

/// Writes `value` into `limit[]` or `sm_limit[]` of the devices. Running
/// processes read these on their allocation / launch paths.
pub fn set_limit(
    file: &RegionIo,
    kind: LimitKind,
    which: Devices,
    value: u64,
) -> Result<Vec<LimitChange>, AdminError> {
    let r = file.snapshot()?;
    let devices = resolve_devices(file, &r, which)?;
    let (cells, base) = match kind {
        LimitKind::Memory => (&r.limit, offset_of!(SharedRegion, limit)),
        LimitKind::Sm => (&r.sm_limit, offset_of!(SharedRegion, sm_limit)),
    };
    let mut out = Vec::new();
    for d in devices {
        file.write_u64((base + d * 8) as u64, value)?;
        out.push(LimitChange {
            device: d,
            old: cells[d].load(SeqCst),
            new: value,
            used_bytes: used(&r, d),
        });
    }
    Ok(out)
}

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

/// Zeroes a slot's counters, identity, host PID and status (not its `pid`)
/// in the file. Device arrays go in one write each.
fn zero_slot(file: &RegionIo, i: usize) -> Result<(), IoError> {
    let base = slot_offset(i);
    let at = |off: usize| base + off as u64;
    file.write_at(
        at(offset_of!(ProcSlot, used)),
        &[0u8; MAX_DEVICES * size_of::<DeviceMemory>()],
    )?;
    file.write_at(
        at(offset_of!(ProcSlot, monitorused)),
        &[0u8; MAX_DEVICES * 8],
    )?;
    file.write_at(
        at(offset_of!(ProcSlot, device_util)),
        &[0u8; MAX_DEVICES * size_of::<DeviceUtil>()],
    )?;
    file.write_u64(at(offset_of!(ProcSlot, seqlock)), 0)?;
    file.write_i32(at(offset_of!(ProcSlot, hostpid)), 0)?;
    file.write_u64(at(offset_of!(ProcSlot, pidns)), 0)?;
    file.write_u64(at(offset_of!(ProcSlot, start)), 0)?;
    file.write_i32(at(offset_of!(ProcSlot, status)), status::EXITED)
}

/// Frees slot `i` of dead namespace PID `pid`, under the region lock (the
/// caller holds it): counters, identity and status zeroed, then `pid`.
/// Returns false, `pid` left, if the slot no longer carries `pid`.
pub fn free_slot(file: &RegionIo, i: usize, pid: i32) -> Result<bool, IoError> {
    zero_slot(file, i)?;
    // Only if nobody re-claimed it meanwhile (a hook going on without the
    // lock). A read then a write, not a compare-and-swap: the window is the
    // two syscalls, under the region lock.
    if file.slot_head(i)?.0 != pid {
        return Ok(false);
    }
    file.write_i32(slot_offset(i), 0)?;
    Ok(true)
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
    let mut clean: Vec<bool> = r.active_slots().iter().map(slot_is_clean).collect();
    for (i, slot) in r.active_slots().iter().enumerate() {
        let pid = slot.pid.load(SeqCst);
        if pid == 0 {
            if !clean[i] {
                zero_slot(file, i)?;
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
        if free_slot(file, i, pid)? {
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

/// Suspend or resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// SIGUSR2; slots report status 2.
    Suspend,
    /// SIGUSR1; slots report status 1.
    Resume,
}

impl SignalAction {
    fn signal(self) -> (rustix::process::Signal, &'static str) {
        match self {
            Self::Suspend => (rustix::process::Signal::USR2, "SIGUSR2"),
            Self::Resume => (rustix::process::Signal::USR1, "SIGUSR1"),
        }
    }

    fn want(self) -> (i32, &'static str) {
        match self {
            Self::Suspend => (status::SUSPENDED, "suspended (status 2)"),
            Self::Resume => (status::RUNNING, "running (status 1)"),
        }
    }

    /// Signals a process must catch for this action to be safe: suspending
    /// a process that could not be resumed is refused too.
    fn needed(self) -> &'static [(i32, &'static str)] {
        match self {
            Self::Suspend => &[(libc::SIGUSR2, "SIGUSR2"), (libc::SIGUSR1, "SIGUSR1")],
            Self::Resume => &[(libc::SIGUSR1, "SIGUSR1")],
        }
    }
}

/// One process to signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Target {
    pub slot: usize,
    pub pid: i32,
    pub host_pid: i32,
}

/// The live processes of the region and their host PIDs, after checking
/// that each one can be signalled safely. All or nothing: one unsafe
/// target refuses the whole operation.
pub fn plan_signal(file: &RegionIo, action: SignalAction) -> Result<Vec<Target>, AdminError> {
    let mappers = Mappers::scan(file.file());
    let r = file.snapshot()?;
    let mut targets = Vec::new();
    for (i, slot) in r.active_slots().iter().enumerate() {
        let pid = slot.pid.load(SeqCst);
        if pid == 0 {
            continue;
        }
        let alive = mappers.slot_liveness(slot);
        if !alive.alive && alive.is_certainly_dead() {
            continue;
        }
        let Some(host_pid) = signal_target(&alive).filter(|_| alive.by != AliveBy::Pid) else {
            return Err(AdminError::NoSignalTarget {
                path: file.path().to_owned(),
                slot: i,
                pid,
            });
        };
        if !proves_slot(host_pid, pid, file.key()) {
            return Err(AdminError::Unproven {
                path: file.path().to_owned(),
                slot: i,
                pid,
                host_pid,
            });
        }
        for &(sig, name) in action.needed() {
            if catches_signal(host_pid, sig) != Some(true) {
                return Err(AdminError::NotCaught {
                    slot: i,
                    host_pid,
                    signal: name,
                });
            }
        }
        targets.push(Target {
            slot: i,
            pid,
            host_pid,
        });
    }
    Ok(targets)
}

/// Sends the action's signal to every target, each through a pidfd taken
/// before the proof is checked again: if the process the proof looked at
/// died and its PID was reused, the signal fails instead of reaching the
/// newcomer.
pub fn send_signal(
    file: &RegionIo,
    targets: &[Target],
    action: SignalAction,
) -> Result<(), AdminError> {
    let (sig, name) = action.signal();
    let signal_err = |t: &Target, source: std::io::Error| AdminError::Signal {
        slot: t.slot,
        host_pid: t.host_pid,
        signal: name,
        source,
    };
    for t in targets {
        let Some(pid) = rustix::process::Pid::from_raw(t.host_pid) else {
            continue;
        };
        let pidfd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::SRCH) => continue, // exited meanwhile
            Err(e) => return Err(signal_err(t, e.into())),
        };
        if !proves_slot(t.host_pid, t.pid, file.key()) {
            return Err(AdminError::Unproven {
                path: file.path().to_owned(),
                slot: t.slot,
                pid: t.pid,
                host_pid: t.host_pid,
            });
        }
        match rustix::process::pidfd_send_signal(&pidfd, sig) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => return Err(signal_err(t, e.into())),
        }
    }
    Ok(())
}

/// Waits until every target's slot reports the action's status (a target
/// whose slot changed owner or whose process exited counts as done).
pub fn wait_status(
    file: &RegionIo,
    targets: &[Target],
    action: SignalAction,
    timeout: Duration,
) -> Result<(), AdminError> {
    let (want, want_name) = action.want();
    let start = Instant::now();
    loop {
        let mut pending = Vec::new();
        for t in targets {
            let (pid, _, st) = file.slot_head(t.slot)?;
            if pid == t.pid && st != want && super::liveness::proc_alive(i64::from(t.host_pid)) {
                pending.push(t);
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            let slots = pending
                .iter()
                .map(|t| format!("slot {} (host pid {})", t.slot, t.host_pid))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(AdminError::Timeout {
                secs: timeout.as_secs_f64(),
                slots,
                want: want_name,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
