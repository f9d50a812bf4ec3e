//! What the daemon reads from `/proc/<pid>`: a process's environment, its
//! PID in its own namespace, its identity (PID namespace, start time), and
//! whether it still exists.

use std::io;
use std::path::PathBuf;

use vgpu_common::proc_identity::is_dead_state;

pub use vgpu_common::proc_identity::ProcIdentity;

/// `/proc` (a parameter so tests can point at a fake tree).
#[derive(Clone, Debug)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Procfs {
    /// A procfs mounted at `root` (tests use a fake tree).
    #[cfg(test)]
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `/proc/<pid>`.
    pub fn dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// Whether process `pid` exists and is not a zombie.
    pub fn alive(&self, pid: u32) -> bool {
        match std::fs::read_to_string(self.dir(pid).join("stat")) {
            Ok(stat) => !is_dead_state(&stat),
            Err(_) => false,
        }
    }

    /// The process's environment as the kernel keeps it (NUL-separated
    /// `KEY=value` records).
    pub fn environ(&self, pid: u32) -> io::Result<Vec<u8>> {
        std::fs::read(self.dir(pid).join("environ"))
    }

    /// The process's PID in its own (innermost) PID namespace, from the
    /// `NSpid:` line of `/proc/<pid>/status`.
    pub fn ns_pid(&self, pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(self.dir(pid).join("status")).ok()?;
        ns_pid_of(&status)
    }

    /// Who process `pid` is, as a slot records it: `ns_pid` (its PID in
    /// its own namespace), the inode of its PID namespace and its start
    /// time (0 for what cannot be read).
    /// A process in another time namespace reads its start time shifted by
    /// that namespace's boot-time offset, so there it is left unknown.
    pub fn identity(&self, pid: u32, ns_pid: u32) -> ProcIdentity {
        let dir = self.dir(pid);
        let mut id = ProcIdentity::read_dir(&dir, i32::try_from(ns_pid).unwrap_or(0));
        if !self.same_time_ns(&dir) {
            id.start = 0;
        }
        id
    }

    /// Whether the process of `dir` shares this process's time namespace
    /// (kernels without time namespaces: yes; unreadable: no).
    fn same_time_ns(&self, dir: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let ino = |d: &std::path::Path| match std::fs::metadata(d.join("ns/time")) {
            Ok(m) => Some(Some(m.ino())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(None),
            Err(_) => None,
        };
        match (ino(dir), ino(&self.root.join("self"))) {
            (Some(a), Some(b)) => a == b || a.is_none() || b.is_none(),
            _ => false,
        }
    }

    /// Whether no process `pid` exists (`/proc/<pid>` is gone; a zombie
    /// still exists).
    pub fn gone(&self, pid: u32) -> bool {
        matches!(
            std::fs::symlink_metadata(self.dir(pid)),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        )
    }

    /// Host PIDs of every process (`/proc/[0-9]*`).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }
}

/// Looks `name` up in NUL-separated `KEY=value` records.
pub fn env_lookup(raw: &[u8], name: &str) -> Option<String> {
    raw.split(|&b| b == 0).find_map(|rec| {
        let rest = rec.strip_prefix(name.as_bytes())?;
        let value = rest.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// The last number of the `NSpid:` line: the PID in the innermost namespace.
pub fn ns_pid_of(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_lookup_is_exact() {
        let raw = b"A=1\0CUDA_DEVICE_MEMORY_SHARED_CACHE_X=no\0CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/r.cache\0";
        assert_eq!(
            env_lookup(raw, "CUDA_DEVICE_MEMORY_SHARED_CACHE").as_deref(),
            Some("/tmp/r.cache")
        );
        assert_eq!(env_lookup(raw, "A").as_deref(), Some("1"));
        assert_eq!(env_lookup(raw, "B"), None);
    }

    #[test]
    fn nspid_takes_the_innermost() {
        let status = "Name:\tx\nNSpid:\t1021\t7\t1\nPPid:\t1\n";
        assert_eq!(ns_pid_of(status), Some(1));
        assert_eq!(ns_pid_of("NSpid:\t42\n"), Some(42));
        assert_eq!(ns_pid_of("Name:\tx\n"), None);
    }
}
