//! A tenant that can only hurt itself (the hook's side): what it writes into the node directory, shared by every
//! container, decides nothing for a neighbour; truncating its own
//! `.sm` sidecar or its own region, or renaming a fresh file over the
//! sidecar, does not lift the container's SM or memory limit. Needs the built artifacts and the simulated GPU
//! (`cargo xtask test`). Timing-sensitive, so the tests run one at a time.

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use vgpu_tests::hook::{sm_sidecar_path, truncate_file, HookEnv, Running};
use vgpu_tests::sim::SimGpu;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const M: u64 = 1 << 20;

/// Starts `sm_loop kernel <kernel> <seconds>` under the hook in `env`'s
/// container on `gpu`, at SM limit `limit` (enforced); returns once it is
/// ready.
fn sm_loop(env: &HookEnv, gpu: &SimGpu, limit: u32, kernel: &str, seconds: &str) -> Running {
    let exe = env.build("sm_loop");
    let mut c = env.hooked(&exe, &["kernel", kernel, seconds]);
    gpu.apply(&mut c);
    c.env("CUDA_DEVICE_SM_LIMIT", limit.to_string())
        .env("GPU_CORE_UTILIZATION_POLICY", "force");
    let mut r = Running::start(c);
    assert_eq!(r.wait_for("ready"), "ready", "sm_loop did not start");
    r
}

