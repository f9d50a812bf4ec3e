//! A tenant attacking the hook through the files it shares: truncating the region or the sidecar
//! under running processes, stalling a process in `exit()`, tampering with
//! `proc_num` and the magic, and two PID namespaces sharing one region.
//! Needs the built artifacts and the simulated GPU (`cargo xtask test`);
//! the namespace test needs root (`unshare --pid`).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use vgpu_common::view::{Access, RegionFile};
use vgpu_tests::hook::{sm_sidecar_path, truncate_file, HookEnv, Running};
use vgpu_tests::sim::SimGpu;

const M: u64 = 1 << 20;
/// CUDA_ERROR_OUT_OF_MEMORY.
const OOM: &str = "rc 2";
const OK: &str = "rc 0";

/// A 1 GiB container whose contexts count 64 MiB each.
fn env(name: &str) -> HookEnv {
    HookEnv::new(name, "1g").env("SIMGPU_CONTEXT_BYTES", "64m")
}

/// Starts `hook_slots args…` and waits for "ready".
fn start(env: &HookEnv, cmd: std::process::Command) -> Running {
    let _ = env;
    let mut p = Running::start(cmd);
    assert_eq!(p.wait_for("ready"), "ready", "hook_slots did not start");
    p
}

/// Sends one command; returns the reply line starting with `reply`.
fn ask(p: &mut Running, line: &str, reply: &str) -> String {
    let stdin = p.child.stdin.as_mut().expect("stdin");
    writeln!(stdin, "{line}").expect("write command");
    stdin.flush().expect("flush");
    p.wait_for(reply)
}

/// Closes stdin (the program leaves its loop) and checks that it exited
/// normally: status 0, no signal.
fn finishes_normally(mut p: Running, what: &str) {
    drop(p.child.stdin.take());
    let st = p.child.wait().expect("wait");
    assert_eq!(st.signal(), None, "{what}: killed by signal ({st})");
    assert_eq!(st.code(), Some(0), "{what}: {st}");
}

/// A sibling truncates the container's region under a running process: the
/// process is not killed (SIGBUS), keeps its limit and its own usage, and
/// exits normally.
#[test]
fn a_truncated_region_kills_nobody_and_the_limit_holds() {
    let env = env("trunc-region");
    let exe = env.build("hook_slots");
    let mut a = start(&env, env.hooked(&exe, &[]));
    assert!(ask(&mut a, &format!("alloc {}", 600 * M), "alloc").ends_with(OK));
    truncate_file(&env.region_path());
    // 64 MiB context + 600 MiB held: another 600 MiB passes 1 GiB.
    let r = ask(&mut a, &format!("alloc {}", 600 * M), "alloc");
    assert!(r.ends_with(OOM), "after the truncation: {r:?}");
    assert!(ask(&mut a, &format!("alloc {}", 100 * M), "alloc").ends_with(OK));
    let info = ask(&mut a, "info", "info");
    assert!(info.contains(&format!("total {}", 1u64 << 30)), "{info}");
    finishes_normally(a, "process whose region was truncated");
}

/// A sibling truncates the container's sidecar and region, while
/// SM-limited processes of two containers launch: both keep running, each
/// still within its limit (every process re-attaches the files), and exit
/// normally.
#[test]
fn sm_limited_processes_survive_a_truncated_sidecar_and_region() {
    let gpu = SimGpu::new();
    let (a, b) = (env("trunc-sm-a"), env("trunc-sm-b"));
    let exe = a.build("sm_loop");
    let run = |e: &HookEnv, limit: &str| {
        let mut c = e.hooked(&exe, &["kernel", "busy_500us", "4"]);
        gpu.apply(&mut c);
        c.env("CUDA_DEVICE_SM_LIMIT", limit)
            .env("GPU_CORE_UTILIZATION_POLICY", "force");
        start(e, c)
    };
    let mut pa = run(&a, "30");
    let mut pb = run(&b, "40");
    std::thread::sleep(Duration::from_millis(500));
    let sidecar = sm_sidecar_path(&a.region_path());
    truncate_file(&sidecar);
    std::thread::sleep(Duration::from_millis(300));
    truncate_file(&b.region_path());
    std::thread::sleep(Duration::from_millis(300));
    let shares = gpu.process_shares(Duration::from_secs(1), &[pa.child.id(), pb.child.id()]);
    eprintln!("after the truncations: {shares:?} % (limits 30, 40)");
    for (share, limit) in shares.iter().zip([30.0, 40.0]) {
        // Above the limit only by the limiter's own tolerance; alive, too
        // (the bound is loose: the host may be busy).
        assert!(
            (1.0..=limit + 10.0).contains(share),
            "share {share:.1} % at limit {limit}"
        );
    }
    for (p, what) in [(&mut pa, "container a"), (&mut pb, "container b")] {
        let l = p.wait_for("launches");
        assert!(l.starts_with("launches"), "{what} stopped early: {l:?}");
    }
    finishes_normally(pa, "container a");
    finishes_normally(pb, "container b");
}

