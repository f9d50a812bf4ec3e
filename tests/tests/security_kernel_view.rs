//! Every limit judged from the kernel's view, end to end as root on the
//! simulated GPU, with containers as in `security_integrity` (a kubepods
//! cgroup ending in a 64-hex id, a PID namespace, a fixture runtime spec):
//! whatever a tenant does to its own files (its region, its `.sm` sidecar)
//! and whatever bound it pushes the daemon to (slots read per container),
//! memory is judged per GPU from NVML's per-process usage summed over the
//! container, and SM use per GPU from NVML's per-process utilization over
//! a window, each against the runtime spec's limit:
//!
//! - a 2-GPU container raising its limit for one allocation and lowering
//!   it again is `over_limit` on that GPU and, under `kill`, stopped
//!   within 1 s;
//! - a container whose own process sits behind 128 forged live slots still
//!   has its raised limit found and restored, and its usage judged;
//! - an idle holder beside a truncated or replaced region is `over_limit`
//!   under `restore` (finding and violation counted);
//! - a container truncating its own SM sidecar is past its SM limit and,
//!   under `kill`, stopped within 5 s; a neighbour at its limit is not.
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_common::region::{status, MAGIC, MAJOR_VERSION};
use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::ContainerProcess;
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::hook::{sm_sidecar_path, truncate_file};
use vgpu_tests::http::now_ns;
use vgpu_tests::kubepod::{process_dead, spawn_hooked, spec_daemon, spec_workdir, KubeContainer};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::{eventually, poll_until};

const G: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Memory escapes are stopped within this long of the allocation.
const MEMORY_WITHIN: Duration = Duration::from_secs(1);
/// SM escapes are stopped within this long of the attack's start.
const SM_WITHIN: Duration = Duration::from_secs(5);
/// Findings and restores come within this long.
const WITHIN: Duration = Duration::from_secs(2);

/// A container whose spec gives `limit` per GPU (no GPU list: the node's
/// GPUs), `region`, and `extra`.
fn container(fx: &Workdir, salt: u64, region: &Path, limit: &str, extra: &[&str]) -> KubeContainer {
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        format!("CUDA_DEVICE_MEMORY_LIMIT={limit}"),
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}", region.display()),
    ];
    env.extend(extra.iter().map(|s| (*s).to_owned()));
    KubeContainer::create(fx, salt, &env)
}

/// `daemon_prog <out> <args…>` in `ctr`, hooked, naming `region` with
/// `limit`, `env` on top; it waits for "go".
fn spawn(
    fx: &Workdir,
    gpu: &SimGpu,
    ctr: &KubeContainer,
    (name, region, limit): (&str, &Path, &str),
    env: &[(&str, &str)],
    args: &[&str],
) -> ContainerProcess {
    let mut all = vec![
        ("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new(limit)),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()),
    ];
    all.extend(env.iter().map(|(k, v)| (*k, OsStr::new(*v))));
    spawn_hooked(fx, gpu, ctr, name, &all, (&[], args))
}

/// The time from `since_ns` (a program's mark) until `pid` is dead, if it
/// dies within `limit` of now.
fn died_after(pid: u32, since_ns: u64, limit: Duration) -> Option<Duration> {
    poll_until(limit, || process_dead(pid))
        .map(|()| Duration::from_nanos(now_ns().saturating_sub(since_ns)))
}

/// `vgpu_violations_total{kind=…,action=…}`, 0 when absent.
fn violations(d: &Running, kind: &str, action: &str) -> u64 {
    let prefix = format!(r#"vgpu_violations_total{{kind="{kind}",action="{action}"}} "#);
    d.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.parse().ok())
        .unwrap_or(0)
}

/// The `over_limit` finding of container `id` that names `limit` on
/// `device`, waited for up to `within`.
fn over_limit(
    d: &Running,
    id: &str,
    device: u64,
    limit: &str,
    within: Duration,
) -> serde_json::Value {
    d.wait_finding("over_limit", within, |f| {
        f["kind"] == "over_limit"
            && f["container_id"] == id
            && f["limits"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|m| m["device"] == device && m["limit"] == limit)
            })
    })
}

