//! Starting the server on demand.
//!
//! A client that cannot connect takes an exclusive `flock` on
//! `$SIMGPU_DIR/start.lock`, tries again (another process may have just
//! started it), and otherwise spawns `simgpu-server` detached (`setsid` and
//! a second fork, so it outlives the caller and is reparented away from
//! it), with stdio on `$SIMGPU_DIR/server.log` so it never holds the
//! caller's pipes, and without `LD_PRELOAD`.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::SimError;

/// Name of the start lock file.
pub const START_LOCK: &str = "start.lock";
/// Name of the server binary.
pub const SERVER_BIN: &str = "simgpu-server";
/// Name of the server's log file.
pub const SERVER_LOG: &str = "server.log";

/// An exclusive `flock` on `$SIMGPU_DIR/start.lock`, released on drop.
pub struct StartLock {
    file: File,
}

impl StartLock {
    /// Blocks until the lock is ours.
    pub fn take(dir: &Path) -> Result<StartLock, SimError> {
        StartLock::take_with(dir, libc::LOCK_EX)?
            .ok_or_else(|| SimError::io("flock start.lock", std::io::Error::other("busy")))
    }

    /// Takes the lock if free, else None.
    pub fn try_take(dir: &Path) -> Result<Option<StartLock>, SimError> {
        StartLock::take_with(dir, libc::LOCK_EX | libc::LOCK_NB)
    }

    fn take_with(dir: &Path, op: libc::c_int) -> Result<Option<StartLock>, SimError> {
        ensure_dir(dir)?;
        let path = dir.join(START_LOCK);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| SimError::io(format!("open {}", path.display()), e))?;
        loop {
            // SAFETY: flock on a file descriptor we own; no memory involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                return Ok(Some(StartLock { file }));
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(None),
                _ => return Err(SimError::io(format!("flock {}", path.display()), err)),
            }
        }
    }
}

impl Drop for StartLock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own descriptor (closing it would too).
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Creates `dir` (mode 1777, like /tmp, so processes of any user share it).
pub fn ensure_dir(dir: &Path) -> Result<(), SimError> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| SimError::io(format!("create {}", dir.display()), e))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    Ok(())
}

/// The server binary: `explicit` if given, else `simgpu-server` next to the
/// object (shared library or executable) this code is linked into, else
/// `simgpu-server` on `PATH`.
pub fn find_server(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(dir) = own_object_path().as_deref().and_then(Path::parent) {
        let p = dir.join(SERVER_BIN);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(SERVER_BIN)
}

/// Path of the shared object or executable containing this function.
pub fn own_object_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let addr = own_object_path as *const () as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader,
    // valid while the object stays loaded (it is: we are running in it).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let p = PathBuf::from(name.to_str().ok()?);
    if p.is_absolute() {
        Some(p)
    } else {
        std::fs::canonicalize(p).ok()
    }
}

/// Spawns the server for `dir`, detached from the caller, with `envs` added
/// to its environment (e.g. the `SIMGPU_*` device configuration).
pub fn spawn_server(dir: &Path, server: &Path, envs: &[(String, String)]) -> Result<(), SimError> {
    // Fail fast on a configuration the server would refuse.
    crate::config::DeviceConfig::from_vars(|k| {
        envs.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(k).ok())
    })?;
    ensure_dir(dir)?;
    let log_path = dir.join(SERVER_LOG);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| SimError::io(format!("open {}", log_path.display()), e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| SimError::io("dup server log", e))?;
    let mut cmd = Command::new(server);
    cmd.arg("--dir")
        .arg(dir)
        .env_remove("LD_PRELOAD")
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    // SAFETY: the closure runs in the forked child before exec and only
    // calls async-signal-safe functions (setsid, fork, _exit).
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd.spawn().map_err(|e| SimError::Server {
        path: server.to_path_buf(),
        reason: format!("cannot start: {e}"),
    })?;
    // Reap the intermediate process; the server itself is the grandchild.
    let _ = child.wait();
    Ok(())
}
