//! A node where `vgpu daemon` plans turns and priority holds, which is the
//! only way containers on a GPU take turns or hold for each other: a
//! working directory with runtime specs (`kubepod`), the daemon probing the
//! directory's own libcuda copy, and containers laid out as the kubelet
//! and containerd lay them out, each hooked, with its own region. The
//! kubelet and containerd are stand-ins (a cgroup, a PID namespace and a
//! `config.json`); the daemon, the hook and the simulated GPU are real.

use std::ffi::OsStr;
use std::path::Path;

use crate::container::ContainerProcess;
use crate::daemon::{Running, Workdir};
use crate::dist;
use crate::kubepod::{self, KubeContainer};
use crate::sim::SimGpu;

/// The daemon and its working directory.
pub struct PlannedNode {
    pub wd: Workdir,
    pub daemon: Running,
}

/// One container of the node and its one process.
pub struct Tenant {
    pub ctr: KubeContainer,
    pub proc: ContainerProcess,
}

impl Tenant {
    /// The process's host PID.
    pub fn pid(&self) -> u32 {
        self.proc.host_pid()
    }
}

impl PlannedNode {
    /// A node on `gpu` with its daemon running (a scan every 0.2 s).
    pub fn start(prefix: &str, gpu: &SimGpu) -> PlannedNode {
        Self::start_env(prefix, gpu, &[])
    }

    /// As [`Self::start`], the daemon with `env` on top of the simulator's
    /// (`SIMGPU_PROCESS_UTIL=0`: NVML without per-process utilization).
    pub fn start_env(prefix: &str, gpu: &SimGpu, env: &[(&str, &str)]) -> PlannedNode {
        let wd = kubepod::spec_workdir(prefix);
        let spec = kubepod::runtime_spec_pattern(&wd);
        let port = crate::http::free_port();
        let mut cmd = wd.daemon_command(
            gpu,
            &kubepod::state_dir(&wd),
            &wd.path("no-hami-dir"),
            &format!("127.0.0.1:{port}"),
            &["--runtime-spec", &spec, "--interval", "0.2"],
        );
        cmd.envs(env.iter().copied());
        let daemon = Running::start(cmd, port, wd.path("daemon.log"));
        PlannedNode { wd, daemon }
    }

    /// Container `name` (`salt` tells it apart) whose runtime spec and
    /// process environment are `vars` plus its own region, running `exe
    /// args` under the hook.
    pub fn run(
        &self,
        gpu: &SimGpu,
        salt: u64,
        name: &str,
        vars: &[(&str, &str)],
        exe: &Path,
        args: &[&str],
    ) -> Tenant {
        let region = self.wd.region(name);
        let region_s = region.display().to_string();
        let mut spec: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
        spec.push(format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={region_s}"));
        let ctr = KubeContainer::create(&self.wd, salt, &spec);
        let base = self.wd.envs(gpu);
        let hook = dist::hook_lib();
        let mut env: Vec<(&str, &OsStr)> = base
            .iter()
            .filter(|(k, _)| k != "VGPU_SM_NODE_DIR")
            .map(|(k, v)| (k.as_str(), OsStr::new(v)))
            .collect();
        env.push(("LD_PRELOAD", hook.as_os_str()));
        env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", OsStr::new(&region_s)));
        for (k, v) in vars {
            env.push((k, OsStr::new(v)));
        }
        let mut argv: Vec<&OsStr> = vec![exe.as_os_str()];
        argv.extend(args.iter().map(OsStr::new));
        let proc = ctr.cg.spawn(&argv, &env);
        Tenant { ctr, proc }
    }

    /// What `vgpu turns --json` says of this node.
    pub fn turns(&self) -> Result<serde_json::Value, String> {
        let mut c = std::process::Command::new(dist::vgpu_bin());
        c.args(["turns", "--json", "--state-dir"])
            .arg(kubepod::state_dir(&self.wd));
        let (ok, out, err) = crate::hook::run(c);
        if !ok {
            return Err(format!("vgpu turns: {out}{err}"));
        }
        serde_json::from_str(&out).map_err(|e| format!("vgpu turns --json: {e}: {out}"))
    }
}

/// Writes, in place, the node directory's table of SM turns as hooks before
/// the daemon's plan read it (`vgpu-sm-<GPU UUID>` in `VGPU_SM_NODE_DIR`,
/// HAMi's `/tmp/vgpulock`, which any container can write): a 64-byte header
/// (magic `vgpusn01`, version 2, size) and 32 members of 64 bytes, the first
/// a priority-0 container `owner` launching at `now` with 50 ms in flight.
/// Never truncated (that would only cut off the readers' mappings).
pub fn forge_old_table(table: &Path, owner: u64, now: u64) {
    use std::os::unix::fs::FileExt as _;
    let mut b = vec![0u8; 64 + 64 * 32];
    b[0..8].copy_from_slice(b"vgpusn01");
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    let size = b.len() as u32;
    b[12..16].copy_from_slice(&size.to_le_bytes());
    let m = &mut b[64..128];
    m[0..8].copy_from_slice(&owner.to_le_bytes());
    m[8..16].copy_from_slice(&now.to_le_bytes()); // seen
    m[20..24].copy_from_slice(&1u32.to_le_bytes()); // rank 1: priority 0
    m[24..32].copy_from_slice(&now.to_le_bytes()); // wants
    m[32..40].copy_from_slice(&(now + 50_000_000).to_le_bytes()); // in flight
    if let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(table)
    {
        let _ = f.write_all_at(&b, 0);
    }
}
