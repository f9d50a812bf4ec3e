//! Enforcement a tenant cannot dodge, end to end
//! as root on the simulated GPU, with containers as in `security_integrity`
//! (a kubepods cgroup ending in a 64-hex id, a PID namespace, a fixture
//! runtime spec saying 1 GiB):
//!
//! - `over_limit` and `--on-violation kill` use the kernel's and the
//!   driver's counts against the GPUs the runtime gave the container: a
//!   forged `device_num` widens nothing, and memory allocated through a
//!   libcuda the daemon does not probe still counts;
//! - a daemon outside the host's PID namespace frees no slot and says so;
//! - a restored tampering stays in `/findings` (resolved) and is counted.
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

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::container::ContainerProcess;
use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::{free_port, get, now_ns};
use vgpu_tests::kubepod::{
    process_dead, spawn_hooked, spec_daemon, spec_workdir, state_dir, wait_slot_hostpid,
    KubeContainer,
};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

const G: u64 = 1 << 30;
/// `device_num` and `limit[0]` in the v1.2 region.
const DEVICE_NUM_OFFSET: u64 = 56;
const LIMIT0_OFFSET: u64 = 1600;
/// Found and stopped within this long.
const WITHIN: Duration = Duration::from_secs(2);

/// A container whose spec gives it 1 GiB and `region` (no GPU list:
/// how many it may use is not the spec's to say here).
fn container(fx: &Workdir, salt: u64, region: &Path, extra: &[&str]) -> KubeContainer {
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "CUDA_DEVICE_MEMORY_LIMIT=1g".to_owned(),
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}", region.display()),
    ];
    env.extend(extra.iter().map(|s| (*s).to_owned()));
    KubeContainer::create(fx, salt, &env)
}

/// `daemon_prog <out> <args…>` in `ctr`, hooked, limited as its spec
/// says, waiting for "go".
fn spawn(
    fx: &Workdir,
    gpu: &SimGpu,
    ctr: &KubeContainer,
    name: &str,
    region: &Path,
    args: &[&str],
) -> ContainerProcess {
    let region = region.as_os_str();
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT", OsStr::new("1g")),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", region),
    ];
    spawn_hooked(fx, gpu, ctr, name, &env, (&[], args))
}

/// The time from `since_ns` (a program's mark) until `pid` is dead, if it
/// dies within `limit` of now.
fn died_after(pid: u32, since_ns: u64, limit: Duration) -> Option<Duration> {
    poll_until(limit, || process_dead(pid))
        .map(|()| Duration::from_nanos(now_ns().saturating_sub(since_ns)))
}

/// (a) A tenant writes `device_num` = 16 into its own region, then
/// allocates 8000 MiB around the hook (through the probed libcuda, loaded
/// a second time with dlmopen) under its 1 GiB limit: `over_limit` and,
/// under `kill`, the process is dead within 2 s of the allocation. The
/// allowance comes from the GPUs the node has (the spec names none), not
/// from the 16 devices the region claims.
#[test]
fn a_forged_device_num_widens_nothing_under_kill() {
    let fx = spec_workdir("vgpu-enforce-");
    // Small contexts: two processes' contexts fit the 1 GiB the hook counts.
    let gpu = SimGpu::builder().memory("16g").context_bytes("64m").build();
    let daemon = spec_daemon(&fx, &gpu, &["--on-violation", "kill"]);
    let region = fx.region("forged");
    let ctr = container(&fx, 1, &region, &[]);
    // A first process creates and registers the region.
    let mut first = spawn(&fx, &gpu, &ctr, "first", &region, &["64"]);
    let first_pid = first.host_pid();
    first.send_line("go");
    fx.mark("first", "allocated", Duration::from_secs(10));
    wait_slot_hostpid(&region, first_pid, &daemon);
    // The tenant's write (the region is read-write in its container),
    // repeated every 2 ms: a process's registration writes its own count.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .expect("open region");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                f.write_all_at(&16u64.to_le_bytes(), DEVICE_NUM_OFFSET)
                    .expect("pwrite device_num");
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // The second process holds 8000 MiB the hook never saw.
    let mut big = spawn(&fx, &gpu, &ctr, "big", &region, &["64", "8000"]);
    let big_pid = big.host_pid();
    big.send_line("go");
    let t_alloc = fx.mark("big", "allocated", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(10));
    let rf = RegionFile::open(&region, Access::ReadOnly).expect("region");
    assert_eq!(
        rf.region().device_num.load(SeqCst),
        16,
        "the forgery must hold for the test to mean anything"
    );
    let found = daemon.wait_finding("over_limit", Duration::from_secs(10), |f| {
        f["kind"] == "over_limit" && f["container_id"] == ctr.id.as_str()
    });
    eprintln!("over_limit: {found:#}");
    assert_eq!(
        found["action"],
        format!("killed host pid {big_pid}"),
        "{found:#}"
    );
    let after = died_after(big_pid, t_alloc, Duration::from_secs(5));
    eprintln!("stopped {after:?} after the allocation");
    assert!(
        after.is_some_and(|a| a <= WITHIN),
        "not stopped within {WITHIN:?}: {after:?}\n{}",
        daemon.log_text()
    );
    assert!(
        !process_dead(first_pid),
        "the process within the limit was killed"
    );
    stop.store(true, SeqCst);
    forger.join().expect("forger");
    first.wait();
    big.wait();
}

