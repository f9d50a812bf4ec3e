//! Issue #41, HAMi's whole-GPU mode: a container whose spec sets
//! `CUDA_DISABLE_CONTROL=true` gets HAMi's limit variables and region
//! directory but no `/etc/ld.so.preload` (HAMi v2.10.0, 4707fb0,
//! `pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go` `Allocate`:
//! the preload mount is skipped when the variable parses true with Go's
//! `strconv.ParseBool`), so its processes run without any hook by design.
//! The daemon must not call them `no_region`, `unlimited_process` or
//! untracked, and must still show them (host PID, memory, pod); the same
//! unhooked process in a container whose spec does not opt out is
//! reported as before. Containers as `security_kernel_view` makes them: a
//! kubepods cgroup ending in a 64-hex id and a runtime spec.

use std::ffi::OsStr;
use std::time::Duration;

use serde_json::Value;
use vgpu_tests::container::ContainerProcess;
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::http::get;
use vgpu_tests::kubepod::{spec_daemon, spec_workdir, KubeContainer};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

const MIB: u64 = 1 << 20;

fn findings(d: &Running) -> Vec<Value> {
    let (code, body) = get(d.port, "/findings").expect("findings");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("findings json");
    v["findings"].as_array().cloned().unwrap_or_default()
}

/// A container with HAMi's environment for one GPU (2 GiB, region
/// `name`), `extra` on top.
fn container(wd: &Workdir, salt: u64, name: &str, extra: &[&str]) -> KubeContainer {
    let region = wd.region(name);
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "CUDA_DEVICE_MEMORY_LIMIT_0=2048m".to_owned(),
        "CUDA_DEVICE_SM_LIMIT=0".to_owned(),
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}", region.display()),
    ];
    env.extend(extra.iter().map(|s| (*s).to_owned()));
    KubeContainer::create(wd, salt, &env)
}

/// `daemon_prog` in `ctr` without the hook (no preload mounted), with the
/// container's variables as the runtime gives them (region `name`),
/// allocating 128 MiB.
fn unhooked(
    wd: &Workdir,
    gpu: &SimGpu,
    ctr: &KubeContainer,
    name: &str,
    extra: &[(&str, &str)],
) -> ContainerProcess {
    let base = wd.envs(gpu);
    let mut env: Vec<(&str, &OsStr)> = base
        .iter()
        .map(|(k, v)| (k.as_str(), OsStr::new(v)))
        .collect();
    let region = wd.region(name);
    env.push(("CUDA_DEVICE_MEMORY_LIMIT_0", OsStr::new("2048m")));
    env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()));
    env.extend(extra.iter().map(|(k, v)| (*k, OsStr::new(*v))));
    let out = wd.out(name);
    let argv: Vec<&OsStr> = vec![wd.prog.as_os_str(), out.as_os_str(), OsStr::new("128")];
    let mut p = ctr.cg.spawn(&argv, &env);
    p.send_line("go");
    p
}

#[test]
fn a_whole_gpu_container_is_shown_but_not_a_finding() {
    let wd = spec_workdir("vgpu-whole-gpu-");
    let gpu = SimGpu::new();
    let daemon = spec_daemon(&wd, &gpu, &["--slot-grace", "1"]);
    let whole = container(&wd, 41, "whole", &["CUDA_DISABLE_CONTROL=true"]);
    let limited = container(&wd, 42, "limited", &[]);
    let p_whole = unhooked(
        &wd,
        &gpu,
        &whole,
        "whole",
        &[("CUDA_DISABLE_CONTROL", "true")],
    );
    let p_limited = unhooked(&wd, &gpu, &limited, "limited", &[]);
    let (pid_whole, pid_limited) = (p_whole.host_pid(), p_limited.host_pid());
    wd.mark("whole", "allocated", Duration::from_secs(10));
    wd.mark("limited", "allocated", Duration::from_secs(10));

    // The container that should be hooked: reported as before.
    let kinds = |pid: u32| -> Vec<String> {
        findings(&daemon)
            .iter()
            .filter(|f| f["pid"] == pid)
            .filter_map(|f| f["kind"].as_str().map(str::to_owned))
            .collect()
    };
    let reported = poll_until(Duration::from_secs(10), || {
        let k = kinds(pid_limited);
        (k.iter().any(|k| k == "no_region") && k.iter().any(|k| k == "unlimited_process"))
            .then_some(k)
    });
    assert!(
        reported.is_some(),
        "the unhooked process of a limited container is reported: {:?}\n{}",
        kinds(pid_limited),
        daemon.log_text()
    );
    // By then the whole-GPU one has been past its grace for as long.
    std::thread::sleep(Duration::from_secs(2));
    let all = findings(&daemon);
    assert!(
        all.iter().all(|f| f["pid"] != pid_whole),
        "no finding for the whole-GPU container's process {pid_whole}: {all:#?}"
    );

    // Still shown: its host PID, its memory, its pod.
    let uid = whole
        .cg
        .rel()
        .split('/')
        .find_map(|c| c.strip_prefix("pod").map(str::to_owned))
        .expect("pod uid in the cgroup path");
    let shown = poll_until(Duration::from_secs(10), || {
        let (_, m) = get(daemon.port, "/metrics")?;
        m.lines()
            .find(|l| {
                l.starts_with("vgpu_uncontrolled_process_memory_bytes{")
                    && l.contains(&format!("pid=\"{pid_whole}\""))
            })
            .map(str::to_owned)
    });
    let line =
        shown.unwrap_or_else(|| panic!("no series for pid {pid_whole}:\n{}", daemon.metrics()));
    assert!(line.contains(&format!("pod_uid=\"{uid}\"")), "{line}");
    let bytes: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes >= (128 * MIB) as f64, "{line}");
    p_whole.wait();
    p_limited.wait();
    daemon.stop();
}
