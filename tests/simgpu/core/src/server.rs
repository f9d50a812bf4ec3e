//! The `simgpu-server` loop.
//!
//! It creates the state file from the device configuration in its
//! environment, listens on `$SIMGPU_DIR/simgpu.sock`, learns each client's
//! PID with `SO_PEERCRED` (PIDs in the server's namespace: the host's when it
//! was started from the host), hands CUDA clients a process-table slot, and
//! when a connection closes frees that slot's memory and contexts, as the
//! real driver does when a process exits. It exits after
//! `SIMGPU_IDLE_EXIT_MS` without clients.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::{DeviceConfig, ProcessConfig};
use crate::lock::{release_if_owner, ShmLock, SERVER_OWNER};
use crate::proto::{Hello, Kind, Welcome, NO_SLOT, SOCKET};
use crate::shm::{Shm, MAX_SLOTS};
use crate::spawn::{ensure_dir, StartLock};
use crate::SimError;

/// Name of the file holding the server's PID.
pub const PID_FILE: &str = "server.pid";

struct Conn {
    stream: UnixStream,
    slot: u32,
    pid: u32,
}

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// State directory.
    pub dir: PathBuf,
    /// Exit after this long without clients.
    pub idle_exit: Duration,
    /// Diagnostics on stderr.
    pub log: bool,
}

impl Options {
    /// From `SIMGPU_*` variables, with `dir` overriding `SIMGPU_DIR`.
    pub fn from_env(dir: Option<PathBuf>) -> Options {
        let p = ProcessConfig::from_env();
        Options {
            dir: dir.unwrap_or(p.dir),
            idle_exit: Duration::from_millis(p.idle_exit_ms),
            log: p.log,
        }
    }
}

