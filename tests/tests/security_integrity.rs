//! Limit integrity, end to end as root on the simulated
//! GPU: a "container" (a cgroup whose path ends in a 64-hex container id,
//! plus a PID namespace) whose runtime spec (a fixture `config.json`, as
//! containerd writes it) says 1 GiB, and `vgpu daemon` pointed at it with
//! `--runtime-spec`. A tenant raising its region's limit, running without
//! the limit variable, naming a private region or allocating around the
//! hook is reported within 2 s and stopped under the enforcing policy; an
//! admin's `vgpu set-mem-limit` is neither reported nor undone.
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::ffi::OsStr;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::ContainerProcess;
use vgpu_tests::daemon::Workdir;
use vgpu_tests::dist;
use vgpu_tests::http::now_ns;
use vgpu_tests::kubepod::{
    process_dead, spawn_hooked, spec_daemon, spec_workdir, state_dir, wait_slot_hostpid,
    KubeContainer,
};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::{eventually, poll_until};

const G: u64 = 1 << 30;
/// `limit[0]` and `sm_limit[0]` in the v1.2 region.
const LIMIT0_OFFSET: u64 = 1600;
const SM_LIMIT0_OFFSET: u64 = 1728;
const WITHIN: Duration = Duration::from_secs(2);

/// `daemon_prog <out> <hooked-MiB> [hidden-MiB]` in `ctr`, hooked, with
/// `env` on top of the simulator's (`under_shell`: as a child of `sh`, not
/// PID 1 of its namespace); it waits for "go".
fn spawn(
    fx: &Workdir,
    gpu: &SimGpu,
    ctr: &KubeContainer,
    name: &str,
    env: &[(&str, String)],
    args: &[&str],
    under_shell: bool,
) -> ContainerProcess {
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, OsStr::new(v))).collect();
    let shell: &[&str] = if under_shell {
        &["sh", "-c", "\"$@\"; exit $?", "sh"]
    } else {
        &[]
    };
    spawn_hooked(fx, gpu, ctr, name, &env, (shell, args))
}

fn limit0(path: &Path) -> u64 {
    let f = RegionFile::open(path, Access::ReadOnly).expect("region");
    f.region().limit[0].load(SeqCst)
}

fn sm_limit0(path: &Path) -> u64 {
    let f = RegionFile::open(path, Access::ReadOnly).expect("region");
    f.region().sm_limit[0].load(SeqCst)
}

/// The first child of host process `pid` (waits up to 5 s for it).
fn child_of(pid: u32) -> u32 {
    eventually(Duration::from_secs(5), &format!("a child of {pid}"), || {
        let c =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        c.split_whitespace().next().map(|c| c.parse().expect("pid"))
    })
}

fn wait_dead(pid: u32, limit: Duration) -> bool {
    poll_until(limit, || process_dead(pid)).is_some() || process_dead(pid)
}

fn spec_env(region: &Path, extra: &[&str]) -> Vec<String> {
    spec_env_limited(region, "1g", extra)
}

/// [`spec_env`] with memory limit `limit`.
fn spec_env_limited(region: &Path, limit: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        format!("CUDA_DEVICE_MEMORY_LIMIT={limit}"),
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}", region.display()),
    ];
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

