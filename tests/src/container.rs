//! "Containers" for tests: a child cgroup v2 plus a new PID namespace
//! (`unshare --pid --fork --mount-proc`), as CI has no container runtime.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine cannot set up a container"
)]

use std::{
    ffi::OsStr,
    io::Write as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// The cgroup2 mount: `/sys/fs/cgroup` (unified hosts) or
/// `/sys/fs/cgroup/unified` (hybrid hosts), from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_whitespace().nth(4).map(PathBuf::from)
        })
        .expect("no cgroup2 mount")
}

/// A child cgroup, removed on drop (its processes are killed first).
pub struct Cgroup {
    path: PathBuf,
    rel: String,
}

impl Cgroup {
    /// Creates `<cgroup2 root>/<rel>` (and missing parents). `rel` may be
    /// nested, e.g. `kubepods/burstable/pod<uid>/<id>`.
    pub fn create(rel: &str) -> Cgroup {
        let rel = rel.trim_matches('/').to_owned();
        let path = cgroup2_root().join(&rel);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path, rel }
    }

    /// A unique name for a test's cgroup.
    pub fn unique(prefix: &str) -> Cgroup {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Cgroup::create(&format!("vgpu-test/{prefix}-{}-{n}", std::process::id()))
    }

    /// Absolute path of the directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path relative to the cgroup2 mount, with a leading `/`.
    pub fn rel(&self) -> String {
        format!("/{}", self.rel)
    }

    /// The cgroup id (`bpf_get_current_cgroup_id()`): the directory's inode.
    pub fn id(&self) -> u64 {
        std::fs::metadata(&self.path).expect("stat cgroup").ino()
    }

    /// Spawns `argv` inside this cgroup and a new PID namespace, stdin piped.
    pub fn spawn<S: AsRef<OsStr>>(&self, argv: &[S], env: &[(&str, &OsStr)]) -> ContainerProcess {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec unshare --pid --fork --mount-proc "$@""#)
            .arg(&self.path)
            .args(argv)
            .stdin(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sh/unshare");
        let stdin = child.stdin.take();
        ContainerProcess { child, stdin }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        // Remove the leaf and then the parents this test created (the empty ones).
        let root = cgroup2_root();
        let mut dir = self.path.clone();
        while dir != root {
            while std::fs::remove_dir(&dir).is_err()
                && dir == self.path
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !dir.pop() {
                break;
            }
            let shared = std::fs::read_dir(&dir)
                .map(|mut d| d.any(|e| e.is_ok_and(|e| e.file_type().is_ok_and(|t| t.is_dir()))));
            if shared.unwrap_or(true) {
                break;
            }
        }
    }
}

/// A process started by [`Cgroup::spawn`]: `unshare` on the host, whose child
/// is PID 1 of the new namespace.
pub struct ContainerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl ContainerProcess {
    /// The host PID of `unshare` (outside the namespace).
    pub fn unshare_pid(&self) -> u32 {
        self.child.id()
    }

    /// The host PID of the namespace's PID 1 (the command), as the host sees
    /// it. Waits up to 5 s for `unshare` to fork it.
    pub fn host_pid(&self) -> u32 {
        let pid = self.child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(c) = children.split_whitespace().next() {
                return c.parse().expect("pid");
            }
            assert!(Instant::now() < deadline, "unshare {pid} has no child");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Inode of the command's PID namespace (`/proc/<pid>/ns/pid`).
    pub fn pidns_inum(&self) -> u64 {
        let p = format!("/proc/{}/ns/pid", self.host_pid());
        std::fs::metadata(&p).expect("stat ns").ino()
    }

    /// Writes a line to the process's stdin (tests use it as a "go" signal).
    pub fn send_line(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin");
        writeln!(s, "{line}").expect("write stdin");
        s.flush().expect("flush stdin");
    }

    /// Closes stdin and waits for exit.
    pub fn wait(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait")
    }
}
