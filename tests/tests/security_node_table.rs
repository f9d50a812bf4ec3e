//! The node's SM tables validated by the daemon, end to end as root on the simulated GPU: `vgpu daemon`
//! with `--node-dir` on the simulator's node directory removes a member
//! that no live container vouches for, even one refreshed continuously with
//! plausible instants, and lowers a container's claimed priority to its
//! runtime spec's. Needs the built artifacts (`cargo xtask test`).
//! Timing-sensitive, so the tests run one at a time.
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::ffi::OsStr;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_tests::daemon::{Running as Daemon, Workdir};
use vgpu_tests::dist;
use vgpu_tests::hook::{sm_sidecar_path, HookEnv, Running};
use vgpu_tests::http::get;
use vgpu_tests::kubepod::{runtime_spec_pattern, KubeContainer};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The daemon's default `--interval`.
const SCAN: Duration = Duration::from_millis(500);
const PHANTOM: u64 = 0x5eed_f00d_dead_beef;
/// Member layout: `vgpu_common::node::Member` (64 bytes after a 64-byte
/// header).
fn member_at(index: u64) -> u64 {
    64 + 64 * index
}

fn start_daemon(fx: &Workdir, gpu: &SimGpu) -> Daemon {
    let spec = runtime_spec_pattern(fx);
    let node = gpu.dir().join("node");
    fx.start_daemon(
        gpu,
        &fx.path("state"),
        &fx.path("no-hami-dir"),
        &[
            "--runtime-spec",
            &spec,
            "--node-dir",
            &node.display().to_string(),
        ],
    )
}

fn word(f: &std::fs::File, at: u64) -> u64 {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at).expect("read node table");
    u64::from_le_bytes(b)
}

fn open_rw(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("opening {}: {e}", p.display()))
}

fn findings(d: &Daemon) -> Vec<Value> {
    let (code, body) = get(d.port, "/findings").expect("findings");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("json");
    v["findings"].as_array().cloned().unwrap_or_default()
}

/// The first `node_table_forged` finding with `action` whose message
/// names `what`, polled every 10 ms up to `limit`; `None` if none came.
fn wait_repair(d: &Daemon, action: &str, what: &str, limit: Duration) -> Option<Value> {
    poll_until(limit, || {
        findings(d).into_iter().find(|f| {
            f["kind"] == "node_table_forged"
                && f["action"] == action
                && f["message"].as_str().is_some_and(|m| m.contains(what))
        })
    })
}

