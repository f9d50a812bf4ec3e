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
