//! Whether the process of a slot is alive, seen from the host.
//!
//! A slot's `pid` is the process's PID in its own (container) namespace;
//! `hostpid` is filled by the daemon. With a host PID the answer is a look
//! at `/proc/<hostpid>`. Without one, checking `/proc/<pid>` on the host
//! would look at some unrelated process (a container's PID 1 is the host's
//! init), so instead we find the processes that have the region file
//! mapped (every hooked process keeps it mapped until it exits) and compare
//! their innermost namespace PID (`NSpid` in `/proc/<p>/status`) with the
//! slot's `pid`. Only when `/proc` cannot be read in full (not root) do we
//! fall back to `pid` in the caller's namespace, and say so.
//!
//! A slot written by vgpu also records its process's PID namespace inode
//! and start time (`ProcSlot::pidns`, `ProcSlot::start`): a candidate
//! process (the `hostpid`, or a mapper with the right namespace PID) is the
//! slot's only if those match. That tells apart two namespaces sharing a
//! region (both PID 1), and a `hostpid` that was reused, or written by the
//! tenant to name some other process.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;

use vgpu_common::proc_identity::{is_dead_state, pidns_inode, start_time, state, ProcIdentity};
use vgpu_common::region::ProcSlot;

/// How a liveness answer was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AliveBy {
    /// `/proc/<hostpid>` (the slot's host PID is known).
    Hostpid,
    /// A process mapping the region file has this namespace PID.
    Mapping,
    /// `/proc/<pid>` in the caller's PID namespace: right only if the
    /// process runs in that namespace.
    Pid,
}

/// A liveness answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Alive {
    pub alive: bool,
    pub by: AliveBy,
    /// The host PID of the process, when known (from `hostpid` or from the
    /// mapping scan).
    pub host_pid: Option<i32>,
}

impl Alive {
    /// Whether "dead" can be trusted enough to reclaim the slot. Never
    /// outside the host's PID namespace: there every host PID looks gone,
    /// and the processes mapping the region are only this namespace's.
    pub fn is_certainly_dead(&self) -> bool {
        !self.alive && self.by != AliveBy::Pid && crate::host_pidns::sees_host_pids()
    }
}

/// Whether `pid` (in the caller's namespace) is a live, non-zombie process.
pub fn proc_alive(pid: i64) -> bool {
    proc_stat(pid).is_some_and(|stat| stat_alive(&stat))
}

/// Whether a `/proc/<pid>/stat` line is a live, non-zombie process's (a
/// line with no state is no live process either).
fn stat_alive(stat: &str) -> bool {
    state(stat).is_some() && !is_dead_state(stat)
}

/// `/proc/<pid>/stat` of `pid` (in the caller's namespace), read with as
/// few system calls as the kernel allows: the daemon reads it for
/// thousands of slots.
fn proc_stat(pid: i64) -> Option<String> {
    use std::io::Read as _;
    if pid <= 0 || pid > i64::from(i32::MAX) {
        return None;
    }
    let mut f = File::open(format!("/proc/{pid}/stat")).ok()?;
    // The line is a few hundred bytes (the name is at most 64); a longer
    // one is read on to its end all the same.
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(buf).ok()
}

/// The processes that map one region file: host PID and identity
/// (innermost namespace PID, PID namespace inode, start time).
#[derive(Debug, Clone, Default)]
pub struct Mappers {
    procs: Vec<(i32, ProcIdentity)>,
    /// Namespace PIDs of processes whose maps could not be read (they may
    /// map the region unseen).
    unreadable: Vec<i32>,
    /// Some process could be read neither its maps nor its status, or the
    /// scan could not run at all: any PID may be hidden.
    opaque: bool,
}

/// Whether one line of `/proc/<pid>/maps` maps inode `ino` of device
/// `want_dev` (`maps`' `major:minor` hex form).
fn maps_line_is(line: &str, want_dev: &str, ino: u64) -> bool {
    let mut f = line.split_ascii_whitespace();
    let (dev, inode) = (f.nth(3), f.next());
    dev == Some(want_dev) && inode.and_then(|i| i.parse().ok()) == Some(ino)
}

fn maps_dev(dev: u64) -> String {
    format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev))
}