/// (a) A tenant rewrites `limit[0]` to 64 GiB with pwrite: reported within
/// 2 s and, under the default policy (restore), written back within 2 s.
/// (c) `vgpu set-mem-limit` then raises it: neither reported nor undone.
/// A raised SM share is restored the same way.
#[test]
fn tampered_limit_is_reported_and_restored_but_admin_changes_are_not() {
    let fx = spec_workdir("vgpu-integrity-");
    let gpu = SimGpu::builder().memory("16g").build();
    let daemon = spec_daemon(&fx, &gpu, &[]);
    let region = fx.region("a");
    let ctr = KubeContainer::create(&fx, 1, &spec_env(&region, &["CUDA_DEVICE_SM_LIMIT=30"]));
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g".to_owned()),
        ("CUDA_DEVICE_SM_LIMIT", "30".to_owned()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            region.display().to_string(),
        ),
    ];
    let mut p = spawn(&fx, &gpu, &ctr, "a", &env, &["64"], false);
    let host = p.host_pid();
    p.send_line("go");
    fx.mark("a", "allocated", Duration::from_secs(10));
    wait_slot_hostpid(&region, host, &daemon);
    // A container as given: nothing to say.
    std::thread::sleep(Duration::from_millis(1200));
    let clean = daemon.findings();
    assert!(clean.is_empty(), "{clean:#?}\n{}", daemon.log_text());
    assert_eq!(limit0(&region), G);

    // The tenant's write (the region is read-write in its container).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .expect("open");
    f.write_all_at(&(64 * G).to_le_bytes(), LIMIT0_OFFSET)
        .expect("pwrite");
    let t0 = Instant::now();
    let found = daemon.wait_finding("limit_tampered", Duration::from_secs(10), |f| {
        f["kind"] == "limit_tampered" && f["container_id"] == ctr.id.as_str()
    });
    let after = t0.elapsed();
    eprintln!("limit_tampered after {after:?}: {found:#}");
    assert!(after <= WITHIN, "took {after:?}");
    assert_eq!(found["limits"][0]["device"], 0, "{found:#}");
    assert_eq!(found["limits"][0]["limit"], "memory_bytes");
    assert_eq!(found["limits"][0]["expected"], G);
    assert_eq!(found["limits"][0]["found"], 64 * G);
    assert_eq!(found["action"], "restored");
    assert_eq!(found["region"], region.display().to_string());
    assert_eq!(found["cgroup"], ctr.cg.rel());
    // Written back.
    while limit0(&region) != G {
        assert!(
            t0.elapsed() <= WITHIN,
            "limit still {} after {:?}",
            limit0(&region),
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("restored after {:?}", t0.elapsed());
    assert!(daemon.log_text().contains("limit tampered: region"));

    // An admin raises it: recorded, so the daemon takes it as the limit.
    let out = Command::new(dist::vgpu_bin())
        .arg("set-mem-limit")
        .arg(&region)
        .args(["--device", "0", "2g", "--state-dir"])
        .arg(state_dir(&fx))
        .output()
        .expect("set-mem-limit");
    assert!(out.status.success(), "{out:?}");
    // Several scans later: still 2 GiB, and no finding about it.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        assert_eq!(
            limit0(&region),
            2 * G,
            "the admin's change was undone: {}",
            daemon.log_text()
        );
        let list = daemon.findings();
        assert!(
            !list.iter().any(|f| f["kind"] == "limit_tampered"
                && f["container_id"] == ctr.id.as_str()
                && f["limits"][0]["found"] == 2 * G),
            "{list:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A tenant write over the admin's value is restored to the admin's value.
    f.write_all_at(&(64 * G).to_le_bytes(), LIMIT0_OFFSET)
        .expect("pwrite");
    let t0 = Instant::now();
    while limit0(&region) != 2 * G {
        assert!(
            t0.elapsed() <= WITHIN,
            "not restored to the admin's 2 GiB: {}",
            limit0(&region)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The SM share too: 30 % raised to none (100) is written back.
    f.write_all_at(&100u64.to_le_bytes(), SM_LIMIT0_OFFSET)
        .expect("pwrite");
    let t0 = Instant::now();
    let found = daemon.wait_finding("limit_tampered", Duration::from_secs(10), |f| {
        f["kind"] == "limit_tampered" && f["limits"][0]["limit"] == "sm_percent"
    });
    assert!(t0.elapsed() <= WITHIN, "took {:?}", t0.elapsed());
    assert_eq!(found["limits"][0]["expected"], 30, "{found:#}");
    assert_eq!(found["limits"][0]["found"], 100, "{found:#}");
    while sm_limit0(&region) != 30 {
        assert!(
            t0.elapsed() <= WITHIN,
            "SM limit still {}",
            sm_limit0(&region)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = daemon.metrics();
    assert!(m.contains("vgpu_findings{kind=\"limit_tampered\"}"), "{m}");
    p.wait();
}

/// (b) Under `--on-violation kill`, a process of the container that drops
/// the limit variable, and one that names a private region, are reported
/// within 2 s and killed, and so is one without the hook once its slot
/// grace (1 s here) is over; a process as given is left alone.
#[test]
fn unlimited_and_private_processes_are_reported_and_killed() {
    let fx = spec_workdir("vgpu-integrity-");
    let gpu = SimGpu::builder().memory("16g").build();
    let daemon = spec_daemon(&fx, &gpu, &["--on-violation", "kill", "--slot-grace", "1"]);
    let region = fx.region("b");
    // Room for two hooked processes' contexts and allocations: the
    // unlimited one must get as far as running, under the region's limit.
    let ctr = KubeContainer::create(&fx, 2, &spec_env_limited(&region, "4g", &[]));
    let shared = (
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        region.display().to_string(),
    );
    let limit = ("CUDA_DEVICE_MEMORY_LIMIT", "4g".to_owned());

    let mut good = spawn(
        &fx,
        &gpu,
        &ctr,
        "good",
        &[limit.clone(), shared.clone()],
        &["64"],
        false,
    );
    let good_pid = good.host_pid();
    good.send_line("go");
    fx.mark("good", "allocated", Duration::from_secs(10));
    wait_slot_hostpid(&region, good_pid, &daemon);

    let private = fx.region("mine");
    let mut unl = spawn(
        &fx,
        &gpu,
        &ctr,
        "unlimited",
        std::slice::from_ref(&shared),
        &["64"],
        false,
    );
    let mut prv = spawn(
        &fx,
        &gpu,
        &ctr,
        "private",
        &[
            limit.clone(),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                private.display().to_string(),
            ),
        ],
        &["64"],
        false,
    );
    // No hook at all (an empty LD_PRELOAD replaces the fixture's), under
    // a shell so that it is not PID 1 of its namespace (a PID 1 without the
    // hook beside hooked PID 1s of other namespaces is daemon_observer's
    // two-namespace test).
    let mut bare = spawn(
        &fx,
        &gpu,
        &ctr,
        "bare",
        &[limit.clone(), shared.clone(), ("LD_PRELOAD", String::new())],
        &["64"],
        true,
    );
    let (unl_pid, prv_pid) = (unl.host_pid(), prv.host_pid());
    let bare_pid = child_of(bare.host_pid());
    unl.send_line("go");
    prv.send_line("go");
    bare.send_line("go");
    for (name, pid, kind, within) in [
        ("unlimited", unl_pid, "unlimited_process", WITHIN),
        ("private", prv_pid, "private_region", WITHIN),
        (
            "bare",
            bare_pid,
            "unlimited_process",
            WITHIN + Duration::from_secs(1),
        ),
    ] {
        let first = fx.mark(name, "first_call", Duration::from_secs(10));
        let f = daemon.wait_finding(kind, Duration::from_secs(10), |f| {
            f["kind"] == kind && f["pid"] == pid
        });
        let after = Duration::from_nanos(now_ns().saturating_sub(first));
        eprintln!("{kind} after {after:?}: {f:#}");
        assert!(after <= within, "{name}: {kind} took {after:?}");
        assert_eq!(f["container_id"], ctr.id.as_str());
        assert_eq!(f["action"], format!("killed host pid {pid}"), "{f:#}");
        assert!(
            wait_dead(pid, Duration::from_secs(2)),
            "{name} ({pid}) still alive"
        );
    }
    assert!(
        !process_dead(good_pid),
        "the process as given was killed: {}",
        daemon.log_text()
    );
    assert!(
        !daemon.findings().iter().any(|f| f["pid"] == good_pid),
        "{:#?}",
        daemon.findings()
    );
    good.wait();
    unl.wait();
    prv.wait();
    bare.wait();
}

/// (d) Allocations around the hook (a dlmopen'd libcuda) past the limit are
/// `over_limit` by the kernel's count within 2 s; under the default policy
/// the process lives, and a container whose spec sets
/// ACTIVE_OOM_KILLER=true has it killed.
#[test]
fn usage_past_the_limit_is_over_limit_and_oom_killer_opts_in_to_kill() {
    let fx = spec_workdir("vgpu-integrity-");
    let gpu = SimGpu::builder().memory("16g").build();
    let daemon = spec_daemon(&fx, &gpu, &[]);
    let mut procs = Vec::new();
    for (salt, name, extra) in [
        (3, "over", &[][..]),
        (4, "oom", &["ACTIVE_OOM_KILLER=true"][..]),
    ] {
        let region = fx.region(name);
        let ctr = KubeContainer::create(&fx, salt, &spec_env(&region, extra));
        let env = [
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g".to_owned()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                region.display().to_string(),
            ),
        ];
        let mut p = spawn(&fx, &gpu, &ctr, name, &env, &["64", "1100"], false);
        let pid = p.host_pid();
        p.send_line("go");
        procs.push((name, ctr, p, pid));
    }
    for (name, ctr, _, pid) in &procs {
        let t_alloc = fx.mark(name, "allocated", Duration::from_secs(10));
        let f = daemon.wait_finding("over_limit", Duration::from_secs(10), |f| {
            f["kind"] == "over_limit" && f["container_id"] == ctr.id.as_str()
        });
        let after = Duration::from_nanos(now_ns().saturating_sub(t_alloc));
        eprintln!("{name}: over_limit after {after:?}: {f:#}");
        assert!(after <= WITHIN, "{name}: took {after:?}");
        assert!(f["probe_bytes"].as_u64().unwrap_or(0) > G, "{f:#}");
        if *name == "oom" {
            assert_eq!(f["action"], format!("killed host pid {pid}"), "{f:#}");
            assert!(
                wait_dead(*pid, Duration::from_secs(2)),
                "{name} still alive"
            );
        } else {
            assert!(f.get("action").is_none(), "{f:#}");
        }
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        !process_dead(procs[0].3),
        "killed without the opt-in: {}",
        daemon.log_text()
    );
    // Where findings are read on the node: `vgpu findings` and
    // `vgpu inspect --json`.
    let out = Command::new(dist::vgpu_bin())
        .args(["findings", "--state-dir"])
        .arg(state_dir(&fx))
        .output()
        .expect("vgpu findings");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("over_limit") && l.contains(&procs[0].1.id[..12])),
        "{text}"
    );
    let out = Command::new(dist::vgpu_bin())
        .args(["inspect", "--json", "--state-dir"])
        .arg(state_dir(&fx))
        .arg(fx.dir.path().join("regions"))
        .output()
        .expect("vgpu inspect");
    let v: Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    let listed = v["daemon_findings"]["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        listed
            .iter()
            .any(|f| f["kind"] == "over_limit" && f["container_id"] == procs[0].1.id.as_str()),
        "{v:#}"
    );
    for (_, _, p, _) in procs {
        p.wait();
    }
}
