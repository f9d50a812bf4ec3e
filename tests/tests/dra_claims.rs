//! Issue #41, HAMi's DRA driver (Project-HAMi/k8s-dra-driver at ebeaad9,
//! `cmd/hami-kubelet-plugin/hami_core.go` `GetCDIContainerEdits`): for a
//! claim it makes `<hostHookPath>/vgpu/claims/<claim UID>/` (hostHookPath
//! `/usr/local`) and mounts it at the same path in the container, with
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE=<that directory>/<random uuid>.cache`,
//! `CUDA_DEVICE_SM_LIMIT_<i>` and `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m` per
//! device, and the hook directory's `libvgpu.so` and `ld.so.preload`.
//! Since the region's path is the same inside and out, a hooked process in
//! a kubepods cgroup naming the host path stands for the container here.
//! `vgpu daemon --hook-dir` (no `--regions-root`) must find the claim's
//! region under its default roots and label it: the pod from the kernel's
//! view of the process using it, the claim from the region's directory
//! (`claim_uid`), the limits the hook took from the DRA variables.

use std::ffi::OsStr;
use std::process::Command;
use std::time::Duration;

use vgpu_tests::daemon::Running;
use vgpu_tests::dist;
use vgpu_tests::kubepod::{runtime_spec_pattern, spawn_hooked, spec_workdir, KubeContainer};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

/// The series `name` of the region at `region`, if /metrics has it.
fn series(d: &Running, name: &str, region: &str) -> Option<String> {
    let m = d.metrics();
    m.lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{")) && l.contains(&format!("region=\"{region}\""))
        })
        .map(str::to_owned)
}

#[test]
fn the_daemon_finds_and_labels_a_dra_claims_region_under_its_hook_dir() {
    let wd = spec_workdir("vgpu-dra-");
    let gpu = SimGpu::builder().memory("8g").context_bytes("64m").build();
    let hook_dir = wd.path("host/usr/local/vgpu");
    let claim_uid = "7c0ffee1-2b3c-4d5e-8f90-a1b2c3d4e5f6";
    let claim_dir = hook_dir.join("claims").join(claim_uid);
    std::fs::create_dir_all(&claim_dir).unwrap();
    let region = claim_dir.join("3f2a9c1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b.cache");
    let region_s = region.display().to_string();
    let dra_env = [
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", region_s.as_str()),
        ("CUDA_DEVICE_SM_LIMIT_0", "60"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "256m"),
    ];
    let spec_env: Vec<String> = dra_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let ctr = KubeContainer::create(&wd, 7, &spec_env);
    let pod_uid = ctr
        .cg
        .rel()
        .split('/')
        .find_map(|c| c.strip_prefix("pod").map(str::to_owned))
        .expect("pod uid in the cgroup path");

    let port = vgpu_tests::http::free_port();
    let mut cmd = Command::new(dist::vgpu_bin());
    cmd.arg("daemon")
        .arg("--libcuda")
        .arg(wd.libcuda())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(wd.path("state"))
        .arg("--hook-dir")
        .arg(&hook_dir)
        .arg("--runtime-spec")
        .arg(runtime_spec_pattern(&wd))
        .envs(wd.envs(&gpu));
    let daemon = Running::start(cmd, port, wd.path("daemon.log"));

    let env: Vec<(&str, &OsStr)> = dra_env.iter().map(|(k, v)| (*k, OsStr::new(*v))).collect();
    let mut p = spawn_hooked(&wd, &gpu, &ctr, "dra", &env, (&[], &["64"]));
    p.send_line("go");
    wd.mark("dra", "allocated", Duration::from_secs(10));

    let limit = poll_until(Duration::from_secs(10), || {
        series(&daemon, "hami_vgpu_memory_limit_bytes", &region_s)
            .filter(|l| l.contains(&format!("pod_uid=\"{pod_uid}\"")))
    })
    .unwrap_or_else(|| {
        panic!(
            "no limit series for the claim's region with its pod:\n{}\n{}",
            daemon.metrics(),
            daemon.log_text()
        )
    });
    assert!(limit.ends_with(&(256u64 << 20).to_string()), "{limit}");
    let sm = series(&daemon, "vgpu_sm_limit_percent", &region_s).expect("SM limit series");
    assert!(
        sm.contains(&format!("claim_uid=\"{claim_uid}\"")) && sm.contains(&pod_uid),
        "the claim's series names its claim and pod: {sm}"
    );
    assert!(
        sm.ends_with(" 60"),
        "CUDA_DEVICE_SM_LIMIT_0 from the claim: {sm}"
    );
    assert!(
        daemon.findings().is_empty(),
        "a DRA container under its limits is no finding: {:#?}",
        daemon.findings()
    );
    p.wait();

    // Gone from the probes' view, the region is still found by listing
    // the claims root.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        series(&daemon, "hami_vgpu_memory_limit_bytes", &region_s).is_some(),
        "the claim's region listed under --hook-dir's claims/:\n{}",
        daemon.metrics()
    );
    daemon.stop();
}
