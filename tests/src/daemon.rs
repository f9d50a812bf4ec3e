//! What a `vgpu daemon` test stands on: a working directory with its own
//! copy of the simulated libcuda (so the daemon, given `--libcuda`, probes
//! only this test's processes), the compiled test program and
//! subdirectories; and the running daemon, killed when the test ends.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine cannot set up"
)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::container::{Cgroup, ContainerProcess};
use crate::dist;
use crate::http::get;
use crate::sim::SimGpu;

/// A temp dir with `lib/libcuda.so.1` and the `daemon_prog` test program.
pub struct Workdir {
    pub dir: tempfile::TempDir,
    pub prog: PathBuf,
}

impl Workdir {
    /// A new one named `<prefix>…`, with `subdirs` created in it.
    pub fn new(prefix: &str, subdirs: &[&str]) -> Workdir {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("tempdir");
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(&lib).expect("mkdir lib");
        std::fs::copy(
            dist::sim_dir().join("libcuda.so.1"),
            lib.join("libcuda.so.1"),
        )
        .expect("copy the simulated libcuda");
        let prog = dist::compile_c("daemon_prog", dir.path(), false);
        for d in subdirs {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        Workdir { dir, prog }
    }

    /// `rel` inside the directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// This test's own libcuda, the one to give the daemon as `--libcuda`.
    pub fn libcuda(&self) -> PathBuf {
        self.dir.path().join("lib/libcuda.so.1")
    }

    /// The simulator's environment, with this test's libcuda first.
    pub fn envs(&self, gpu: &SimGpu) -> Vec<(String, String)> {
        let mut v: Vec<_> = gpu
            .envs()
            .into_iter()
            .filter(|(k, _)| k != "LD_LIBRARY_PATH")
            .collect();
        v.push((
            "LD_LIBRARY_PATH".into(),
            format!(
                "{}:{}",
                self.dir.path().join("lib").display(),
                gpu.lib_dir().display()
            ),
        ));
        v
    }

    /// `regions/<name>.cache`.
    pub fn region(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join("regions")
            .join(format!("{name}.cache"))
    }

    /// `out/<name>`, where the test program writes its marks.
    pub fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join("out").join(name)
    }

