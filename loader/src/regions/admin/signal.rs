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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regions::admin::testutil::{dead_pid, fixture, me};
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::proc_identity::ProcIdentity;

    static CAUGHT: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn count(_: libc::c_int) {
        CAUGHT.fetch_add(1, Relaxed);
    }

    /// The whole path on this test process, which maps the region as a
    /// hooked process does: refused while it does not catch the signals
    /// (they would kill it), then planned, signalled once through its
    /// pidfd, and waited for until its slot reports the status. One test,
    /// since the handlers are the process's.
    #[test]
    fn a_process_is_signalled_only_when_it_catches_the_signals() {
        let fx = fixture();
        let r = fx.r();
        let (host, id) = me();
        fx.slot(0, id, host, 0);
        fx.slot(1, ProcIdentity { pid: 4242, ..id }, dead_pid(), 0);
        let e = plan_signal(&fx.io, SignalAction::Suspend).unwrap_err();
        assert!(
            matches!(
                e,
                AdminError::NotCaught {
                    slot: 0,
                    signal: "SIGUSR2",
                    ..
                }
            ),
            "{e}"
        );
        for sig in [libc::SIGUSR1, libc::SIGUSR2] {
            // SAFETY: `count` only touches an atomic, which is
            // async-signal-safe; it is a valid `extern "C" fn(c_int)`.
            let old = unsafe {
                libc::signal(
                    sig,
                    count as extern "C" fn(libc::c_int) as libc::sighandler_t,
                )
            };
            assert_ne!(old, libc::SIG_ERR);
        }
        // The dead process's slot is no target.
        let targets = plan_signal(&fx.io, SignalAction::Suspend).unwrap();
        assert_eq!(
            targets,
            vec![Target {
                slot: 0,
                pid: id.pid,
                host_pid: host
            }]
        );
        let before = CAUGHT.load(Relaxed);
        send_signal(&fx.io, &targets, SignalAction::Suspend).unwrap();
        let t = Instant::now();
        while CAUGHT.load(Relaxed) == before && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(CAUGHT.load(Relaxed), before + 1);
        // No hook here to report "suspended": the wait times out naming the
        // slot, then ends once the slot reports it.
        let e = wait_status(
            &fx.io,
            &targets,
            SignalAction::Suspend,
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(
            matches!(&e, AdminError::Timeout { slots, .. } if slots.contains("slot 0")),
            "{e}"
        );
        r.procs[0].status.store(status::SUSPENDED, Relaxed);
        wait_status(&fx.io, &targets, SignalAction::Suspend, Duration::ZERO).unwrap();
    }

    /// A slot whose host PID names a live process that does not map the
    /// region (a forged or stale `hostpid`) refuses the whole operation.
    #[test]
    fn a_hostpid_that_does_not_map_the_region_is_never_signalled() {
        let fx = fixture();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let cpid = child.id() as i32;
        let id = ProcIdentity::read(std::path::Path::new("/proc"), cpid, cpid);
        fx.slot(0, id, cpid, 0);
        let e = plan_signal(&fx.io, SignalAction::Resume).unwrap_err();
        let forged = Target {
            slot: 0,
            pid: cpid,
            host_pid: cpid,
        };
        let sent = send_signal(&fx.io, &[forged], SignalAction::Resume);
        let alive = child.try_wait().unwrap().is_none();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(e, AdminError::Unproven { slot: 0, .. }), "{e}");
        assert!(matches!(sent, Err(AdminError::Unproven { .. })), "{sent:?}");
        assert!(alive, "SIGUSR1 reached the child and killed it");
    }
}
