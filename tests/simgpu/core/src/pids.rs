//! PID namespaces. `SO_PEERCRED` reports PIDs as the *server's* namespace
//! sees them, so a server started inside a container would record namespace
//! PIDs; this module detects that.

/// Inode of the initial PID namespace on Linux (`PROC_PID_INIT_INO`).
pub const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The inode of this process's PID namespace, if readable.
pub fn pid_ns_inode() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let s = link.to_str()?;
    s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// Whether this process runs in the initial (host) PID namespace. When
/// `/proc` cannot tell, assumes yes.
pub fn in_initial_pid_ns() -> bool {
    pid_ns_inode().is_none_or(|ino| ino == INIT_PID_NS_INO)
}

/// The PID a caller in PID namespace `caller_ns` (its inode; `None`:
/// unknown, taken as the host's) sees for a process with host PID
/// `host_pid`, namespace PID `ns_pid` in namespace `pid_ns`, as the real
/// driver answers process queries: host callers see host PIDs; a caller
/// in a container sees the processes of its own namespace with their
/// namespace PIDs and nothing else. (A caller in an intermediate namespace
/// of nested ones would see the process too; not modelled: such a caller
/// sees only its own namespace's processes.)
pub fn visible_pid(caller_ns: Option<u64>, host_pid: u32, ns_pid: u32, pid_ns: u32) -> Option<u32> {
    match caller_ns {
        None | Some(INIT_PID_NS_INO) => Some(host_pid),
        Some(ns) if pid_ns != 0 && u64::from(pid_ns) == ns => Some(ns_pid),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_callers_see_host_pids_containers_their_own_namespace_pids() {
        let c1 = 4_026_532_100u64;
        assert_eq!(visible_pid(None, 4711, 1, c1 as u32), Some(4711));
        assert_eq!(
            visible_pid(Some(INIT_PID_NS_INO), 4711, 1, c1 as u32),
            Some(4711)
        );
        assert_eq!(visible_pid(Some(c1), 4711, 1, c1 as u32), Some(1));
        // Another container's process, and a host process: hidden.
        assert_eq!(visible_pid(Some(c1), 4800, 1, 4_026_532_200), None);
        assert_eq!(
            visible_pid(Some(c1), 900, 900, INIT_PID_NS_INO as u32),
            None
        );
        // Namespace unknown: never shown inside a container.
        assert_eq!(visible_pid(Some(c1), 900, 900, 0), None);
    }
}