    /// The number after `what` in test program `name`'s output file (its
    /// marks), waiting up to `timeout` for the line.
    pub fn mark(&self, name: &str, what: &str, timeout: Duration) -> u64 {
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(self.out(name)).unwrap_or_default();
            if let Some(v) = text
                .lines()
                .find_map(|l| l.strip_prefix(what)?.trim().parse().ok())
            {
                return v;
            }
            assert!(
                t.elapsed() < timeout,
                "{name}: no {what:?} line after {timeout:?}; its output: {text:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts `prog` (`daemon_prog` or a copy of it) in a new container in
    /// `cg` under the simulator's environment, naming region `region` with a
    /// 2 GiB limit, hooked or not, and lets it allocate 64 MiB.
    pub fn spawn_allocating(
        &self,
        gpu: &SimGpu,
        cg: &Cgroup,
        prog: &Path,
        name: &str,
        region: &Path,
        hooked: bool,
    ) -> ContainerProcess {
        let envs = self.envs(gpu);
        let hook = dist::hook_lib();
        let mut env: Vec<(&str, &OsStr)> = envs
            .iter()
            .map(|(k, v)| (k.as_str(), OsStr::new(v)))
            .collect();
        env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()));
        env.push(("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new("2g")));
        if hooked {
            env.push(("LD_PRELOAD", hook.as_os_str()));
        }
        let out = self.out(name);
        let argv: Vec<&OsStr> = vec![prog.as_os_str(), out.as_os_str(), OsStr::new("64")];
        let mut p = cg.spawn(&argv, &env);
        p.send_line("go");
        p
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `vgpu daemon` probing this directory's own libcuda only,
    /// on a free loopback port, logging to `daemon.log` here, with `state`
    /// as its state directory, `regions_root` as HAMi's containers
    /// directory, `extra` arguments and the simulator's environment.
    pub fn start_daemon(
        &self,
        gpu: &SimGpu,
        state: &Path,
        regions_root: &Path,
        extra: &[&str],
    ) -> Running {
        let port = crate::http::free_port();
        let listen = format!("127.0.0.1:{port}");
        let cmd = self.daemon_command(gpu, state, regions_root, &listen, extra);
        Running::start(cmd, port, self.path("daemon.log"))
    }

    /// The command [`Self::start_daemon`] runs, listening on `listen` as
    /// given (`--listen`'s own syntax), not yet started.
    pub fn daemon_command(
        &self,
        gpu: &SimGpu,
        state: &Path,
        regions_root: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Command {
        let mut cmd = Command::new(dist::vgpu_bin());
        // No -v: the daemon's default level, which the DaemonSet runs, must
        // show what tests look for in its log.
        cmd.arg("daemon")
            .arg("--libcuda")
            .arg(self.libcuda())
            .arg("--listen")
            .arg(listen)
            .arg("--state-dir")
            .arg(state)
            .arg("--regions-root")
            .arg(regions_root);
        cmd.args(extra).envs(self.envs(gpu));
        cmd
    }
}

/// A `vgpu daemon` a test started: stderr in `log`, serving on `port`,
/// killed when dropped.
pub struct Running {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Running {
    /// Spawns `cmd` (its stderr goes to `log`) without waiting for it.
    pub fn spawn(mut cmd: Command, port: u16, log: PathBuf) -> Running {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn vgpu daemon");
        Running { child, port, log }
    }

    /// Spawns `cmd` (its stderr goes to `log`) and waits up to 30 s for
    /// `/readyz`; panics with the log if the daemon exits or never gets
    /// ready.
    pub fn start(cmd: Command, port: u16, log: PathBuf) -> Running {
        let mut d = Running::spawn(cmd, port, log);
        let t = Instant::now();
        while get(port, "/readyz").map(|(s, _)| s) != Some(200) {
            d.assert_alive();
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "daemon not ready: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the exit status and the log if the daemon has exited.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(st)) = self.child.try_wait() {
            panic!("daemon exited {st}: {}", self.log_text());
        }
    }

    /// `/findings`, which must answer 200 with JSON: when it was last
    /// updated (Unix ms) and the list.
    pub fn findings_at(&self) -> (u64, Vec<serde_json::Value>) {
        let (code, body) = get(self.port, "/findings").expect("findings");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).expect("findings json");
        (
            v["updated_unix_ms"].as_u64().unwrap_or(0),
            v["findings"].as_array().cloned().unwrap_or_default(),
        )
    }

    /// The findings in `/findings`.
    pub fn findings(&self) -> Vec<serde_json::Value> {
        self.findings_at().1
    }

    /// The first finding `pick` accepts, polled every 20 ms up to `limit`;
    /// panics with the list and the log if none comes (`what` names it).
    pub fn wait_finding(
        &self,
        what: &str,
        limit: Duration,
        pick: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t = Instant::now();
        loop {
            let list = self.findings();
            if let Some(f) = list.iter().find(|f| pick(f)) {
                return f.clone();
            }
            assert!(
                t.elapsed() < limit,
                "no {what} finding after {limit:?}: {list:#?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics, with the exit status once there is one, unless `/healthz`
    /// answers 200 within 5 s.
    pub fn assert_serving(&mut self) {
        if get(self.port, "/healthz").map(|(s, _)| s) == Some(200) {
            return;
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            self.assert_alive();
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon alive but not serving: {}", self.log_text());
    }

    /// SIGTERM, then waits: the exit must be clean and detach the probes.
    /// Returns the log.
    pub fn stop(mut self) -> String {
        // SAFETY: signalling the daemon this test started (its child).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let st = self.child.wait().expect("wait daemon");
        let log = self.log_text();
        assert!(st.success(), "daemon exit {st}: {log}");
        assert!(log.contains("probes detached"), "{log}");
        log
    }

    /// `/metrics`, which must answer 200.
    pub fn metrics(&self) -> String {
        let (code, body) = get(self.port, "/metrics").expect("scrape");
        assert_eq!(code, 200);
        body
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