/// Whether host process `host_pid` maps the region file `(dev, ino)` and
/// sees itself as `ns_pid` (last `NSpid`): the proof required before a
/// slot's `hostpid`, which its container can write, is signalled.
pub fn proves_slot(host_pid: i32, ns_pid: i32, (dev, ino): (u64, u64)) -> bool {
    if host_pid <= 0 || ns_pid <= 0 {
        return false;
    }
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{host_pid}/maps")) else {
        return false;
    };
    let want_dev = maps_dev(dev);
    maps.lines().any(|l| maps_line_is(l, &want_dev, ino))
        && innermost_nspid(host_pid) == Some(ns_pid)
        && proc_alive(i64::from(host_pid))
}

impl Mappers {
    /// Scans `/proc/*/maps` for mappings of `file`'s inode.
    pub fn scan(file: &File) -> Self {
        let Ok(meta) = file.metadata() else {
            return Self::none();
        };
        let (dev, ino) = (meta.dev(), meta.ino());
        let want_dev = maps_dev(dev);
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Self::none();
        };
        let mut out = Self::default();
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let maps = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(_) => {
                    // Not readable (e.g. a more privileged process): its
                    // namespace PID says which slots it could hide.
                    match innermost_nspid(pid) {
                        Some(ns) => out.unreadable.push(ns),
                        None => out.opaque = true,
                    }
                    continue;
                }
            };
            let maps_it = maps.lines().any(|l| maps_line_is(l, &want_dev, ino));
            if maps_it && proc_alive(i64::from(pid)) {
                if let Some(ns) = innermost_nspid(pid) {
                    out.procs
                        .push((pid, ProcIdentity::read(Path::new("/proc"), pid, ns)));
                }
            }
        }
        out
    }

    /// A scan that found nothing and is not trusted.
    pub fn none() -> Self {
        Self {
            opaque: true,
            ..Self::default()
        }
    }

    /// Whether the scan can tell that no process with namespace PID `pid`
    /// maps the region.
    fn decides(&self, pid: i32) -> bool {
        !self.opaque && !self.unreadable.contains(&pid)
    }

    /// The host PID of the one mapping process that can be `slot`.
    fn host_pid_matching(&self, slot: &ProcIdentity) -> Option<i32> {
        let mut it = self.matching(slot);
        match (it.next(), it.next()) {
            (Some(host), None) => Some(host),
            _ => None,
        }
    }

    fn matching<'a>(&'a self, slot: &'a ProcIdentity) -> impl Iterator<Item = i32> + 'a {
        self.procs
            .iter()
            .filter(|(_, id)| id.pid == slot.pid && id.matches(slot.pidns, slot.start))
            .map(|(host, _)| *host)
    }

    /// Liveness of a slot (or lock owner) with namespace PID `pid` and host
    /// PID `hostpid` (0 = unknown), no identity recorded.
    pub fn liveness(&self, pid: i32, hostpid: i32) -> Alive {
        self.liveness_of(
            &ProcIdentity {
                pid,
                pidns: 0,
                start: 0,
            },
            hostpid,
        )
    }

    /// Liveness of the process of `slot`, its identity included.
    pub fn slot_liveness(&self, slot: &ProcSlot) -> Alive {
        let id = ProcIdentity {
            pid: slot.pid.load(SeqCst),
            pidns: slot.pidns.load(SeqCst),
            start: slot.start.load(SeqCst),
        };
        self.liveness_of(&id, slot.hostpid.load(SeqCst))
    }

    /// Liveness of a process recorded as `slot` with host PID `hostpid`. A
    /// live `hostpid` whose identity differs from the recorded one is not
    /// the slot's process: the answer then comes from the mappers.
    pub fn liveness_of(&self, slot: &ProcIdentity, hostpid: i32) -> Alive {
        let pid = slot.pid;
        if hostpid > 0 {
            // One read of the stat line answers both "alive" and "started
            // when the slot says".
            let stat = proc_stat(i64::from(hostpid));
            let alive = stat.as_deref().is_some_and(stat_alive);
            let recorded = slot.pidns != 0 || slot.start != 0;
            let same = || {
                let now = ProcIdentity {
                    pid,
                    pidns: pidns_inode(&Path::new("/proc").join(hostpid.to_string())).unwrap_or(0),
                    start: stat.as_deref().and_then(start_time).unwrap_or(0),
                };
                now.matches(slot.pidns, slot.start)
            };
            if !alive || !recorded || same() {
                return Alive {
                    alive,
                    by: AliveBy::Hostpid,
                    host_pid: Some(hostpid),
                };
            }
        }
        if self.decides(pid) {
            let host = self.host_pid_matching(slot);
            return Alive {
                alive: self.matching(slot).next().is_some(),
                by: AliveBy::Mapping,
                host_pid: host,
            };
        }
        if let Some(host) = self.host_pid_matching(slot) {
            return Alive {
                alive: true,
                by: AliveBy::Mapping,
                host_pid: Some(host),
            };
        }
        Alive {
            alive: proc_alive(i64::from(pid)),
            by: AliveBy::Pid,
            host_pid: None,
        }
    }
}

