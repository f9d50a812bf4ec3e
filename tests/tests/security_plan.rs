//! What a container writes into its own sidecar's plan line (its statement
//! of activity) holds a neighbour back only as long as the kernel's view
//! supports it: a priority-0 container that claims to launch, refreshed
//! every 10 ms, while it stays idle, or while it burns CPU on launches the
//! driver refuses, holds a lower-priority neighbour for the daemon's
//! one-second grace at most, then not at all; one whose launches the driver
//! takes holds it, even where NVML has no per-process utilization. The
//! daemon, its eBPF probes, the hook and the simulated GPU are real; the
//! kubelet and containerd are stand-ins (`vgpu_tests::planned`). Needs the
//! built artifacts (`cargo xtask test`).

use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use vgpu_common::sidecar::{plan_at, OWN_WORDS_AT};
use vgpu_tests::planned::PlannedNode;
use vgpu_tests::sim::SimGpu;

/// The trainer: SM limit 50 (default priority), launching 200 µs kernels
/// for `secs` seconds, with `extra` in its spec too.
fn start_trainer(
    node: &PlannedNode,
    gpu: &SimGpu,
    extra: &[(&str, &str)],
    secs: &str,
) -> vgpu_tests::planned::Tenant {
    let sm_loop = vgpu_tests::dist::compile_c("sm_loop", &node.wd.path("out"), false);
    let mut spec = vec![
        ("CUDA_DEVICE_SM_LIMIT", "50"),
        ("GPU_CORE_UTILIZATION_POLICY", "force"),
    ];
    spec.extend_from_slice(extra);
    node.run(
        gpu,
        1,
        "trainer",
        &spec,
        &sm_loop,
        &["kernel", "busy_200us", secs],
    )
}