/// A tenant on a 2-GPU node (1 GiB per GPU) raises `limit[0]` in its own
/// region, allocates 1901 MiB through the hook and puts the limit back
/// (the program does it, in about 100 µs: no scan sees the raised value).
/// The container holds 1901 MiB on GPU 0, under the 2 GiB it may hold on
/// both together: `over_limit` on device 0 and, under `kill`, dead within
/// 1 s of the allocation, counted as a violation.
#[test]
fn a_two_gpu_container_flipping_its_limit_is_killed_within_a_second() {
    let fx = spec_workdir("vgpu-judge-");
    let gpu = SimGpu::builder()
        .devices(2)
        .memory("16g")
        .context_bytes("64m")
        .build();
    let daemon = spec_daemon(&fx, &gpu, &["--on-violation", "kill"]);
    let region = fx.region("flip");
    let ctr = container(&fx, 1, &region, "1g", &[]);
    let mut p = spawn(
        &fx,
        &gpu,
        &ctr,
        ("flip", &region, "1g"),
        &[("DAEMON_PROG_FLIP", "1")],
        &["1901"],
    );
    let pid = p.host_pid();
    p.send_line("go");
    let t_alloc = fx.mark("flip", "allocated", Duration::from_secs(20));
    let flip_us = fx.mark("flip", "flip_us", Duration::from_secs(1));
    eprintln!("the raised limit stood {flip_us} µs");
    assert_eq!(
        RegionFile::open(&region, Access::ReadOnly)
            .expect("region")
            .region()
            .limit[0]
            .load(SeqCst),
        G,
        "the program puts the limit back"
    );
    let after = died_after(pid, t_alloc, Duration::from_secs(5));
    eprintln!("stopped {after:?} after the allocation");
    let found = over_limit(&daemon, &ctr.id, 0, "memory_bytes", WITHIN);
    eprintln!("over_limit: {found:#}");
    assert!(
        after.is_some_and(|a| a <= MEMORY_WITHIN),
        "not stopped within {MEMORY_WITHIN:?}: {after:?}\n{}",
        daemon.log_text()
    );
    assert!(
        found["action"]
            .as_str()
            .is_some_and(|a| a.contains(&format!("killed host pid {pid}"))),
        "{found:#}"
    );
    assert!(violations(&daemon, "over_limit", "killed") >= 1);
    p.wait();
}

/// A valid region at `path` whose limit the tenant raised to 64 GiB, with
/// 128 live slots of processes of another PID namespace ahead of any real
/// process (the daemon reads at most 128 slots per container).
fn region_behind_forged_slots(path: &Path) -> RegionFile {
    let f = RegionFile::create_or_open(path).expect("create region");
    let r = f.region();
    r.major_version.store(MAJOR_VERSION, SeqCst);
    r.minor_version.store(2, SeqCst);
    for d in 0..r.limit.len() {
        r.limit[d].store(64 * G, SeqCst);
        r.sm_limit[d].store(0, SeqCst);
    }
    for (i, s) in r.procs.iter().take(128).enumerate() {
        s.pidns.store(0xdead_0000 + i as u64, SeqCst);
        s.start.store(1, SeqCst);
        s.status.store(status::RUNNING, SeqCst);
        s.pid.store(100 + i as i32, SeqCst);
    }
    r.proc_num.store(128, SeqCst);
    r.initialized_flag.store(MAGIC, SeqCst);
    f
}

/// The tenant's region holds 128 forged live slots and a limit of 64 GiB
/// before its only real process starts; that process's slot is the 129th,
/// past what the daemon reads. The raised limit is still found
/// (`limit_tampered`) and restored to the spec's 1 GiB, and the 1500 MiB
/// the process allocates under it are `over_limit`, recorded as a
/// violation under `restore`.
#[test]
fn a_container_past_the_slot_bound_is_still_judged() {
    let fx = spec_workdir("vgpu-judge-");
    let gpu = SimGpu::builder().memory("16g").context_bytes("64m").build();
    let daemon = spec_daemon(&fx, &gpu, &[]);
    let region = fx.region("slots");
    let rf = region_behind_forged_slots(&region);
    let ctr = container(&fx, 2, &region, "1g", &[]);
    let mut p = spawn(&fx, &gpu, &ctr, ("slots", &region, "1g"), &[], &["1500"]);
    let pid = p.host_pid();
    p.send_line("go");
    let t_alloc = fx.mark("slots", "allocated", Duration::from_secs(20));
    let slot = rf
        .region()
        .active_slots()
        .iter()
        .position(|s| s.pid.load(SeqCst) == 1)
        .expect("the real process's slot");
    eprintln!("the process holds slot {slot}");
    assert!(slot >= 128, "slot {slot}: the forged slots must come first");
    let tampered = daemon.wait_finding("limit_tampered", WITHIN, |f| {
        f["kind"] == "limit_tampered" && f["container_id"] == ctr.id.as_str()
    });
    eprintln!("limit_tampered: {tampered:#}");
    let restored = poll_until(WITHIN, || rf.region().limit[0].load(SeqCst) == G);
    assert!(
        restored.is_some(),
        "not restored within {WITHIN:?}: {}",
        daemon.log_text()
    );
    let found = over_limit(&daemon, &ctr.id, 0, "memory_bytes", WITHIN);
    eprintln!(
        "over_limit {:.2} s after the allocation: {found:#}",
        (found["since_unix_ms"].as_u64().unwrap_or(0) * 1_000_000).saturating_sub(t_alloc) as f64
            / 1e9
    );
    assert!(violations(&daemon, "over_limit", "none") >= 1);
    assert!(violations(&daemon, "limit_tampered", "restored") >= 1);
    assert!(!process_dead(pid), "restore kills nobody");
    p.wait();
}

