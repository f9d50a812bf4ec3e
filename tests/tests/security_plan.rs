//! What a container writes into its own sidecar's plan line (its statement
//! of activity) holds a neighbour back only as long as the kernel's view
//! supports it: a priority-0 container that stays idle while claiming to
//! launch, refreshed every 10 ms, holds a lower-priority neighbour for the
//! daemon's one-second grace at most, then not at all. The daemon, the
//! hook and the simulated GPU are real; the kubelet and containerd are
//! stand-ins (`vgpu_tests::planned`). Needs the built artifacts (`cargo
//! xtask test`).

use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use vgpu_common::sidecar::{plan_at, OWN_WORDS_AT};
use vgpu_tests::planned::PlannedNode;
use vgpu_tests::sim::SimGpu;

#[test]
fn an_idle_priority_0_container_claiming_activity_holds_no_neighbour_past_the_grace() {
    let gpu = SimGpu::new();
    let node = PlannedNode::start("plan-idle", &gpu);
    let out = node.wd.path("out");
    let sm_loop = vgpu_tests::dist::compile_c("sm_loop", &out, false);
    let hook_mem = vgpu_tests::dist::compile_c("hook_mem", &out, false);
    // Where hooks before the daemon's plan met (their node directory).
    let old_dir = node.wd.path("vgpulock");
    std::fs::create_dir_all(&old_dir).expect("node dir");
    let old_dir_s = old_dir.display().to_string();
    let trainer = node.run(
        &gpu,
        1,
        "trainer",
        &[
            ("CUDA_DEVICE_SM_LIMIT", "50"),
            ("GPU_CORE_UTILIZATION_POLICY", "force"),
            ("VGPU_SM_NODE_DIR", &old_dir_s),
        ],
        &sm_loop,
        &["kernel", "busy_200us", "9"],
    );
    // The service: priority 0, a context and memory, and no launch.
    let _idle = node.run(
        &gpu,
        2,
        "idle",
        &[
            ("CUDA_TASK_PRIORITY", "0"),
            ("VGPU_SM_NODE_DIR", &old_dir_s),
        ],
        &hook_mem,
        &["hold", "1048576"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let pid = [trainer.pid()];
    let before = gpu.combined_share(Duration::from_secs(1), &pid);

    // Its own sidecar says it launches now and has 50 ms in flight, every
    // 10 ms; so does its member of the old table.
    let sidecar = vgpu_common::sidecar::path_for(&node.wd.region("idle"));
    let stop = Arc::new(AtomicBool::new(false));
    let claim = {
        let stop = stop.clone();
        let table = old_dir.join("vgpu-sm-GPU-516d6770-7500-4000-8000-000000000000");
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&sidecar)
                .expect("the idle container's sidecar");
            while !stop.load(Relaxed) {
                let now = simgpu::clock::mono_ns();
                let mut w = [0u8; 24];
                w[0..8].copy_from_slice(&now.to_le_bytes());
                w[16..24].copy_from_slice(&(now + 50_000_000).to_le_bytes());
                let _ = f.write_all_at(&w, plan_at(0) + OWN_WORDS_AT as u64);
                vgpu_tests::planned::forge_old_table(&table, 0x5eed_0000_0000_0001, now);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let after = gpu.combined_share(Duration::from_secs(2), &pid);
    stop.store(true, Relaxed);
    claim.join().expect("claimer");
    eprintln!(
        "trainer at 50 %: {before:.1} % before the idle service's claims, {after:.1} % from 1.5 s after"
    );
    assert!(
        before > 40.0,
        "the trainer did not run at its limit: {before:.1} %"
    );
    assert!(
        after >= 0.9 * before,
        "an idle container's claims held the trainer: {after:.1} % against {before:.1} %\n{}",
        node.daemon.log_text()
    );
}
