//! The simulated GPU for integration tests.
//!
//! [`SimGpu`] gives a test its own simulator: a fresh `SIMGPU_DIR` under
//! `/tmp`, with the server started *from the test process* (the host PID
//! namespace, so NVML reports host PIDs for processes in containers) and
//! kept alive until the `SimGpu` is dropped, which kills it and removes the
//! directory. [`SimGpu::apply`] points a `Command` at the simulated
//! `libcuda.so.1` / `libnvidia-ml.so.1` and at this instance.
//!
//! ```no_run
//! use vgpu_tests::sim::SimGpu;
//! let gpu = SimGpu::builder().memory("1g").build();
//! let mut cmd = std::process::Command::new("./my_cuda_program");
//! gpu.apply(&mut cmd);
//! let out = cmd.output().unwrap();
//! assert!(gpu.processes(0).is_empty());
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use simgpu::client::Client;
use simgpu::proto::Kind;
use simgpu::shm::{ProcessInfo, Shm};

/// Configures a [`SimGpu`].
#[derive(Debug, Clone, Default)]
pub struct SimGpuBuilder {
    vars: Vec<(String, String)>,
}

impl SimGpuBuilder {
    /// `SIMGPU_DEVICES` (default 1).
    pub fn devices(self, n: u32) -> Self {
        self.var("SIMGPU_DEVICES", n.to_string())
    }

    /// `SIMGPU_MEMORY` per device, e.g. `"1g"` (default `80g`).
    pub fn memory(self, size: &str) -> Self {
        self.var("SIMGPU_MEMORY", size)
    }

    /// `SIMGPU_SMS` (default 132).
    pub fn sms(self, n: u32) -> Self {
        self.var("SIMGPU_SMS", n.to_string())
    }

    /// `SIMGPU_CONTEXT_BYTES`, e.g. `"500m"` (default).
    pub fn context_bytes(self, size: &str) -> Self {
        self.var("SIMGPU_CONTEXT_BYTES", size)
    }

    /// `SIMGPU_WAVE_NS` (default 5000).
    pub fn wave_ns(self, ns: u64) -> Self {
        self.var("SIMGPU_WAVE_NS", ns.to_string())
    }

    /// `SIMGPU_SAMPLE_MS` for programs started with [`SimGpu::apply`].
    pub fn sample_ms(self, ms: u64) -> Self {
        self.var("SIMGPU_SAMPLE_MS", ms.to_string())
    }

    /// Any other variable passed to the server and to programs.
    pub fn var(mut self, k: &str, v: impl Into<String>) -> Self {
        self.vars.retain(|(x, _)| x != k);
        self.vars.push((k.to_string(), v.into()));
        self
    }

    /// Creates the directory and starts the server.
    pub fn build(self) -> SimGpu {
        SimGpu::start(self.vars)
    }
}

/// One simulated GPU installation with its own server.
pub struct SimGpu {
    dir: PathBuf,
    lib_dir: PathBuf,
    vars: Vec<(String, String)>,
    observer: Option<Client>,
    server_pid: u32,
}

impl SimGpu {
    /// A simulator with default settings.
    pub fn new() -> SimGpu {
        SimGpu::builder().build()
    }

    /// A builder for non-default settings.
    pub fn builder() -> SimGpuBuilder {
        SimGpuBuilder::default()
    }

    fn start(vars: Vec<(String, String)>) -> SimGpu {
        let lib_dir = crate::dist::sim_dir();
        let server = lib_dir.join("simgpu-server");
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = PathBuf::from(format!(
            "/tmp/simgpu-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let observer = Client::connect_env(Kind::Observer, &dir, Some(&server), &vars)
            .unwrap_or_else(|e| panic!("starting simgpu server in {}: {e}", dir.display()));
        let server_pid = observer
            .shm()
            .shared()
            .header
            .server_pid
            .load(std::sync::atomic::Ordering::Relaxed);
        SimGpu {
            dir,
            lib_dir,
            vars,
            observer: Some(observer),
            server_pid,
        }
    }

    /// The `SIMGPU_DIR` of this instance.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The percent of the next `window` each of `pids` (host PIDs) kept
    /// device 0 busy, as the simulator saw it (0 for one that did not run).
    pub fn process_shares(&self, window: Duration, pids: &[u32]) -> Vec<f64> {
        let from = simgpu::clock::mono_ns();
        std::thread::sleep(window);
        let w = simgpu::clock::mono_ns() - from;
        let busy = simgpu::timeline::process_busy(self.shm(), 0, from, w);
        pids.iter()
            .map(|pid| {
                busy.iter()
                    .filter(|p| p.pid == *pid)
                    .map(|p| p.busy_ns as f64 * 100.0 / w as f64)
                    .sum()
            })
            .collect()
    }

    /// The percent of the next `window` `pids` together kept device 0 busy.
    pub fn combined_share(&self, window: Duration, pids: &[u32]) -> f64 {
        self.process_shares(window, pids).iter().sum()
    }

    /// The directory holding `libcuda.so.1`, `libnvidia-ml.so.1` and
    /// `simgpu-server`.
    pub fn lib_dir(&self) -> &Path {
        &self.lib_dir
    }

    /// The server's PID.
    pub fn server_pid(&self) -> u32 {
        self.server_pid
    }

    /// The environment a program needs to use this simulator:
    /// `LD_LIBRARY_PATH` (the sim directory first), `SIMGPU_DIR`,
    /// `SIMGPU_SERVER` and the builder's variables.
    pub fn envs(&self) -> Vec<(String, String)> {
        let mut ld = self.lib_dir.display().to_string();
        if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
            if !old.is_empty() {
                ld = format!("{ld}:{old}");
            }
        }
        let mut v = vec![
            ("LD_LIBRARY_PATH".to_string(), ld),
            ("SIMGPU_DIR".to_string(), self.dir.display().to_string()),
            (
                "SIMGPU_SERVER".to_string(),
                self.lib_dir.join("simgpu-server").display().to_string(),
            ),
        ];
        v.extend(self.vars.iter().cloned());
        v
    }

    /// Sets [`SimGpu::envs`] on `cmd`.
    pub fn apply<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.envs(self.envs())
    }

