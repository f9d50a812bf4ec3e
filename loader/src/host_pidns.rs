//! Whether this process sees the host's PIDs: it runs in the initial PID
//! namespace and its `/proc` is that namespace's procfs.
//!
//! Host PIDs (from the probes, NVML and slots' `hostpid`) mean something
//! only there. Elsewhere (a daemon started without `hostPID`) every host PID
//! looks gone, so a look-up of `/proc/<hostpid>` proves nothing and no slot
//! may be freed on it.
//!
//! Comparing `/proc/self/ns/pid` with `/proc/1/ns/pid` proves nothing inside
//! a container (its PID 1 shares its namespace). What does:
//! - the kernel gives the initial PID namespace a fixed inode number
//!   (`PROC_PID_INIT_INO`), while every other namespace gets one from
//!   `PROC_DYNAMIC_FIRST` (0xF0000000) up, so `/proc/self/ns/pid` names the
//!   initial namespace exactly when its inode is that number;
//! - `NSpid:` in `/proc/self/status` lists this process's PID in each
//!   namespace from the procfs's own down to the process's: one entry means
//!   the procfs belongs to this process's namespace (a host `/proc`
//!   bind-mounted into a container would list two).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// `PROC_PID_INIT_INO` (`include/linux/proc_ns.h`), fixed since Linux 3.8.
pub const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Why this process cannot judge host PIDs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotHost {
    #[error("cannot read {what}: {error}")]
    Unreadable { what: &'static str, error: String },
    #[error(
        "not in the host's PID namespace (its inode is {ino}, the host's is {INIT_PID_NS_INO}; \
         run with hostPID: true)"
    )]
    OtherNamespace { ino: u64 },
    #[error(
        "/proc is not this PID namespace's procfs (NSpid lists {entries} PIDs; mount the \
         host's /proc, run with hostPID: true)"
    )]
    ForeignProcfs { entries: usize },
    #[error("/proc/self/status has no NSpid line (kernel older than 4.1?)")]
    NoNspid,
}

/// Whether the process whose `/proc` is at `proc_root` (normally `/proc`)
/// sees host PIDs.
pub fn check(proc_root: &Path) -> Result<(), NotHost> {
    let me = proc_root.join("self");
    let ino = std::fs::metadata(me.join("ns/pid"))
        .map_err(|e| NotHost::Unreadable {
            what: "/proc/self/ns/pid",
            error: e.to_string(),
        })?
        .ino();
    let status = std::fs::read_to_string(me.join("status")).map_err(|e| NotHost::Unreadable {
        what: "/proc/self/status",
        error: e.to_string(),
    })?;
    decide(ino, &status)
}

/// The decision over what [`check`] read: the PID namespace inode of
/// `/proc/self` and its `status`.
pub fn decide(pidns_ino: u64, status: &str) -> Result<(), NotHost> {
    let entries = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| rest.split_ascii_whitespace().count())
        .ok_or(NotHost::NoNspid)?;
    if entries != 1 {
        return Err(NotHost::ForeignProcfs { entries });
    }
    if pidns_ino != INIT_PID_NS_INO {
        return Err(NotHost::OtherNamespace { ino: pidns_ino });
    }
    Ok(())
}

/// [`check`] of `/proc`, once per process (the namespace of a process never
/// changes; `setns` into a PID namespace affects only children).
pub fn sees_host_pids() -> bool {
    static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| check(Path::new("/proc")).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_initial_namespace_with_its_own_procfs_is_the_host() {
        let one = "Name:\tvgpu\nNSpid:\t4711\nPPid:\t1\n";
        assert_eq!(decide(INIT_PID_NS_INO, one), Ok(()));
        // A container: its own namespace, its own procfs (one NSpid entry).
        assert_eq!(
            decide(0xF000_0123, "NSpid:\t1\n"),
            Err(NotHost::OtherNamespace { ino: 0xF000_0123 })
        );
        // A container with the host's /proc bind-mounted: two entries.
        assert_eq!(
            decide(INIT_PID_NS_INO, "NSpid:\t4711\t1\n"),
            Err(NotHost::ForeignProcfs { entries: 2 })
        );
        assert_eq!(decide(INIT_PID_NS_INO, "Name:\tx\n"), Err(NotHost::NoNspid));
    }

    #[test]
    fn a_fake_proc_tree_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("self");
        std::fs::create_dir_all(me.join("ns")).unwrap();
        std::fs::write(me.join("ns/pid"), "").unwrap();
        std::fs::write(me.join("status"), "NSpid:\t7\n").unwrap();
        // A plain file's inode is never the initial namespace's.
        assert!(matches!(
            check(dir.path()),
            Err(NotHost::OtherNamespace { .. })
        ));
        let gone = dir.path().join("nothing");
        assert!(matches!(check(&gone), Err(NotHost::Unreadable { .. })));
    }
}