/// Another container writes what it likes into the node directory every
/// container shares: a phantom priority-0 member refreshed every 100 ms
/// with plausible instants under a new owner each time (the red team's
/// variant that held a default-priority neighbour at 0.8 % of its rate),
/// junk, a FIFO and thousands of files. No hook reads that directory any
/// more, so the neighbour (HAMi's default priority, limited to 50 %,
/// pointed at the directory as the older hooks were) keeps its rate: ≥ 90 %
/// of it.
#[test]
fn the_node_directory_decides_nothing_for_a_neighbour() {
    let _s = serial();
    let gpu = SimGpu::new();
    let node = gpu.dir().join("node");
    std::fs::create_dir_all(&node).expect("node dir");
    let env =
        HookEnv::new("tenant-nodedir", "0").env("VGPU_SM_NODE_DIR", &node.display().to_string());
    let p = sm_loop(&env, &gpu, 50, "busy_200us", "7");
    let pid = [p.child.id()];
    std::thread::sleep(Duration::from_millis(600));
    let before = gpu.combined_share(Duration::from_secs(1), &pid);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (node, stop) = (node.clone(), stop.clone());
        std::thread::spawn(move || {
            for i in 0..3000 {
                let _ = std::fs::write(node.join(format!("vgpu-sm-GPU-junk-{i}")), b"junk");
            }
            let _ = std::process::Command::new("mkfifo")
                .arg(node.join("lock"))
                .status();
            let table = node.join("vgpu-sm-GPU-516d6770-7500-4000-8000-000000000000");
            let mut owner = 0x5eed_0000_0000_0001_u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                vgpu_tests::planned::forge_old_table(&table, owner, simgpu::clock::mono_ns());
                owner += 2;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let after = gpu.combined_share(Duration::from_secs(2), &pid);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attacker.join().expect("attacker");
    eprintln!("neighbour: {before:.1} % before the attack, {after:.1} % during it");
    assert!(
        before > 40.0,
        "the neighbour did not run at its limit: {before:.1} %"
    );
    assert!(
        after >= 0.9 * before,
        "the node directory held the neighbour: {after:.1} % against {before:.1} %"
    );
}

/// A container limited to 20 % with 4 processes took
/// 67–69 % once it truncated its own sidecar (each process then limited
/// itself alone, on private pages). The processes re-attach the file, so
/// they share one bucket again: the container stays within its limit + 5.
#[test]
fn a_truncated_sidecar_keeps_the_container_within_its_sm_limit() {
    let _s = serial();
    let gpu = SimGpu::new();
    let env = HookEnv::new("tenant-sidecar", "0");
    let procs: Vec<Running> = (0..4)
        .map(|_| sm_loop(&env, &gpu, 20, "busy_500us", "6"))
        .collect();
    let pids: Vec<u32> = procs.iter().map(|p| p.child.id()).collect();
    std::thread::sleep(Duration::from_millis(600));
    let before = gpu.combined_share(Duration::from_secs(1), &pids);
    truncate_file(&sm_sidecar_path(&env.region_path()));
    std::thread::sleep(Duration::from_millis(300));
    let after = gpu.combined_share(Duration::from_secs(2), &pids);
    eprintln!("4 processes at 20 %: {before:.1} % before the truncation, {after:.1} % after");
    assert!(
        after <= 25.0,
        "the container escaped its SM limit: {after:.1} % at 20"
    );
    assert!(after > 10.0, "the container stopped: {after:.1} %");
    assert!(
        std::fs::metadata(sm_sidecar_path(&env.region_path()))
            .expect("sidecar")
            .len()
            > 0,
        "the sidecar was not re-attached"
    );
}

/// The same container whose sidecar cannot be shared at all (its path is a
/// directory, made before the processes start): each process falls back to
/// buckets of its own, and then takes its part of the limit (a quarter
/// each), not the whole limit each (80 % together before).
#[test]
fn an_unusable_sidecar_keeps_the_container_within_its_sm_limit() {
    let _s = serial();
    let gpu = SimGpu::new();
    let env = HookEnv::new("tenant-sidecar-dir", "0");
    std::fs::create_dir(sm_sidecar_path(&env.region_path())).expect("mkdir <region>.sm");
    let procs: Vec<Running> = (0..4)
        .map(|_| sm_loop(&env, &gpu, 20, "busy_500us", "5"))
        .collect();
    let pids: Vec<u32> = procs.iter().map(|p| p.child.id()).collect();
    std::thread::sleep(Duration::from_millis(600));
    let got = gpu.combined_share(Duration::from_secs(2), &pids);
    eprintln!("4 processes at 20 % without a usable sidecar: {got:.1} %");
    assert!(
        got <= 25.0,
        "the container escaped its SM limit: {got:.1} % at 20"
    );
    assert!(got > 10.0, "the container stopped: {got:.1} %");
}

/// The same container renaming a fresh file over its sidecar, then starting
/// more processes: those open the new file while the older ones had the
/// old one mapped, two buckets for one container (about 40 % at 20). The
/// older processes follow the renamed file within a second.
#[test]
fn a_sidecar_replaced_under_running_processes_keeps_the_container_within_its_sm_limit() {
    let _s = serial();
    let gpu = SimGpu::new();
    let env = HookEnv::new("tenant-sidecar-mv", "0");
    let mut procs: Vec<Running> = (0..2)
        .map(|_| sm_loop(&env, &gpu, 20, "busy_500us", "6"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let fresh = env.dir.join("fresh.sm");
    std::fs::write(&fresh, b"").expect("write a fresh file");
    std::fs::rename(&fresh, sm_sidecar_path(&env.region_path())).expect("rename over the sidecar");
    procs.extend((0..2).map(|_| sm_loop(&env, &gpu, 20, "busy_500us", "5")));
    let pids: Vec<u32> = procs.iter().map(|p| p.child.id()).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let got = gpu.combined_share(Duration::from_secs(2), &pids);
    eprintln!("4 processes at 20 %, the sidecar replaced between the first two and the others: {got:.1} %");
    assert!(
        got <= 25.0,
        "the container escaped its SM limit: {got:.1} % at 20"
    );
    assert!(got > 10.0, "the container stopped: {got:.1} %");
}

/// Sends one command to a `hook_slots` process; returns its reply.
fn ask(p: &mut Running, line: &str, reply: &str) -> String {
    let stdin = p.child.stdin.as_mut().expect("stdin");
    writeln!(stdin, "{line}").expect("write command");
    stdin.flush().expect("flush");
    p.wait_for(reply)
}

/// Three registered processes, the region truncated, each
/// then allocating 1200 MiB held 5100 MiB under a 2 GiB limit. They
/// re-attach the region and publish their own usage again: the container
/// never holds more than its limit.
#[test]
fn a_truncated_region_keeps_the_container_within_its_memory_limit() {
    let _s = serial();
    let env = HookEnv::new("tenant-region", "2g").env("SIMGPU_CONTEXT_BYTES", "64m");
    let exe = env.build("hook_slots");
    let mut procs: Vec<Running> = (0..3)
        .map(|_| {
            let mut p = Running::start(env.hooked(&exe, &[]));
            assert_eq!(p.wait_for("ready"), "ready", "hook_slots did not start");
            p
        })
        .collect();
    truncate_file(&env.region_path());
    let granted = procs
        .iter_mut()
        .map(|p| ask(p, &format!("alloc {}", 1200 * M), "alloc"))
        .filter(|r| r.ends_with("rc 0"))
        .count() as u64;
    let held = 3 * 64 * M + granted * 1200 * M;
    eprintln!(
        "after the truncation: {granted} of 3 allocations of 1200 MiB granted, {} MiB held under 2048",
        held / M
    );
    assert!(
        held <= 2048 * M,
        "the container holds {} MiB under a 2 GiB limit",
        held / M
    );
    assert_eq!(granted, 1, "the first allocation fits the limit");
}

/// A process holding memory that makes no CUDA call at all (a trainer past
/// its first steps), then its region truncated or renamed over: the
/// container's sum must not forget it. It publishes its usage again within
/// a second (its background look), so a sibling started after that is
/// held to what is left of the limit: of 1 GiB, the idle process's 64 MiB
/// context and 600 MiB leave too little for another 664.
#[test]
fn an_idle_holder_is_counted_again_after_its_region_is_truncated_or_replaced() {
    let _s = serial();
    for replace in [false, true] {
        let env = HookEnv::new("tenant-idle", "1g").env("SIMGPU_CONTEXT_BYTES", "64m");
        let exe = env.build("hook_mem");
        let mut idle = Running::start(env.hooked(&exe, &["hold", &(600 * M).to_string()]));
        let l = idle.wait_for("held");
        assert_eq!(vgpu_tests::hook::field(&l, "held rc"), Some(0), "{l}");
        if replace {
            let fresh = env.dir.join("fresh.cache");
            std::fs::write(&fresh, b"").expect("write a fresh file");
            std::fs::rename(&fresh, env.region_path()).expect("rename over the region");
        } else {
            truncate_file(&env.region_path());
        }
        std::thread::sleep(Duration::from_millis(1500));
        let mut sibling = Running::start(env.hooked(&exe, &["hold", &(600 * M).to_string()]));
        let l = sibling.wait_for("held");
        assert_eq!(
            vgpu_tests::hook::field(&l, "held rc"),
            Some(2),
            "region {}: a sibling got 600 MiB beside the idle holder's 664 under 1 GiB: {l}",
            if replace { "replaced" } else { "truncated" }
        );
    }
}