/// Runs the server until it has been idle long enough.
pub fn run(opts: &Options) -> Result<(), SimError> {
    ensure_dir(&opts.dir)?;
    let sock = opts.dir.join(SOCKET);
    if UnixStream::connect(&sock).is_ok() {
        eprintln!(
            "simgpu-server: a server already answers on {}",
            sock.display()
        );
        return Ok(());
    }
    if !crate::pids::in_initial_pid_ns() {
        eprintln!(
            "simgpu-server: WARNING: running inside a PID namespace (pid {}): \
             NVML will report namespace PIDs, not host PIDs. Start the server from \
             the host first (e.g. vgpu_tests::sim::SimGpu, or any CUDA call outside \
             the container with the same SIMGPU_DIR).",
            std::process::id()
        );
    }
    let cfg = DeviceConfig::from_env()?;
    let shm = Shm::create(&opts.dir, &cfg)?;
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)
        .map_err(|e| SimError::io(format!("bind {}", sock.display()), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| SimError::io("listener nonblocking", e))?;
    let _ = std::fs::write(opts.dir.join(PID_FILE), format!("{}\n", std::process::id()));
    if opts.log {
        eprintln!(
            "simgpu-server {}: {:?} on {}",
            std::process::id(),
            cfg,
            sock.display()
        );
    }
    let mut server = Server {
        shm,
        conns: Vec::new(),
        log: opts.log,
    };
    let mut idle_since = Some(Instant::now());
    loop {
        server.poll(&listener, Duration::from_millis(100));
        if !server.conns.is_empty() {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < opts.idle_exit {
            continue;
        }
        // Idle long enough. Exit only while holding the start lock, so a
        // client starting a server waits for us to be gone.
        let Ok(Some(_lock)) = StartLock::try_take(&opts.dir) else {
            continue;
        };
        server.accept_all(&listener);
        if server.conns.is_empty() {
            let _ = std::fs::remove_file(&sock);
            let _ = std::fs::remove_file(opts.dir.join(PID_FILE));
            if opts.log {
                eprintln!("simgpu-server {}: idle, exiting", std::process::id());
            }
            return Ok(());
        }
        idle_since = None;
    }
}

struct Server {
    shm: Shm,
    conns: Vec<Conn>,
    log: bool,
}

impl Server {
    fn poll(&mut self, listener: &UnixListener, timeout: Duration) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(self.conns.iter().map(|c| c.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                timeout.as_millis() as libc::c_int,
            )
        };
        if n <= 0 {
            return;
        }
        let mut gone = Vec::new();
        for (i, pfd) in fds.iter().enumerate().skip(1) {
            if pfd.revents == 0 {
                continue;
            }
            let c = &mut self.conns[i - 1];
            let mut buf = [0u8; 64];
            match c.stream.read(&mut buf) {
                Ok(0) => gone.push(i - 1),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => gone.push(i - 1),
            }
        }
        for i in gone.into_iter().rev() {
            let c = self.conns.swap_remove(i);
            self.disconnect(&c);
        }
        if fds[0].revents != 0 {
            self.accept_all(listener);
        }
    }

    fn accept_all(&mut self, listener: &UnixListener) {
        while let Ok((stream, _)) = listener.accept() {
            if let Some(c) = self.register(stream) {
                self.conns.push(c);
            }
        }
    }

    fn register(&mut self, mut stream: UnixStream) -> Option<Conn> {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 16];
        stream.read_exact(&mut buf).ok()?;
        let hello = Hello::decode(&buf)?;
        let pid = peer_pid(&stream).unwrap_or(hello.ns_pid);
        let (slot, gen) = match hello.kind {
            Kind::Cuda => self.alloc_slot(pid, &hello).unwrap_or((NO_SLOT, 0)),
            Kind::Observer => (NO_SLOT, 0),
        };
        let welcome = Welcome {
            host_pid: pid,
            slot,
            gen: gen as u32,
        };
        if send_nosignal(&stream, &welcome.encode()).is_err() {
            if slot != NO_SLOT {
                self.free_slot(slot);
            }
            return None;
        }
        let _ = stream.set_nonblocking(true);
        if self.log {
            eprintln!(
                "simgpu-server: client pid {pid} (ns pid {}) {:?} slot {}",
                hello.ns_pid, hello.kind, slot as i64
            );
        }
        Some(Conn { stream, slot, pid })
    }

    fn alloc_slot(&self, pid: u32, hello: &Hello) -> Option<(u32, u64)> {
        let sh = self.shm.shared();
        let (i, s) = sh
            .slots
            .iter()
            .enumerate()
            .take(MAX_SLOTS)
            .find(|(_, s)| s.state.load(Ordering::Acquire) == 0)?;
        s.pid.store(pid, Ordering::Relaxed);
        s.ns_pid.store(hello.ns_pid, Ordering::Relaxed);
        s.pid_ns.store(hello.pid_ns, Ordering::Relaxed);
        for d in 0..s.used.len() {
            s.used[d].store(0, Ordering::Relaxed);
            s.contexts[d].store(0, Ordering::Relaxed);
            s.launches[d].store(0, Ordering::Relaxed);
            s.busy_ns[d].store(0, Ordering::Relaxed);
        }
        let gen = s.gen.fetch_add(1, Ordering::Relaxed) + 1;
        s.state.store(1, Ordering::Release);
        sh.header.slot_hwm.fetch_max(i as u32 + 1, Ordering::AcqRel);
        Some((i as u32, gen))
    }

    fn free_slot(&self, slot: u32) {
        // A process killed inside a critical section leaves the lock held.
        if release_if_owner(&self.shm, slot + 1) && self.log {
            eprintln!("simgpu-server: released the lock held by dead slot {slot}");
        }
        let Some(s) = self.shm.slot(slot) else { return };
        let _lock = ShmLock::acquire(&self.shm, SERVER_OWNER);
        s.state.store(0, Ordering::Release);
        for d in 0..s.used.len() {
            s.used[d].store(0, Ordering::Relaxed);
            s.contexts[d].store(0, Ordering::Relaxed);
        }
    }

    fn disconnect(&mut self, c: &Conn) {
        if self.log {
            eprintln!(
                "simgpu-server: client pid {} gone (slot {})",
                c.pid, c.slot as i64
            );
        }
        if c.slot != NO_SLOT {
            self.free_slot(c.slot);
        }
    }
}

/// The peer's PID via `SO_PEERCRED`.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

fn send_nosignal(stream: &UnixStream, buf: &[u8]) -> std::io::Result<()> {
    // SAFETY: `buf` is valid for reads of its length; the fd is open.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n == buf.len() as isize {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads the PID of the server of `dir` from its pid file.
pub fn server_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}
