//! `vgpu suspend` / `vgpu resume`: signals every live process of a region
//! (SIGUSR2 / SIGUSR1) and waits for their slots to report the new status.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_common::region::status;
use vgpu_common::region_io::RegionIo;

use super::AdminError;
use crate::regions::liveness::{
    self, catches_signal, proves_slot, signal_target, AliveBy, Mappers,
};

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
            if pid == t.pid && st != want && liveness::proc_alive(i64::from(t.host_pid)) {
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
