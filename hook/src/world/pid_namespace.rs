//! Which PID this process has where: NVML lists processes by the PID the
//! caller's namespace sees, so the hook must know whether its own PID is
//! the host's.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace.
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Whether this process runs in the initial PID namespace, so its PID is
/// the host PID NVML reports. `/proc/self/ns/pid` names the process's own
/// namespace whatever `/proc` is mounted (`NSpid` in `/proc/self/status`
/// is relative to the `/proc` mount's namespace, so it is not used).
pub fn in_initial_pid_ns() -> bool {
    static INIT: OnceLock<bool> = OnceLock::new();
    *INIT.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .is_some_and(|l| l.as_os_str() == format!("pid:[{INIT_PID_NS_INO}]").as_str())
    })
}

/// This process's host PID when it is known without a guess (the process
/// runs in the initial PID namespace).
pub fn own_host_pid() -> Option<u32> {
    in_initial_pid_ns().then(std::process::id)
}

/// This process's PID in its own PID namespace when that is not the
/// initial one.
pub fn own_ns_pid() -> Option<u32> {
    (!in_initial_pid_ns()).then(std::process::id)
}
