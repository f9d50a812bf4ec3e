//! A container as the kubelet and containerd lay it out, for the daemon
//! suites that check what it reads from outside the tenant: a cgroup under
//! `kubepods/burstable/pod<uid>/` whose last component is a 64-hex
//! container id, and that container's OCI runtime spec at
//! `<workdir>/runtime/k8s.io/<id>/config.json`.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine cannot set up a container"
)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use vgpu_common::view::{Access, RegionFile};

use crate::container::{Cgroup, ContainerProcess};
use crate::daemon::{Running, Workdir};
use crate::dist;
use crate::http::now_ns;
use crate::sim::SimGpu;
use crate::wait::poll_until;

/// A fresh 64-hex container id; `salt` keeps a test's containers apart.
pub fn container_id(salt: u64) -> String {
    let a =
        now_ns() ^ (u64::from(std::process::id()) << 32) ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!(
        "{a:016x}{:016x}{:016x}{:016x}",
        a.rotate_left(17),
        a.rotate_left(31),
        !a
    )
}

/// One test container: its cgroup (kubepods layout) and id.
pub struct KubeContainer {
    pub cg: Cgroup,
    pub id: String,
}

impl KubeContainer {
    /// A new container in `wd` whose runtime spec gives its process `env`
    /// (as the device plugin would); `wd` needs a `runtime/k8s.io` subdir.
    pub fn create(wd: &Workdir, salt: u64, env: &[String]) -> KubeContainer {
        let id = container_id(salt);
        let uid = format!(
            "{:08x}-1234-4abc-8def-{:012x}",
            salt,
            now_ns() & 0xffff_ffff_ffff
        );
        let cg = Cgroup::create(&format!("vgpu-test/kubepods/burstable/pod{uid}/{id}"));
        let bundle = wd.path("runtime/k8s.io").join(&id);
        std::fs::create_dir_all(&bundle).expect("bundle");
        let spec = serde_json::json!({
            "ociVersion": "1.1.0",
            "process": { "args": ["/bin/app"], "env": env, "cwd": "/" },
            "root": { "path": "rootfs" },
        });
        std::fs::write(bundle.join("config.json"), spec.to_string()).expect("config.json");
        KubeContainer { cg, id }
    }
}

/// The daemon's `--runtime-spec` pattern for the specs [`KubeContainer`]
/// writes in `wd`.
pub fn runtime_spec_pattern(wd: &Workdir) -> String {
    format!("{}/runtime/*/{{id}}/config.json", wd.root().display())
}

/// A suite's working directory for containers with runtime specs:
/// `regions`, `out` and `runtime/k8s.io` (where [`KubeContainer`] writes).
pub fn spec_workdir(prefix: &str) -> Workdir {
    Workdir::new(prefix, &["regions", "out", "runtime/k8s.io"])
}

/// The daemon's state directory in `wd`.
pub fn state_dir(wd: &Workdir) -> PathBuf {
    wd.path("state")
}

/// `vgpu daemon` on the host, probing `wd`'s libcuda with its state in
/// [`state_dir`], reading the runtime specs [`KubeContainer`] writes there
/// (no HAMi directory); `extra` arguments on top.
pub fn spec_daemon(wd: &Workdir, gpu: &SimGpu, extra: &[&str]) -> Running {
    let spec = runtime_spec_pattern(wd);
    let mut args = vec!["--runtime-spec", spec.as_str()];
    args.extend_from_slice(extra);
    wd.start_daemon(gpu, &state_dir(wd), &wd.path("no-hami-dir"), &args)
}

/// `<prefix…> daemon_prog <out of name> <args…>` in `ctr`, hooked, with
/// the simulator's environment and `env` on top; it waits for "go".
pub fn spawn_hooked(
    wd: &Workdir,
    gpu: &SimGpu,
    ctr: &KubeContainer,
    name: &str,
    env: &[(&str, &OsStr)],
    (prefix, args): (&[&str], &[&str]),
) -> ContainerProcess {
    let base = wd.envs(gpu);
    let hook = dist::hook_lib();
    let mut all: Vec<(&str, &OsStr)> = base
        .iter()
        .map(|(k, v)| (k.as_str(), OsStr::new(v)))
        .collect();
    all.push(("LD_PRELOAD", hook.as_os_str()));
    all.extend_from_slice(env);
    let out = wd.out(name);
    let mut argv: Vec<&OsStr> = prefix.iter().map(OsStr::new).collect();
    argv.extend([wd.prog.as_os_str(), out.as_os_str()]);
    argv.extend(args.iter().map(OsStr::new));
    ctr.cg.spawn(&argv, &all)
}

/// Waits up to 10 s until some slot of region `path` records host PID
/// `host` (the daemon tracks the process); panics with `d`'s log if not.
pub fn wait_slot_hostpid(path: &Path, host: u32, d: &Running) {
    let filled = poll_until(Duration::from_secs(10), || {
        RegionFile::open(path, Access::ReadOnly).is_ok_and(|f| {
            f.region()
                .active_slots()
                .iter()
                .any(|s| s.hostpid.load(SeqCst) == host as i32)
        })
    });
    assert!(
        filled.is_some(),
        "slot never filled with host PID {host} within 10 s: {}",
        d.log_text()
    );
}

/// Whether host process `pid` is gone (or a zombie).
pub fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}