    /// The shared state (read it freely; it is all atomics).
    pub fn shm(&self) -> &Shm {
        match &self.observer {
            Some(o) => o.shm(),
            None => unreachable!("the observer lives until drop"),
        }
    }

    /// Processes registered with the server and their use of `dev`.
    pub fn processes(&self, dev: u32) -> Vec<ProcessInfo> {
        self.shm().processes(dev)
    }

    /// The registered process with host PID `pid`, if any.
    pub fn process(&self, dev: u32, pid: u32) -> Option<ProcessInfo> {
        self.processes(dev).into_iter().find(|p| p.pid == pid)
    }

    /// Device bytes in use on `dev`, all processes.
    pub fn used(&self, dev: u32) -> u64 {
        simgpu::memory::device_used(self.shm(), dev)
    }

    /// Device utilization (%) over the last `window`.
    pub fn utilization(&self, dev: u32, window: Duration) -> u32 {
        simgpu::timeline::utilization(self.shm(), dev, window.as_nanos() as u64)
    }

    /// Kernels launched on `dev` by all processes so far.
    pub fn launches(&self, dev: u32) -> u64 {
        self.shm()
            .device(dev)
            .map_or(0, |d| d.launches.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Changes the number of devices under the running server, as a GPU
    /// added or lost: NVML calls from now on see `n` (1–16), CUDA in
    /// processes that start after; a device back keeps its UUID, which
    /// follows its index.
    pub fn set_devices(&self, n: u32) {
        assert!(
            (1..=simgpu::config::MAX_DEVICES).contains(&n),
            "{n} devices: the simulated GPU has 1 to {}",
            simgpu::config::MAX_DEVICES
        );
        self.shm()
            .shared()
            .header
            .devices
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Polls `cond` until it holds (`true`) or `timeout` passes (`false`).
    pub fn wait_for(&self, timeout: Duration, mut cond: impl FnMut(&SimGpu) -> bool) -> bool {
        crate::wait::poll_until(timeout, || cond(self)).is_some()
    }
}

impl Default for SimGpu {
    fn default() -> Self {
        SimGpu::new()
    }
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        self.observer = None;
        if self.server_pid > 1 {
            // SAFETY: signalling the server process this instance started.
            unsafe { libc::kill(self.server_pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles `tests/c/<name>.c` (linked with the simulated `libcuda.so.1`
/// and `libnvidia-ml.so.1`) once per test process and returns its path.
pub fn c_program(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let dir = PathBuf::from(format!("/tmp/simgpu-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let exe = crate::dist::compile_c(name, &dir, true);
    built.push((name.to_string(), exe.clone()));
    exe
}

/// A running program whose stdout is read line by line (e.g. `simgpu_tool
/// ... hold`, which keeps running until its stdin closes). Reads time out
/// after [`Running::TIMEOUT`] so a stuck program fails the test instead of
/// hanging it.
pub struct Running {
    /// The child process.
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Running {
    /// How long [`Running::line`] waits for a line.
    pub const TIMEOUT: Duration = Duration::from_secs(30);

    /// Starts `program args…` with `gpu`'s environment, stdin and stdout
    /// piped.
    pub fn start(gpu: &SimGpu, program: &Path, args: &[&str]) -> Running {
        Running::start_cmd(gpu, Command::new(program).args(args))
    }

    /// Starts a prepared command with `gpu`'s environment.
    pub fn start_cmd(gpu: &SimGpu, cmd: &mut Command) -> Running {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = gpu
            .apply(cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let out = child
            .stdout
            .take()
            .unwrap_or_else(|| unreachable!("stdout is piped"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                if tx.send(l.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix` and returns it; panics at
    /// end of output or after [`Running::TIMEOUT`], showing what was seen.
    pub fn line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Running::TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "no line starting with {prefix:?} ({e}); output so far: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// The host PID of the child as the outside sees it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes stdin (a `hold` ends) and waits for exit.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap_or_else(|e| panic!("wait: {e}"));
        self.seen.extend(self.lines.try_iter());
        status
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that panics must not leave its programs running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Splits `"key a b c"` into numbers `[a, b, c]` (non-numbers are 0).
pub fn fields(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .map(|w| w.parse::<f64>().map_or(0, |f| f as u64))
        .collect()
}
