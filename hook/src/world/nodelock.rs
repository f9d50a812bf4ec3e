//! The node-wide lock that serialises context measurement across the
//! containers of a node.

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};
use vgpu_common::shared_file::open_or_create;

const NODE_LOCK_DIR: &str = "/tmp/vgpulock";
const NODE_LOCK: &str = "/tmp/vgpulock/lock";
/// HAMi's lock is every tenant's to hold: a context's measurement never
/// waits longer than this for it (it falls back to measuring without).
const NODE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// `flock` on the node-wide lock file (HAMi mounts `/tmp/vgpulock` into
/// every container), released on drop (and by the kernel if the process
/// dies). The directory and file are created 0777 / 0666 when missing,
/// with `chmod` rather than by touching the process's umask; a file that
/// exists is opened only if it is a plain file (no symlink, FIFO or
/// device: `shared_file::open_or_create`) and never chmod-ed.
#[derive(Debug)]
pub struct NodeLock(File);

impl NodeLock {
    /// Takes the lock, waiting at most `NODE_LOCK_WAIT`; `None` (logged)
    /// when the file cannot be opened or stays busy.
    pub fn take() -> Option<Self> {
        Self::take_at(Path::new(NODE_LOCK_DIR), Path::new(NODE_LOCK))
    }

    fn take_at(dir: &Path, lock: &Path) -> Option<Self> {
        if !dir.is_dir() && std::fs::create_dir(dir).is_ok() {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
        }
        let (f, created) = open_or_create(lock)
            .map_err(|e| {
                vlog_once!(
                    crate::log::WARN,
                    "{}: {e}; measuring contexts without the node lock",
                    lock.display()
                )
            })
            .ok()?;
        if created {
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        let deadline = Instant::now() + NODE_LOCK_WAIT;
        loop {
            if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
                return Some(Self(f));
            }
            if Instant::now() >= deadline {
                vlog_once!(
                    crate::log::WARN,
                    "{} busy for {NODE_LOCK_WAIT:?}; measuring the context without it",
                    lock.display()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    /// Another tenant's symlink in place of the lock: the file it names
    /// keeps its mode and content, and the measurement goes on without.
    #[test]
    fn a_symlinked_lock_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("shadow");
        std::fs::write(&victim, b"root:x\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let lock = dir.path().join("lock");
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        assert!(NodeLock::take_at(dir.path(), &lock).is_none());
        let md = victim.metadata().unwrap();
        assert_eq!((md.mode() & 0o777, md.len()), (0o600, 7));
    }

    /// A lock another tenant holds forever delays a context by at most
    /// about `NODE_LOCK_WAIT`; a lock this call creates is world-writable.
    #[test]
    fn a_held_lock_is_waited_on_briefly() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("lock");
        let held = NodeLock::take_at(dir.path(), &lock).unwrap();
        assert_eq!(lock.metadata().unwrap().mode() & 0o777, 0o666);
        let other = File::open(&lock).unwrap();
        drop(held);
        flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        let t = Instant::now();
        assert!(NodeLock::take_at(dir.path(), &lock).is_none());
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
}