/// The share of a trainer at SM limit 50 (default priority) before and from
/// 1.5 s after a container with `spec` in its spec running `exe args`
/// (`stated`: which also writes, every 10 ms, that it launches and wants
/// its share now with 50 ms in flight, into its own sidecar and into the
/// node table hooks before the daemon's plan met in) joined its GPU.
fn trainer_beside(
    node: &PlannedNode,
    gpu: &SimGpu,
    spec: &[(&str, &str)],
    (exe, args): (&Path, &[&str]),
    stated: bool,
) -> (f64, f64) {
    let old_dir = node.wd.path("vgpulock");
    std::fs::create_dir_all(&old_dir).expect("node dir");
    let old_dir_s = old_dir.display().to_string();
    let trainer = start_trainer(node, gpu, &[("VGPU_SM_NODE_DIR", &old_dir_s)], "9");
    std::thread::sleep(Duration::from_millis(1500));
    let pid = [trainer.pid()];
    let before = gpu.combined_share(Duration::from_secs(1), &pid);
    let mut env = spec.to_vec();
    env.push(("VGPU_SM_NODE_DIR", &old_dir_s));
    let _high = node.run(gpu, 2, "high", &env, exe, args);
    let sidecar = vgpu_common::sidecar::path_for(&node.wd.region("high"));
    let stop = Arc::new(AtomicBool::new(false));
    let claim = stated.then(|| {
        let table = old_dir.join("vgpu-sm-GPU-516d6770-7500-4000-8000-000000000000");
        state_activity(sidecar, Some(table), stop.clone())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let after = gpu.combined_share(Duration::from_secs(2), &pid);
    stop.store(true, Relaxed);
    if let Some(c) = claim {
        c.join().expect("claimer");
    }
    assert!(
        before > 40.0,
        "the trainer did not run at its limit: {before:.1} %"
    );
    (before, after)
}

/// Writes into `sidecar` (and the old node `table`), every 10 ms until
/// `stop`, that its container launches and wants its share now, with 50 ms
/// in flight.
fn state_activity(
    sidecar: PathBuf,
    table: Option<PathBuf>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Relaxed) {
            if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&sidecar) {
                let now = simgpu::clock::mono_ns();
                let mut w = [0u8; 24];
                w[0..8].copy_from_slice(&now.to_le_bytes());
                w[8..16].copy_from_slice(&now.to_le_bytes());
                w[16..24].copy_from_slice(&(now + 50_000_000).to_le_bytes());
                let _ = f.write_all_at(&w, plan_at(0) + OWN_WORDS_AT as u64);
                if let Some(t) = &table {
                    vgpu_tests::planned::forge_old_table(t, 0x5eed_0000_0000_0001, now);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// The claimant's spec: priority 0, no SM limit.
const HIGH: &[(&str, &str)] = &[("CUDA_TASK_PRIORITY", "0")];

#[test]
fn an_idle_priority_0_container_claiming_activity_holds_no_neighbour_past_the_grace() {
    let gpu = SimGpu::new();
    let node = PlannedNode::start("plan-idle", &gpu);
    let hook_mem = vgpu_tests::dist::compile_c("hook_mem", &node.wd.path("out"), false);
    // A context and memory, and no launch.
    let (before, after) =
        trainer_beside(&node, &gpu, HIGH, (&hook_mem, &["hold", "1048576"]), true);
    eprintln!("trainer at 50 %: {before:.1} % before the idle service's claims, {after:.1} % from 1.5 s after");
    assert!(
        after >= 0.9 * before,
        "an idle container's claims held the trainer: {after:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
}

#[test]
fn a_priority_0_container_burning_cpu_on_refused_launches_holds_no_neighbour_past_the_grace() {
    let gpu = SimGpu::new();
    let node = PlannedNode::start("plan-refused", &gpu);
    let sm_loop = vgpu_tests::dist::compile_c("sm_loop", &node.wd.path("out"), false);
    // A context, and every CPU cycle on launches the driver refuses.
    let (before, after) = trainer_beside(
        &node,
        &gpu,
        HIGH,
        (&sm_loop, &["refused", "busy_200us", "9"]),
        true,
    );
    eprintln!("trainer at 50 %: {before:.1} % before the refused launcher's claims, {after:.1} % from 1.5 s after");
    assert!(
        after >= 0.9 * before,
        "refused launches and a busy CPU held the trainer: {after:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
}

#[test]
fn a_priority_0_service_whose_launches_the_driver_takes_holds_its_neighbour_without_process_utilization(
) {
    let gpu = SimGpu::new();
    // NVML answers no per-process utilization: only the daemon's launch
    // witness can support the service's statement.
    let node = PlannedNode::start_env("plan-witness", &gpu, &[("SIMGPU_PROCESS_UTIL", "0")]);
    let sm_loop = vgpu_tests::dist::compile_c("sm_loop", &node.wd.path("out"), false);
    let (before, after) = trainer_beside(
        &node,
        &gpu,
        HIGH,
        (&sm_loop, &["kernel", "busy_200us", "9"]),
        false,
    );
    eprintln!(
        "trainer at 50 %: {before:.1} % alone, {after:.1} % beside a launching priority-0 service"
    );
    assert!(
        after <= 0.2 * before,
        "a launching priority-0 service did not hold the trainer: {after:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
    let turns = node.turns().expect("vgpu turns");
    let text = turns.to_string();
    assert!(
        text.contains("\"held\":true"),
        "the trainer is not shown held: {text}"
    );
}

#[test]
fn a_container_burning_cpu_on_refused_launches_while_claiming_its_turn_does_not_shorten_a_neighbours(
) {
    let gpu = SimGpu::new();
    let node = PlannedNode::start("plan-turn", &gpu);
    let sm_loop = vgpu_tests::dist::compile_c("sm_loop", &node.wd.path("out"), false);
    // Same priority as the trainer; a limit that would take most of the
    // frame if its claim to want its share counted.
    let env = [("CUDA_DEVICE_SM_LIMIT", "90")];
    let (before, after) = trainer_beside(
        &node,
        &gpu,
        &env,
        (&sm_loop, &["refused", "busy_200us", "9"]),
        true,
    );
    eprintln!("trainer at 50 %: {before:.1} % before the claims to a 90 % turn, {after:.1} % from 1.5 s after");
    assert!(
        after >= 0.9 * before,
        "claims to a turn, backed by CPU time only, shortened the trainer's: {after:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
}

#[test]
fn idle_priority_0_containers_claiming_in_turn_share_one_grace_per_ten_seconds() {
    let gpu = SimGpu::new();
    let node = PlannedNode::start("plan-graces", &gpu);
    let hook_mem = vgpu_tests::dist::compile_c("hook_mem", &node.wd.path("out"), false);
    let trainer = start_trainer(&node, &gpu, &[], "20");
    let idle: Vec<_> = (0..4)
        .map(|i| {
            let name = format!("idle{i}");
            let t = node.run(&gpu, 2 + i, &name, HIGH, &hook_mem, &["hold", "1048576"]);
            (t, vgpu_common::sidecar::path_for(&node.wd.region(&name)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let pid = [trainer.pid()];
    let before = gpu.combined_share(Duration::from_secs(1), &pid);
    // Four containers start claiming 1.2 s apart, each just after the one
    // before has spent a one-second grace.
    let stop = Arc::new(AtomicBool::new(false));
    let measure = {
        std::thread::scope(|s| {
            let m = s.spawn(|| gpu.combined_share(Duration::from_secs(10), &pid));
            let mut claims = Vec::new();
            for (_, sidecar) in &idle {
                claims.push(state_activity(sidecar.clone(), None, stop.clone()));
                std::thread::sleep(Duration::from_millis(1200));
            }
            let after = m.join().expect("measure");
            stop.store(true, Relaxed);
            for c in claims {
                c.join().expect("claimer");
            }
            after
        })
    };
    eprintln!("trainer at 50 %: {before:.1} % before, {measure:.1} % over the 10 s of four claimants in turn");
    assert!(
        before > 40.0,
        "the trainer did not run at its limit: {before:.1} %"
    );
    assert!(
        measure >= 0.85 * before,
        "claimants in turn held the trainer past one grace: {measure:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
}
