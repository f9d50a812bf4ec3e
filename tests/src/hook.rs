//! Helpers for the hook's integration tests: an isolated environment per
//! test (its own region file and simulated GPU), and commands that run a C
//! test program with `LD_PRELOAD=libvgpu.so`.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic on a broken setup (tests panic rather than return errors)"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use vgpu_common::view::{Access, RegionFile};

use crate::dist;

/// One test's world: a directory with the region file and the simulated
/// GPU's state (`SIMGPU_DIR`), and the memory limit given to hooked runs.
pub struct HookEnv {
    pub dir: PathBuf,
    pub limit: String,
    pub extra_env: Vec<(String, String)>,
}

impl HookEnv {
    pub fn new(name: &str, limit: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("vgpu-hook-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create test dir");
        HookEnv {
            dir,
            limit: limit.to_owned(),
            extra_env: Vec::new(),
        }
    }

    /// Adds an environment variable to every command.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.extra_env.push((k.to_owned(), v.to_owned()));
        self
    }

    pub fn region_path(&self) -> PathBuf {
        self.dir.join("vgpu.cache")
    }

    /// Compiles `tests/c/<name>.c` into this environment's directory.
    pub fn build(&self, name: &str) -> PathBuf {
        dist::compile_c(name, &self.dir, false)
    }

    /// `exe args…` with the simulated driver and no hook.
    pub fn unhooked(&self, exe: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(exe);
        c.args(args)
            .env("LD_LIBRARY_PATH", dist::sim_dir())
            .env("SIMGPU_DIR", self.dir.join("sim"))
            .env("SIMGPU_SERVER", dist::sim_dir().join("simgpu-server"))
            .env_remove("LD_PRELOAD")
            .env_remove("CUDA_VISIBLE_DEVICES");
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        c
    }

    /// `exe args…` under the hook, with this environment's region and limit.
    pub fn hooked(&self, exe: &Path, args: &[&str]) -> Command {
        let mut c = self.unhooked(exe, args);
        c.env("LD_PRELOAD", dist::hook_lib())
            .env("VGPU_HOOK_LIB", dist::hook_lib())
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.region_path())
            .env("CUDA_DEVICE_MEMORY_LIMIT", &self.limit);
        c
    }

    /// The region, read-only.
    pub fn region(&self) -> RegionFile {
        RegionFile::open(&self.region_path(), Access::ReadOnly).expect("open region")
    }
}

/// A passing test leaves nothing behind; a failing one keeps its directory
/// (region, programs, simulated GPU) for the post-mortem.
impl Drop for HookEnv {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs to completion; returns (success, stdout, stderr).
pub fn run(mut c: Command) -> (bool, String, String) {
    let out = c.output().expect("run test program");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A started program whose stdout is read line by line.
pub struct Running {
    pub child: Child,
    pub out: BufReader<ChildStdout>,
}

impl Running {
    pub fn start(mut c: Command) -> Self {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn test program");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Running { child, out }
    }

    /// The next stdout line (without the newline); empty at EOF.
    pub fn line(&mut self) -> String {
        let mut s = String::new();
        let _ = self.out.read_line(&mut s);
        s.trim_end().to_owned()
    }

    /// Reads lines until one starts with `prefix`; returns it.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let l = self.line();
            if l.is_empty() || l.starts_with(prefix) {
                return l;
            }
        }
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first number after `key ` in `text`.
pub fn field(text: &str, key: &str) -> Option<u64> {
    let pat = format!("{key} ");
    let at = text.find(&pat)? + pat.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// `<region>.sm`, the SM sidecar the hook keeps beside region file `region`.
pub fn sm_sidecar_path(region: &Path) -> PathBuf {
    let mut s = region.as_os_str().to_owned();
    s.push(".sm");
    PathBuf::from(s)
}

/// Truncates `path` to 0 bytes, as a sibling sharing the file could.
pub fn truncate_file(path: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(0))
        .unwrap_or_else(|e| panic!("truncating {}: {e}", path.display()));
}