/// (b) 1100 MiB allocated through a copy of libcuda under another name
/// (a file the daemon does not probe) under a 1 GiB limit: the probes see
/// 64 MiB, NVML sees it all; `over_limit` by the driver's count and, under
/// `kill`, the process is dead within 2 s of the allocation.
#[test]
fn an_unprobed_allocation_path_is_over_limit_and_killed() {
    let fx = spec_workdir("vgpu-enforce-");
    let gpu = SimGpu::builder().memory("16g").build();
    let daemon = spec_daemon(&fx, &gpu, &["--on-violation", "kill"]);
    let copy = fx.path("lib/libnvcuda-copy.so");
    std::fs::copy(fx.libcuda(), &copy).expect("copy libcuda");
    let region = fx.region("unprobed");
    let ctr = container(&fx, 2, &region, &[]);
    let copy_arg = copy.display().to_string();
    let mut p = spawn(
        &fx,
        &gpu,
        &ctr,
        "hidden",
        &region,
        &["64", "1100", &copy_arg],
    );
    let pid = p.host_pid();
    p.send_line("go");
    let t_alloc = fx.mark("hidden", "allocated", Duration::from_secs(20));
    let found = daemon.wait_finding("over_limit", Duration::from_secs(10), |f| {
        f["kind"] == "over_limit" && f["container_id"] == ctr.id.as_str()
    });
    eprintln!("over_limit: {found:#}");
    assert!(
        found["probe_bytes"].as_u64().unwrap_or(u64::MAX) < G,
        "the probes must not see it: {found:#}"
    );
    assert!(found["nvml_bytes"].as_u64().unwrap_or(0) > G, "{found:#}");
    assert_eq!(
        found["action"],
        format!("killed host pid {pid}"),
        "{found:#}"
    );
    let after = died_after(pid, t_alloc, Duration::from_secs(5));
    eprintln!("stopped {after:?} after the allocation");
    assert!(
        after.is_some_and(|a| a <= WITHIN),
        "not stopped within {WITHIN:?}: {after:?}\n{}",
        daemon.log_text()
    );
    p.wait();
}

/// A daemon started in its own PID namespace (no `hostPID`) sees every
/// host PID as gone: it must free no slot (sampled for 3 s, many scans),
/// log an error at start-up and answer `/readyz` 503 saying why.
#[test]
fn a_daemon_outside_the_host_pid_namespace_frees_no_slot() {
    let fx = spec_workdir("vgpu-enforce-");
    let gpu = SimGpu::builder().memory("16g").build();
    let region = fx.region("live");
    let ctr = container(&fx, 3, &region, &[]);
    let mut p = spawn(&fx, &gpu, &ctr, "live", &region, &["64"]);
    let host = p.host_pid();
    p.send_line("go");
    fx.mark("live", "allocated", Duration::from_secs(10));
    // What a daemon on the host wrote earlier: the slot's host PID.
    let rf = RegionFile::open(&region, Access::ReadWrite).expect("region");
    let r = rf.region();
    let slot = r
        .active_slots()
        .iter()
        .position(|s| s.pid.load(SeqCst) == 1)
        .expect("the process's slot");
    let s = &r.procs[slot];
    s.hostpid.store(host as i32, SeqCst);
    assert!(s.pidns.load(SeqCst) != 0 && s.start.load(SeqCst) != 0);
    let used = s.used[0].total.load(SeqCst);
    assert!(used > 0);

    let port = free_port();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(dist::vgpu_bin())
        .args(["-v", "daemon", "--libcuda"])
        .arg(fx.libcuda())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(state_dir(&fx))
        .arg("--regions-root")
        .arg(fx.path("regions"))
        .args(["--interval", "0.1"])
        .envs(fx.envs(&gpu));
    let mut d = Running::spawn(cmd, port, fx.path("daemon.log"));
    let ready = poll_until(Duration::from_secs(30), || {
        let r = get(port, "/readyz");
        if r.is_none() {
            d.assert_alive();
        }
        r
    })
    .unwrap_or_else(|| panic!("no answer on /readyz within 30 s: {}", d.log_text()));
    // Many scans (0.1 s each) over the region, whose process the daemon
    // cannot see: the slot stays as it is.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            (
                s.pid.load(SeqCst),
                s.hostpid.load(SeqCst),
                s.used[0].total.load(SeqCst)
            ),
            (1, host as i32, used),
            "slot {slot} was freed: {}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = d.metrics();
    assert!(
        m.lines().any(|l| l == "vgpu_slots_reclaimed_total 0"),
        "{m}"
    );
    eprintln!("/readyz: {ready:?}");
    assert_eq!(ready.0, 503, "{ready:?}");
    assert!(ready.1.contains("host's PID namespace"), "{ready:?}");
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("cannot see host PIDs")),
        "{log}"
    );
    drop(d);
    p.wait();
}

