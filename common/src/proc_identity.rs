//! What names one process in a region slot across PID namespaces: its PID
//! in its own namespace (`ProcSlot::pid`), the inode of that namespace
//! (`ProcSlot::pidns`) and its start time (`ProcSlot::start`). Two
//! containers sharing a region can both have a PID 1; a PID reused after
//! a death has another start time.

use std::path::Path;

/// A process as a slot records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcIdentity {
    /// PID in the process's own namespace.
    pub pid: i32,
    /// Inode of its PID namespace; 0 = unknown.
    pub pidns: u64,
    /// `/proc/<pid>/stat` field 22 (clock ticks after boot); 0 = unknown.
    pub start: u64,
}

impl ProcIdentity {
    /// The identity of `pid` as seen through `proc` (a procfs mount whose
    /// namespace `pid` is in), with its innermost namespace PID `nspid`.
    /// Unknown parts are 0.
    pub fn read(proc: &Path, pid: i32, nspid: i32) -> Self {
        Self::read_dir(&proc.join(pid.to_string()), nspid)
    }

    /// The identity of the process whose `/proc/<pid>` directory is `dir`
    /// (`/proc/self` for the caller, whichever namespace `/proc` shows).
    pub fn read_dir(dir: &Path, nspid: i32) -> Self {
        Self {
            pid: nspid,
            pidns: pidns_inode(dir).unwrap_or(0),
            start: std::fs::read_to_string(dir.join("stat"))
                .ok()
                .and_then(|s| start_time(&s))
                .unwrap_or(0),
        }
    }

    /// Whether a slot recording `(pidns, start)` can be this process:
    /// every recorded part matches (0 = not recorded, matches anything).
    pub fn matches(&self, pidns: u64, start: u64) -> bool {
        (pidns == 0 || self.pidns == 0 || pidns == self.pidns)
            && (start == 0 || self.start == 0 || start == self.start)
    }

    /// Whether a slot recording `rec` can be this process: the same
    /// namespace PID, and the same PID namespace and start time where the
    /// slot records them.
    pub fn is_recorded_in(&self, rec: &ProcIdentity) -> bool {
        self.pid > 0 && rec.pid == self.pid && self.matches(rec.pidns, rec.start)
    }
}

/// The inode of `<proc_pid_dir>/ns/pid`.
pub fn pidns_inode(proc_pid_dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(proc_pid_dir.join("ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The state letter (field 3) of a `/proc/<pid>/stat` line, read after the
/// last `)` since the command name may hold parentheses.
pub fn state(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Whether a `/proc/<pid>/stat` line is a zombie's or a dead process's.
pub fn is_dead_state(stat: &str) -> bool {
    matches!(state(stat), Some('Z' | 'X' | 'x'))
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after
/// the last `)`.
pub fn start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state).
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_comm() {
        assert_eq!(state("12 (a) b) Z 1 2"), Some('Z'));
        assert_eq!(state("12 (sleep) S 1"), Some('S'));
        assert_eq!(state("garbage"), None);
        assert!(is_dead_state("12 (a) b) Z 1 2"));
        assert!(is_dead_state("12 (x) X 1"));
        assert!(!is_dead_state("12 (sleep) S 1"));
    }

    #[test]
    fn start_time_is_field_22_whatever_the_name() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(start_time(line), Some(987_654));
        assert_eq!(start_time("42 (x) S 1"), None);
        assert_eq!(start_time("garbage"), None);
    }

    #[test]
    fn own_identity_is_read_and_matches_itself_only() {
        let me = std::process::id() as i32;
        let id = ProcIdentity::read(Path::new("/proc"), me, me);
        assert_ne!(id.pidns, 0);
        assert_ne!(id.start, 0);
        assert!(id.matches(id.pidns, id.start));
        assert!(id.matches(0, 0), "legacy slots record nothing");
        assert!(!id.matches(id.pidns + 1, id.start), "another namespace");
        assert!(!id.matches(id.pidns, id.start + 1), "a reused pid");
    }
}