/// `vgpu_violations_total{kind="node_table_forged",action=…}`.
fn repairs(d: &Daemon, action: &str) -> f64 {
    let label = format!("kind=\"node_table_forged\",action=\"{action}\"");
    d.metrics()
        .lines()
        .find(|l| l.starts_with("vgpu_violations_total{") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A process of another container (or none) keeps a phantom member alive
/// in every table: it writes member 31 once (a random owner, limit 90,
/// rank 1, HAMi priority 0, the highest), then refreshes its `seen`,
/// `wants` and `inflight_until` with plausible instants every 5 ms, as a
/// live hook would. Runs until `stop`.
fn phantom(tables: Vec<PathBuf>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let files: Vec<std::fs::File> = tables.iter().map(|p| open_rw(p)).collect();
    let mut m = [0u8; 40];
    let now = simgpu::clock::mono_ns();
    m[0..8].copy_from_slice(&PHANTOM.to_le_bytes());
    m[8..16].copy_from_slice(&now.to_le_bytes());
    m[16..20].copy_from_slice(&90u32.to_le_bytes());
    m[20..24].copy_from_slice(&1u32.to_le_bytes());
    m[24..32].copy_from_slice(&now.to_le_bytes());
    m[32..40].copy_from_slice(&(now + 50_000_000).to_le_bytes());
    for f in &files {
        f.write_all_at(&m, member_at(31))
            .expect("write the phantom");
    }
    std::thread::spawn(move || {
        while !stop.load(SeqCst) {
            let now = simgpu::clock::mono_ns();
            for f in &files {
                let at = member_at(31);
                let _ = f.write_all_at(&now.to_le_bytes(), at + 8);
                let _ = f.write_all_at(&now.to_le_bytes(), at + 24);
                let _ = f.write_all_at(&(now + 50_000_000).to_le_bytes(), at + 32);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// (a) A phantom member refreshed continuously by a live process (plausible
/// instants, so the hook's own checks let it count) held a neighbour
/// limited to 50 % with priority 1 to about a third of its launches for as
/// long as it ran. The daemon removes it (its owner is no container it
/// tracks) within two scans of the first write, says so in `/findings` and
/// counts it, and the neighbour is back to ≥ 90 % of its share within 1 s
/// of the removal.
#[test]
fn a_continuously_refreshed_phantom_member_is_removed() {
    let _s = serial();
    let fx = Workdir::new("vgpu-nodetable-", &["regions", "out", "runtime/k8s.io"]);
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu);
    let env = HookEnv::new("nodetable-neighbour", "0");
    let exe = env.build("sm_loop");
    let mut c = env.hooked(&exe, &["kernel", "busy_200us", "8"]);
    c.envs(fx.envs(&gpu))
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .env("CUDA_TASK_PRIORITY", "1")
        .env("GPU_CORE_UTILIZATION_POLICY", "force");
    let mut p = Running::start(c);
    assert_eq!(p.wait_for("ready"), "ready", "sm_loop did not start");
    let pid = [p.child.id()];
    std::thread::sleep(Duration::from_millis(1200));
    let before = gpu.combined_share(Duration::from_secs(1), &pid);
    assert!(
        before > 40.0,
        "the neighbour did not run at its limit: {before:.1} %"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let written = Instant::now();
    let refresher = phantom(gpu.node_tables(Duration::from_secs(2)), stop.clone());
    let found = wait_repair(&daemon, "removed", "5eedf00ddeadbeef", 2 * SCAN + SCAN);
    let removed_after = written.elapsed();
    let after = gpu.combined_share(Duration::from_secs(1), &pid);
    stop.store(true, SeqCst);
    refresher.join().expect("refresher");
    eprintln!(
        "neighbour at 50 %: {before:.1} % before the phantom; removed after {removed_after:?}; \
         {after:.1} % in the second after"
    );
    let found = found.unwrap_or_else(|| {
        panic!(
            "the phantom was not removed within {:?}; findings: {:#?}\n{}",
            3 * SCAN,
            findings(&daemon),
            daemon.log_text()
        )
    });
    assert!(
        removed_after <= Duration::from_secs(1) + SCAN,
        "removed only after {removed_after:?}"
    );
    assert!(
        after >= 0.9 * before,
        "the neighbour did not get its share back: {after:.1} % against {before:.1} %"
    );
    for t in gpu.node_tables(Duration::from_secs(2)) {
        let f = open_rw(&t);
        assert_ne!(word(&f, member_at(31)), PHANTOM, "{}", t.display());
    }
    assert!(repairs(&daemon, "removed") >= 1.0, "{}", daemon.metrics());
    eprintln!("finding: {}", found["message"]);
}

/// (b) A container whose runtime spec gives it priority 1 runs processes
/// that claim priority 0 (their own `CUDA_TASK_PRIORITY`): its member's
/// rank is lowered to the spec's within two scans, a finding says so, and
/// the container's own processes do not raise it again.
#[test]
fn a_container_claiming_a_higher_priority_than_its_spec_is_demoted() {
    let _s = serial();
    let fx = Workdir::new("vgpu-nodetable-", &["regions", "out", "runtime/k8s.io"]);
    let gpu = SimGpu::new();
    let daemon = start_daemon(&fx, &gpu);
    let region = fx.region("prio");
    let spec_env = [
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "CUDA_DEVICE_SM_LIMIT=50".to_owned(),
        "CUDA_TASK_PRIORITY=1".to_owned(),
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}", region.display()),
    ];
    let KubeContainer { cg, id } = KubeContainer::create(&fx, 7, &spec_env);

    let exe = dist::compile_c("sm_loop", fx.root(), false);
    let hook = dist::hook_lib();
    let base = fx.envs(&gpu);
    let region_s = region.display().to_string();
    let mut all: Vec<(&str, &OsStr)> = base
        .iter()
        .map(|(k, v)| (k.as_str(), OsStr::new(v)))
        .collect();
    all.extend([
        ("LD_PRELOAD", hook.as_os_str()),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", OsStr::new(&region_s)),
        ("CUDA_DEVICE_SM_LIMIT", OsStr::new("50")),
        ("CUDA_TASK_PRIORITY", OsStr::new("0")),
        ("GPU_CORE_UTILIZATION_POLICY", OsStr::new("force")),
    ]);
    let argv = [
        exe.as_os_str(),
        OsStr::new("kernel"),
        OsStr::new("busy_200us"),
        OsStr::new("8"),
    ];
    let _proc = cg.spawn(&argv, &all);

    // The container's id in the node table is the one in its sidecar.
    let sidecar = sm_sidecar_path(&region);
    let t = Instant::now();
    let (table, index, claimed_at) = loop {
        let owner = std::fs::File::open(&sidecar)
            .ok()
            .map(|f| word(&f, 16))
            .unwrap_or(0);
        let hit = (owner != 0)
            .then(|| {
                std::fs::read_dir(gpu.dir().join("node"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .find_map(|e| {
                        let f = std::fs::File::open(e.path()).ok()?;
                        let i = (0..32).find(|&i| word(&f, member_at(i)) == owner)?;
                        Some((e.path(), i))
                    })
            })
            .flatten();
        if let Some((p, i)) = hit {
            break (p, i, Instant::now());
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the container never joined a node table: {}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let f = std::fs::File::open(&table).expect("table");
    let rank = |f: &std::fs::File| (word(f, member_at(index) + 16) >> 32) as u32;
    let found = wait_repair(&daemon, "demoted", "priority 0", 4 * SCAN);
    let demoted_after = claimed_at.elapsed();
    let found = found.unwrap_or_else(|| {
        panic!(
            "no demotion within {:?} of the claim (rank {} now); findings: {:#?}\n{}",
            4 * SCAN,
            rank(&f),
            findings(&daemon),
            daemon.log_text()
        )
    });
    // Its own processes keep re-planning every 10 ms: the demotion stays.
    let mut ranks = Vec::new();
    for _ in 0..50 {
        ranks.push(rank(&f));
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("demoted after {demoted_after:?}; ranks after: {ranks:?}");
    assert!(
        ranks.iter().all(|&r| r == 2),
        "the claimed priority came back: ranks {ranks:?}"
    );
    assert_eq!(found["container_id"], Value::String(id.clone()), "{found}");
    assert!(repairs(&daemon, "demoted") >= 1.0, "{}", daemon.metrics());
}