/// A limit raised 1 GiB -> 64 GiB is restored within a scan, and the
/// finding stays in `/findings` and `vgpu findings`, marked resolved with
/// its action, a minute later (600 scans 0.1 s apart, the default 15 min
/// retention); `vgpu_violations_total`
/// counts it, and a second tampering once more; a restarted daemon keeps
/// both records.
#[test]
fn a_restored_tampering_stays_on_record() {
    let fx = spec_workdir("vgpu-enforce-");
    let gpu = SimGpu::builder().memory("16g").build();
    let daemon = spec_daemon(&fx, &gpu, &["--interval", "0.1"]);
    let region = fx.region("tamper");
    let ctr = container(&fx, 4, &region, &[]);
    let mut p = spawn(&fx, &gpu, &ctr, "t", &region, &["64"]);
    let host = p.host_pid();
    p.send_line("go");
    fx.mark("t", "allocated", Duration::from_secs(10));
    wait_slot_hostpid(&region, host, &daemon);
    let limit0 = || {
        RegionFile::open(&region, Access::ReadOnly)
            .expect("region")
            .region()
            .limit[0]
            .load(SeqCst)
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .expect("open region");
    let tamper = || {
        f.write_all_at(&(64 * G).to_le_bytes(), LIMIT0_OFFSET)
            .expect("pwrite");
        let t = Instant::now();
        while limit0() != G {
            assert!(t.elapsed() < WITHIN, "not restored: {}", daemon.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    tamper();
    // A minute later (Prometheus scrapes every 15-60 s), hundreds of scans
    // at this interval.
    let (mut last, _) = daemon.findings_at();
    let mut scans = 0;
    let t = Instant::now();
    while scans < 120 || t.elapsed() < Duration::from_secs(60) {
        let (at, _) = daemon.findings_at();
        if at != last {
            scans += 1;
            last = at;
        }
        assert!(
            t.elapsed() < Duration::from_secs(150),
            "scans stalled at {scans}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    eprintln!("{scans} scans in {:?}", t.elapsed());
    let (_, list) = daemon.findings_at();
    let kept = list
        .iter()
        .find(|f| f["kind"] == "limit_tampered" && f["container_id"] == ctr.id.as_str())
        .unwrap_or_else(|| panic!("the restored tampering is gone: {list:#?}"));
    eprintln!("kept: {kept:#}");
    assert_eq!(kept["action"], "restored", "{kept:#}");
    assert_eq!(kept["limits"][0]["found"], 64 * G, "{kept:#}");
    let resolved = kept["resolved_unix_ms"].as_u64().expect("resolved_unix_ms");
    assert!(resolved >= kept["since_unix_ms"].as_u64().unwrap_or(u64::MAX));
    let m = daemon.metrics();
    let violations = |m: &str| {
        m.lines()
            .find_map(|l| {
                l.strip_prefix(r#"vgpu_violations_total{kind="limit_tampered",action="restored"} "#)
            })
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(violations(&m), Some(1), "{m}");
    assert!(
        m.lines()
            .any(|l| l == r#"vgpu_findings{kind="limit_tampered"} 0"#),
        "the gauge says what is wrong now: {m}"
    );
    let out = Command::new(dist::vgpu_bin())
        .args(["findings", "--state-dir"])
        .arg(state_dir(&fx))
        .output()
        .expect("vgpu findings");
    let text = String::from_utf8_lossy(&out.stdout);
    // Listed, but resolved: nothing is wrong now.
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("limit_tampered") && l.contains("[resolved")),
        "{text}"
    );
    // The next tampering is another violation.
    tamper();
    let counted = poll_until(WITHIN, || violations(&daemon.metrics()) == Some(2));
    assert!(
        counted.is_some(),
        "not 2 violations within {WITHIN:?}: {}",
        daemon.metrics()
    );
    // A restarted daemon (same state directory) keeps the record.
    drop(daemon);
    let again = spec_daemon(&fx, &gpu, &["--interval", "0.1"]);
    let (_, list) = again.findings_at();
    let kept = list
        .iter()
        .filter(|f| {
            f["kind"] == "limit_tampered"
                && f["container_id"] == ctr.id.as_str()
                && f["action"] == "restored"
                && f["resolved_unix_ms"].is_u64()
        })
        .count();
    assert_eq!(kept, 2, "{list:#?}\n{}", again.log_text());
    p.wait();
}
