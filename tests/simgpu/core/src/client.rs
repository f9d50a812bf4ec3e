//! A process's registration with the server.
//!
//! [`Client::connect`] connects to `$SIMGPU_DIR/simgpu.sock` (starting the
//! server if nobody answers), sends a [`Hello`], receives the host PID and
//! a process-table slot, and maps the state file. The connection stays open
//! for the life of the [`Client`]: when it closes (drop, exit, SIGKILL) the
//! server frees everything the slot held.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::ProcessConfig;
use crate::proto::{Hello, Kind, Welcome, NO_SLOT, SOCKET};
use crate::shm::Shm;
use crate::spawn::{find_server, spawn_server, StartLock};
use crate::SimError;

/// How long a client waits for a server it started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A registered process.
#[derive(Debug)]
pub struct Client {
    shm: Shm,
    welcome: Welcome,
    _conn: UnixStream,
    dir: PathBuf,
}

impl Client {
    /// Registers with the server of `cfg.dir`, starting it when needed.
    pub fn connect(kind: Kind, cfg: &ProcessConfig) -> Result<Client, SimError> {
        Client::connect_with(kind, &cfg.dir, cfg.server.as_deref())
    }

    /// Registers with the server of `dir`; `server` overrides where the
    /// server binary is found.
    pub fn connect_with(kind: Kind, dir: &Path, server: Option<&Path>) -> Result<Client, SimError> {
        Client::connect_env(kind, dir, server, &[])
    }

    /// As [`Client::connect_with`]; a server started here gets `envs` added
    /// to its environment.
    pub fn connect_env(
        kind: Kind,
        dir: &Path,
        server: Option<&Path>,
        envs: &[(String, String)],
    ) -> Result<Client, SimError> {
        if let Ok(c) = Client::try_register(kind, dir) {
            return Ok(c);
        }
        let _lock = StartLock::take(dir)?;
        if let Ok(c) = Client::try_register(kind, dir) {
            return Ok(c);
        }
        let bin = find_server(server);
        spawn_server(dir, &bin, envs)?;
        let started = Instant::now();
        let mut last = None;
        while started.elapsed() < START_TIMEOUT {
            match Client::try_register(kind, dir) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(SimError::Server {
            path: dir.join(SOCKET),
            reason: format!(
                "{} did not come up within {:?} (see {}): {}",
                bin.display(),
                START_TIMEOUT,
                dir.join(crate::spawn::SERVER_LOG).display(),
                last.map_or_else(|| "no attempt".into(), |e| e.to_string())
            ),
        })
    }

    fn try_register(kind: Kind, dir: &Path) -> Result<Client, SimError> {
        let path = dir.join(SOCKET);
        let server_err = |reason: String| SimError::Server {
            path: path.clone(),
            reason,
        };
        let mut conn =
            UnixStream::connect(&path).map_err(|e| server_err(format!("connect: {e}")))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| server_err(format!("timeout: {e}")))?;
        let hello = Hello {
            kind,
            ns_pid: std::process::id(),
            pid_ns: crate::pids::pid_ns_inode()
                .and_then(|i| u32::try_from(i).ok())
                .unwrap_or(0),
        };
        send_all(&conn, &hello.encode()).map_err(|e| server_err(format!("send: {e}")))?;
        let mut buf = [0u8; 16];
        conn.read_exact(&mut buf)
            .map_err(|e| server_err(format!("no welcome: {e}")))?;
        let welcome = Welcome::decode(&buf).ok_or_else(|| server_err("bad welcome".into()))?;
        let _ = conn.set_read_timeout(None);
        let _ = conn.flush();
        let shm = Shm::open(dir)?;
        Ok(Client {
            shm,
            welcome,
            _conn: conn,
            dir: dir.to_path_buf(),
        })
    }

    /// The shared state.
    pub fn shm(&self) -> &Shm {
        &self.shm
    }

    /// This process's PID as the server sees it (the host PID when the
    /// server runs in the host namespace).
    pub fn host_pid(&self) -> u32 {
        self.welcome.host_pid
    }

    /// This process's slot, if it has one.
    pub fn slot(&self) -> Option<u32> {
        (self.welcome.slot != NO_SLOT).then_some(self.welcome.slot)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Writes all of `buf` with `MSG_NOSIGNAL` (a library must never raise
/// SIGPIPE in its host process).
fn send_all(conn: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice for its length; the fd is
        // an open socket owned by `conn`.
        let n = unsafe {
            libc::send(
                conn.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}