/// How a tenant wipes its region's sum.
#[derive(Clone, Copy, Debug)]
enum Wipe {
    Truncate,
    Rename,
}

/// On a 2-GPU node, under 2 GiB per GPU, a first process allocates
/// 1100 MiB on GPU 0 and then stays idle; the tenant wipes its region
/// (truncation, or a fresh file renamed over it); a second process
/// allocates 1100 MiB on GPU 0, which the hook grants since the idle one is
/// missing from the sum (the idle one is stopped first: a running hook
/// publishes its usage again within a second, which
/// `security_tenant_hook` checks; this is about the daemon's verdict
/// whatever the region says). The container holds about 2.2 GiB on GPU 0 (less
/// than the 4 GiB of both GPUs together): `over_limit` on device 0 under
/// `restore`, with the violation counted, within 2 s of the second
/// allocation.
fn idle_holder_beside_a_wiped_region(wipe: Wipe, salt: u64) {
    let fx = spec_workdir("vgpu-judge-");
    let gpu = SimGpu::builder()
        .devices(2)
        .memory("16g")
        .context_bytes("64m")
        .build();
    let daemon = spec_daemon(&fx, &gpu, &[]);
    let region = fx.region("wiped");
    let ctr = container(&fx, salt, &region, "2g", &[]);
    let id = ("idle", region.as_path(), "2g");
    let mut idle = spawn(&fx, &gpu, &ctr, id, &[], &["1100"]);
    idle.send_line("go");
    fx.mark("idle", "allocated", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &idle.host_pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the idle holder");
    };
    signal("-STOP");
    match wipe {
        Wipe::Truncate => truncate_file(&region),
        Wipe::Rename => {
            let fresh = fx.path("regions/fresh.cache");
            std::fs::write(&fresh, b"").expect("fresh file");
            std::fs::rename(&fresh, &region).expect("rename over the region");
        }
    }
    let id = ("second", region.as_path(), "2g");
    let mut second = spawn(&fx, &gpu, &ctr, id, &[], &["1100"]);
    second.send_line("go");
    let t_alloc = fx.mark("second", "allocated", Duration::from_secs(20));
    let found = over_limit(&daemon, &ctr.id, 0, "memory_bytes", WITHIN);
    let since_ns = found["since_unix_ms"].as_u64().unwrap_or(0) * 1_000_000;
    eprintln!(
        "{wipe:?}: over_limit {:.2} s after the second allocation: {found:#}",
        since_ns.saturating_sub(t_alloc) as f64 / 1e9
    );
    let held = found["limits"]
        .as_array()
        .and_then(|l| l.iter().find(|m| m["limit"] == "memory_bytes"))
        .and_then(|m| m["found"].as_u64())
        .unwrap_or(0);
    assert!(held > 2200 * MIB, "{found:#}");
    assert!(violations(&daemon, "over_limit", "none") >= 1);
    signal("-CONT");
    idle.wait();
    second.wait();
}

#[test]
fn an_idle_holder_beside_a_truncated_region_is_over_limit() {
    idle_holder_beside_a_wiped_region(Wipe::Truncate, 3);
}

#[test]
fn an_idle_holder_beside_a_replaced_region_is_over_limit() {
    idle_holder_beside_a_wiped_region(Wipe::Rename, 4);
}