/// The last `NSpid` entry of `/proc/<pid>/status`: the PID the process sees
/// for itself (what the hook writes into `pid`).
fn innermost_nspid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
    match nspid {
        Some(rest) => rest.split_ascii_whitespace().last()?.parse().ok(),
        // Kernels without NSpid (< 4.1): no nested namespaces to tell.
        None => Some(pid),
    }
}

/// The host PID to signal for a slot: `hostpid` when known, else the one
/// process mapping the region with that namespace PID.
pub fn signal_target(alive: &Alive) -> Option<i32> {
    alive.host_pid.filter(|_| alive.alive)
}

/// Whether process `host_pid` catches signal `sig` (`SigCgt` in its
/// status): sending SIGUSR1/2 to a process that does not would kill it.
pub fn catches_signal(host_pid: i32, sig: i32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())?;
    let bit = u32::try_from(sig - 1).ok()?;
    Some(mask.checked_shr(bit).is_some_and(|m| m & 1 == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_maps_a_file_and_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        let map = memmap2::MmapOptions::new()
            .map_raw_read_only(&file)
            .unwrap();
        let me = std::process::id() as i32;
        let m = Mappers::scan(&file);
        let got = m.liveness(me, 0);
        assert!(got.alive, "{got:?}");
        assert_eq!(got.host_pid, Some(me));
        let md = file.metadata().unwrap();
        let key = (md.dev(), md.ino());
        let my_ns = innermost_nspid(me).unwrap();
        assert!(proves_slot(me, my_ns, key));
        assert!(!proves_slot(me, my_ns + 1, key), "namespace pid must match");
        assert!(
            !proves_slot(me, my_ns, (md.dev(), md.ino() + 1)),
            "another file"
        );
        drop(map);
        assert!(!proves_slot(me, my_ns, key), "no longer mapped");
        let m = Mappers::scan(&file);
        if m.decides(me) {
            assert!(!m.liveness(me, 0).alive);
        }
    }

    /// A candidate process is the slot's only if the recorded PID
    /// namespace and start time match: another namespace's PID 1, a reused
    /// PID or a forged `hostpid` is not the slot's process.
    #[test]
    fn identity_must_match_for_hostpid_and_mappers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.cache");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        let _map = memmap2::MmapOptions::new()
            .map_raw_read_only(&file)
            .unwrap();
        let me = std::process::id() as i32;
        let id = ProcIdentity::read(Path::new("/proc"), me, me);
        let m = Mappers::scan(&file);
        let got = m.liveness_of(&id, 0);
        assert!(got.alive && got.host_pid == Some(me), "{got:?}");
        let got = m.liveness_of(&id, me);
        assert_eq!((got.alive, got.by), (true, AliveBy::Hostpid));
        let other_ns = ProcIdentity {
            pidns: id.pidns + 1,
            ..id
        };
        let reused = ProcIdentity {
            start: id.start + 1,
            ..id
        };
        for slot in [other_ns, reused] {
            // The hostpid (this process) is not the slot's: the mappers
            // decide, and none is.
            for hostpid in [0, me] {
                let got = m.liveness_of(&slot, hostpid);
                if m.decides(me) {
                    assert_eq!((got.alive, got.by), (false, AliveBy::Mapping), "{slot:?}");
                } else {
                    assert_ne!(got.by, AliveBy::Hostpid, "{slot:?}");
                }
                assert_eq!(got.host_pid, None, "{slot:?}");
            }
        }
    }

    #[test]
    fn hostpid_wins_and_dead_pids_are_dead() {
        let m = Mappers::none();
        let me = std::process::id() as i32;
        assert_eq!(m.liveness(12345, me).by, AliveBy::Hostpid);
        assert!(m.liveness(12345, me).alive);
        assert!(!proc_alive(0));
        assert!(!proc_alive(-1));
        assert_eq!(m.liveness(me, 0).by, AliveBy::Pid);
    }
}