/// A process whose `exit()` is stalled in an exit handler still holds its
/// memory: it stays counted, so a sibling cannot take that memory, and a
/// thread of the exiting process is still limited. Once it is dead, its
/// slot is reclaimed and the memory is the sibling's to use.
#[test]
fn a_process_stalled_in_exit_stays_counted_until_dead() {
    let env = env("exit-window");
    let exe = env.build("hook_slots");
    let mut a = start(&env, env.hooked(&exe, &["stall"]));
    assert!(ask(&mut a, &format!("alloc {}", 600 * M), "alloc").ends_with(OK));
    assert_eq!(ask(&mut a, "exit", "stalled"), "stalled");
    let late = ask(&mut a, &format!("thread {}", 600 * M), "thread");
    assert!(late.ends_with(OOM), "a thread during exit: {late:?}");
    let mut b = start(&env, env.hooked(&exe, &[]));
    let r = ask(&mut b, &format!("alloc {}", 600 * M), "alloc");
    assert!(r.ends_with(OOM), "sibling while a is exiting: {r:?}");
    let a_pid = a.child.id() as i32;
    ask(&mut a, "return", "");
    finishes_normally(a, "stalled process");
    // Dead now: the sibling's refused reservation reclaims its slot.
    let r = ask(&mut b, &format!("alloc {}", 600 * M), "alloc");
    assert!(r.ends_with(OK), "sibling after a died: {r:?}");
    let f = env.region();
    let left = f
        .region()
        .procs
        .iter()
        .filter(|s| s.pid.load(SeqCst) == a_pid)
        .count();
    assert_eq!(left, 0, "the dead process's slot was not reclaimed");
    finishes_normally(b, "sibling");
}

/// A process that exits normally leaves no stale slot behind for long: a
/// sibling's `cuMemGetInfo` reclaims it and shows the memory free again.
#[test]
fn a_normal_exit_is_reclaimed_by_a_sibling_query() {
    let env = env("exit-normal");
    let exe = env.build("hook_slots");
    let mut b = start(&env, env.hooked(&exe, &[]));
    let mut a = start(&env, env.hooked(&exe, &[]));
    assert!(ask(&mut a, &format!("alloc {}", 600 * M), "alloc").ends_with(OK));
    let a_pid = a.child.id() as i32;
    finishes_normally(a, "exiting process");
    let info = ask(&mut b, "info", "info");
    let free = vgpu_tests::hook::field(&info, "free").expect("free");
    assert_eq!(free, (1 << 30) - 64 * M, "{info}");
    let f = env.region();
    assert!(
        !f.region().procs.iter().any(|s| s.pid.load(SeqCst) == a_pid),
        "stale slot of pid {a_pid}"
    );
    finishes_normally(b, "sibling");
}

/// Lowering `proc_num` to 0 and zeroing the magic does not let the next
/// process take a live slot: the live process's usage still counts.
#[test]
fn a_lowered_proc_num_and_zeroed_magic_do_not_erase_a_live_slot() {
    let env = env("procnum");
    let exe = env.build("hook_slots");
    let mut a = start(&env, env.hooked(&exe, &[]));
    assert!(ask(&mut a, &format!("alloc {}", 600 * M), "alloc").ends_with(OK));
    {
        let f = RegionFile::open(&env.region_path(), Access::ReadWrite).expect("open region");
        f.region().proc_num.store(0, SeqCst);
        f.region().initialized_flag.store(0, SeqCst);
    }
    let mut b = start(&env, env.hooked(&exe, &[]));
    let r = ask(&mut b, &format!("alloc {}", 600 * M), "alloc");
    assert!(r.ends_with(OOM), "a's 600 MiB vanished: {r:?}");
    finishes_normally(a, "a");
    finishes_normally(b, "b");
}

/// Two PID namespaces sharing one region, each process PID 1 in its own:
/// two slots, each with its own usage, and the limit counts both.
#[test]
fn two_pid_namespaces_sharing_a_region_keep_their_own_slots() {
    let env = env("pidns");
    let exe = env.build("hook_slots");
    let exe = exe.to_str().expect("utf-8 path");
    let ns = || {
        let args = ["--pid", "--fork", "--mount-proc", exe];
        start(&env, env.hooked(Path::new("unshare"), &args))
    };
    let mut a = ns();
    assert!(ask(&mut a, &format!("alloc {}", 300 * M), "alloc").ends_with(OK));
    let mut b = ns();
    assert!(ask(&mut b, &format!("alloc {}", 300 * M), "alloc").ends_with(OK));
    {
        let f = env.region();
        let ones: Vec<u64> = f
            .region()
            .procs
            .iter()
            .filter(|s| s.pid.load(SeqCst) == 1)
            .map(|s| s.used[0].total.load(SeqCst))
            .collect();
        assert_eq!(ones, vec![364 * M, 364 * M], "slots of PID 1");
    }
    // 2 × 364 MiB in use: 400 MiB more passes 1 GiB.
    let r = ask(&mut b, &format!("alloc {}", 400 * M), "alloc");
    assert!(
        r.ends_with(OOM),
        "the other namespace's usage vanished: {r:?}"
    );
    finishes_normally(a, "namespace a");
    finishes_normally(b, "namespace b");
}
