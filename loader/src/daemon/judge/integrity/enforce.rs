//! The integrity policy's actions: the writes that put a tampered limit
//! back (made by `daemon::apply`), and killing a process, only once it is
//! proven to be the one meant.

use std::io;
use std::os::fd::OwnedFd;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use vgpu_common::region_io::RegionIo;

use crate::daemon::apply::{self, Expect, Field, Target, Write};
use crate::daemon::collect::procfs::Procfs;
use crate::daemon::collect::region_cache::RegionKey;
use crate::daemon::state::findings::{LimitMismatch, LimitName};

/// The writes that put each mismatched limit's expected value back, each
/// only where the cell still holds what was found (a newer write, an
/// admin's included, is not overwritten; one racing this read is seen at
/// the next scan, against its recorded override).
pub fn restores(region: RegionKey, mismatches: &[LimitMismatch]) -> Vec<Write> {
    mismatches
        .iter()
        .map(|m| Write {
            target: Target::Region(region),
            field: Field::Limit {
                limit: m.limit,
                device: m.device,
            },
            value: m.expected,
            expect: match m.limit {
                LimitName::MemoryBytes => Expect::Holds(m.found),
                LimitName::SmPercent => Expect::ShowsSmLimit(m.found),
            },
        })
        .collect()
}

/// Writes each mismatched limit's expected value back into the region open
/// as `io` ([`restores`], carried out by `daemon::apply`). Returns how
/// many cells it wrote.
pub fn restore(io: &RegionIo, mismatches: &[LimitMismatch]) -> usize {
    restores(io.key(), mismatches)
        .iter()
        .filter(|w| apply::to_region(io, w).written())
        .count()
}

/// Why a process was not killed.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("host pid {0} is not a valid pid")]
    BadPid(u32),
    #[error("cannot open host pid {pid}: {source}")]
    Open {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("host pid {pid} is not in cgroup {cgroup} (it is in {found:?})")]
    NotInCgroup {
        pid: u32,
        cgroup: String,
        found: Option<String>,
    },
    #[error("host pid {0} exited before it could be killed")]
    Exited(u32),
    #[error("cannot signal host pid {pid}: {source}")]
    Signal {
        pid: u32,
        #[source]
        source: io::Error,
    },
}

/// SIGKILLs host process `pid` after proving it is in `cgroup` (the
/// container's cgroup path, from the probes' cgroup id). The pidfd pins
/// the process: the cgroup read from `/proc/<pid>` is that process's as
/// long as it has not exited when checked after the read, since a PID is
/// not reused before its process is reaped. The PID comes from the
/// kernel's view (the probes or NVML), never from a region.
pub fn kill_in_cgroup(procfs: &Procfs, pid: u32, cgroup: &str) -> Result<(), KillError> {
    let raw = i32::try_from(pid).map_err(|_| KillError::BadPid(pid))?;
    let p = Pid::from_raw(raw).ok_or(KillError::BadPid(pid))?;
    let fd = pidfd_open(p, PidfdFlags::empty()).map_err(|e| KillError::Open {
        pid,
        source: e.into(),
    })?;
    let found = std::fs::read_to_string(procfs.dir(pid).join("cgroup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        });
    if cgroup.is_empty() || found.as_deref() != Some(cgroup) {
        return Err(KillError::NotInCgroup {
            pid,
            cgroup: cgroup.to_owned(),
            found,
        });
    }
    if exited(&fd) {
        return Err(KillError::Exited(pid));
    }
    pidfd_send_signal(&fd, Signal::KILL).map_err(|e| KillError::Signal {
        pid,
        source: e.into(),
    })
}

/// A pidfd is readable once its process has exited.
fn exited(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // An error is not proof the process is alive: treat it as exited.
    poll(&mut fds, Some(&zero)).map_or(true, |n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use vgpu_common::view::RegionFile;

    #[test]
    fn restore_writes_back_only_what_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        let f = RegionFile::create_or_open(&path).unwrap();
        let r = f.region();
        r.major_version
            .store(vgpu_common::region::MAJOR_VERSION, Relaxed);
        r.initialized_flag
            .store(vgpu_common::region::MAGIC, Relaxed);
        r.limit[0].store(64 << 30, Relaxed);
        r.limit[1].store(5, Relaxed);
        r.sm_limit[2].store(0, Relaxed);
        let m = |device, limit, expected, found| LimitMismatch {
            device,
            limit,
            expected,
            found,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let io = RegionIo::new(file, &path, true).unwrap();
        let n = restore(
            &io,
            &[
                m(0, LimitName::MemoryBytes, 1 << 30, 64 << 30),
                // Changed since it was seen: left alone.
                m(1, LimitName::MemoryBytes, 1 << 30, 4),
                m(2, LimitName::SmPercent, 30, 100),
                m(99, LimitName::SmPercent, 30, 100),
            ],
        );
        assert_eq!(n, 2);
        assert_eq!(r.limit[0].load(Relaxed), 1 << 30);
        assert_eq!(r.limit[1].load(Relaxed), 5);
        assert_eq!(r.sm_limit[2].load(Relaxed), 30);
    }

    #[test]
    fn kill_needs_the_cgroup() {
        let procfs = Procfs::default();
        let me = std::process::id();
        let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mine = mine
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .to_owned();
        // Another cgroup: refused (and this test survives it).
        let e = kill_in_cgroup(&procfs, me, "/not/mine").unwrap_err();
        assert!(matches!(e, KillError::NotInCgroup { .. }), "{e}");
        assert!(matches!(
            kill_in_cgroup(&procfs, me, ""),
            Err(KillError::NotInCgroup { .. })
        ));
        assert!(matches!(
            kill_in_cgroup(&procfs, 0, &mine),
            Err(KillError::BadPid(0))
        ));
        // A child in the same cgroup is killed.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        kill_in_cgroup(&procfs, child.id(), &mine).unwrap();
        let st = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL)
        );
    }
}
