//! The node-wide lock that serialises context measurement across the
//! containers of a node.

#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

const NODE_LOCK_DIR: &str = "/tmp/vgpulock";
const NODE_LOCK: &str = "/tmp/vgpulock/lock";
const NODE_LOCK_WAIT: Duration = Duration::from_secs(3);

/// `flock` on the node-wide lock file (HAMi mounts `/tmp/vgpulock` into
/// every container), released on drop (and by the kernel if the process
/// dies). The directory and file are created 0777 / 0666 when missing,
/// with `chmod` rather than by touching the process's umask.
#[derive(Debug)]
pub struct NodeLock(File);

impl NodeLock {
    /// Takes the lock, waiting at most `NODE_LOCK_WAIT`; `None` (logged)
    /// when the file cannot be opened or stays busy.
    pub fn take() -> Option<Self> {
        let dir = std::path::Path::new(NODE_LOCK_DIR);
        if !dir.is_dir() && std::fs::create_dir(dir).is_ok() {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(NODE_LOCK)
            .map_err(|e| {
                vlog_once!(
                    crate::log::WARN,
                    "{NODE_LOCK}: {e}; measuring contexts without the node lock"
                )
            })
            .ok()?;
        if f.metadata()
            .is_ok_and(|m| m.permissions().mode() & 0o777 != 0o666)
        {
            // Only the owner can chmod; others' failures are harmless.
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        let deadline = Instant::now() + NODE_LOCK_WAIT;
        loop {
            if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
                return Some(Self(f));
            }
            if Instant::now() >= deadline {
                vlog!(
                    crate::log::WARN,
                    "{NODE_LOCK} busy for {NODE_LOCK_WAIT:?}; measuring the context without it"
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for NodeLock {
    /// Unlocks explicitly: a forked child may still hold a copy of the fd.
    fn drop(&mut self) {
        let _ = flock(&self.0, FlockOperation::Unlock);
    }
}