/// `sm_loop kernel busy_500us <seconds>` in `ctr`, hooked, limited to 20 %
/// of the GPU by its environment as its spec says.
fn sm_loop(fx: &Workdir, gpu: &SimGpu, ctr: &KubeContainer, region: &Path) -> ContainerProcess {
    let exe = dist::compile_c("sm_loop", fx.root(), false);
    let base = fx.envs(gpu);
    let hook = dist::hook_lib();
    let mut env: Vec<(&str, &OsStr)> = base
        .iter()
        .map(|(k, v)| (k.as_str(), OsStr::new(v)))
        .collect();
    env.extend([
        ("LD_PRELOAD", hook.as_os_str()),
        ("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new("1g")),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.as_os_str()),
        ("CUDA_DEVICE_SM_LIMIT", OsStr::new("20")),
        ("GPU_CORE_UTILIZATION_POLICY", OsStr::new("force")),
    ]);
    let argv = [
        exe.as_os_str(),
        OsStr::new("kernel"),
        OsStr::new("busy_500us"),
        OsStr::new("30"),
    ];
    ctr.cg.spawn(&argv, &env)
}

/// Truncates `path` every `every` until `stop`; counts the truncations.
fn truncating(path: &Path, every: Duration, stop: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let n = Arc::new(AtomicU64::new(0));
    let count = n.clone();
    let path = path.to_owned();
    std::thread::spawn(move || {
        while !stop.load(SeqCst) {
            if path.exists() {
                truncate_file(&path);
                count.fetch_add(1, SeqCst);
            }
            std::thread::sleep(every);
        }
    });
    n
}

/// Two containers limited to 20 % of the GPU run a kernel loop; one
/// truncates its own `.sm` sidecar every 5 ms (about 87 % of the GPU
/// before). By NVML's per-process utilization over a window, that one is
/// past its SM limit: `over_limit` on device 0 for `sm_percent`, and under
/// `kill` its process is dead within 5 s of the attack's start. The
/// neighbour, at its limit, is neither reported nor killed.
#[test]
fn truncating_the_sm_sidecar_is_over_the_sm_limit_and_killed() {
    let fx = spec_workdir("vgpu-judge-");
    let gpu = SimGpu::builder().memory("16g").context_bytes("64m").build();
    let daemon = spec_daemon(&fx, &gpu, &["--on-violation", "kill"]);
    let spec_sm = ["CUDA_DEVICE_SM_LIMIT=20"];
    let r_att = fx.region("sm-attacker");
    let r_ok = fx.region("sm-neighbour");
    let att = container(&fx, 5, &r_att, "1g", &spec_sm);
    let ok = container(&fx, 6, &r_ok, "1g", &spec_sm);
    let p_ok = sm_loop(&fx, &gpu, &ok, &r_ok);
    let p_att = sm_loop(&fx, &gpu, &att, &r_att);
    let (pid_att, pid_ok) = (p_att.host_pid(), p_ok.host_pid());
    let sidecar = sm_sidecar_path(&r_att);
    eventually(Duration::from_secs(10), "the SM sidecar", || {
        sidecar.exists()
    });
    std::thread::sleep(Duration::from_millis(500));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let n = truncating(&sidecar, Duration::from_millis(5), stop.clone());
    let shares = gpu.process_shares(Duration::from_secs(1), &[pid_att, pid_ok]);
    eprintln!(
        "shares during the attack: attacker {:.1} %, neighbour {:.1} %",
        shares[0], shares[1]
    );
    let dead = loop {
        if process_dead(pid_att) {
            break Some(started.elapsed());
        }
        if started.elapsed() > SM_WITHIN + Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, SeqCst);
    eprintln!(
        "attacker stopped {dead:?} after the attack began ({} truncations)",
        n.load(SeqCst)
    );
    let found = over_limit(&daemon, &att.id, 0, "sm_percent", WITHIN);
    eprintln!("over_limit: {found:#}");
    assert!(
        dead.is_some_and(|d| d <= SM_WITHIN),
        "not stopped within {SM_WITHIN:?}: {dead:?}\n{}",
        daemon.log_text()
    );
    assert!(violations(&daemon, "over_limit", "killed") >= 1);
    // The neighbour kept to its limit for the whole time.
    assert!(!process_dead(pid_ok), "the neighbour was killed");
    let list = daemon.findings();
    assert!(
        !list
            .iter()
            .any(|f| f["kind"] == "over_limit" && f["container_id"] == ok.id.as_str()),
        "{list:#?}"
    );
    drop(p_ok);
    drop(p_att);
}
