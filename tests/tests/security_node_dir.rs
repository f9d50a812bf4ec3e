//! What another tenant puts in the node's shared directory (HAMi's
//! `/tmp/vgpulock`, every GPU container's to write) in place of vgpu's
//! table: a symlink to a file of the victim's, a dangling symlink, a FIFO.
//! The victim's hooked process neither follows, chmods, resizes nor creates
//! through it, and is not held up by it. Needs the built artifacts and the
//! simulated GPU (`cargo xtask test`).

use std::os::unix::fs::{symlink, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_tests::hook::{HookEnv, Running};
use vgpu_tests::sim::SimGpu;

/// Runs an SM-limited `sm_loop` for `seconds` in `env`'s container on
/// `gpu`, pointed at the node directory as hooks before the daemon's plan
/// were (`VGPU_SM_NODE_DIR`), to its end; how long it took.
fn limited_run(env: &HookEnv, gpu: &SimGpu, seconds: &str) -> Duration {
    let exe = env.build("sm_loop");
    let mut c = env.hooked(&exe, &["kernel", "busy_200us", seconds]);
    gpu.apply(&mut c);
    c.env("VGPU_SM_NODE_DIR", gpu.dir().join("node"));
    c.env("CUDA_DEVICE_SM_LIMIT", "50")
        .env("GPU_CORE_UTILIZATION_POLICY", "force");
    let t = Instant::now();
    let mut r = Running::start(c);
    assert_eq!(r.wait_for("ready"), "ready", "sm_loop did not start");
    let status = r.child.wait().expect("wait for sm_loop");
    assert!(status.success(), "sm_loop: {status}");
    t.elapsed()
}

/// The path of the GPU's node table as hooks before the daemon's plan
/// named it, in the node directory, for another tenant to put something
/// there.
fn table_path(gpu: &SimGpu) -> PathBuf {
    let node = gpu.dir().join("node");
    std::fs::create_dir_all(&node).expect("node dir");
    node.join("vgpu-sm-GPU-516d6770-7500-4000-8000-000000000000")
}

/// Mode, size and content of `p`, not following a symlink.
fn state(p: &Path) -> (u32, u64, Vec<u8>) {
    let md = std::fs::symlink_metadata(p).expect("stat");
    let content = if md.file_type().is_file() {
        std::fs::read(p).expect("read")
    } else {
        Vec::new()
    };
    (md.mode() & 0o7777, md.len(), content)
}

#[test]
fn a_symlinked_node_table_is_not_followed_and_nothing_is_created_through_it() {
    let gpu = SimGpu::new();
    let table = table_path(&gpu);
    let victim_dir = tempfile::tempdir().expect("temp dir");
    let victim = victim_dir.path().join("shadow");
    std::fs::write(&victim, b"root:$6$secret:19000::::::\n").expect("write victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let before = state(&victim);
    symlink(&victim, &table).expect("symlink");
    let env = HookEnv::new("nodedir-symlink", "0");
    limited_run(&env, &gpu, "0.5");
    let after = state(&victim);
    assert!(
        after == before,
        "the victim's file was changed: mode {:o} and {} bytes, from {:o} and {}",
        after.0,
        after.1,
        before.0,
        before.1
    );
    assert!(std::fs::symlink_metadata(&table)
        .expect("the link")
        .file_type()
        .is_symlink());

    // A dangling link: the victim's process must not create its target.
    std::fs::remove_file(&table).expect("remove link");
    let target = victim_dir.path().join("made-through-the-link");
    symlink(&target, &table).expect("symlink");
    limited_run(&env, &gpu, "0.5");
    assert!(!target.exists(), "a file was created through the link");
}

#[test]
fn a_fifo_in_place_of_the_node_table_holds_nothing_up_and_is_left_alone() {
    let gpu = SimGpu::new();
    let table = table_path(&gpu);
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(&table)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let env = HookEnv::new("nodedir-fifo", "0");
    let took = limited_run(&env, &gpu, "0.5");
    assert!(took < Duration::from_secs(10), "the run took {took:?}");
    let (mode, _, _) = state(&table);
    assert!(mode == 0o600, "the FIFO's mode was changed to {mode:o}");
}
