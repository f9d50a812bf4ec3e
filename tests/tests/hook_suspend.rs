//! Suspend / resume (HAMi's SIGUSR2 / SIGUSR1 protocol) through `vgpu
//! suspend` / `vgpu resume`, and the primary-context reset releasing the
//! allocations it destroys.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_common::region::status;
use vgpu_tests::dist;
use vgpu_tests::hook::{field, run, HookEnv};
use vgpu_tests::wait::eventually;

const M: u64 = 1 << 20;

fn vgpu(args: &[&str]) -> (bool, String) {
    let out = Command::new(dist::vgpu_bin())
        .args(args)
        .output()
        .expect("run vgpu");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn slot_status(env: &HookEnv, pid: u32) -> Option<i32> {
    let f = env.region();
    f.region()
        .active_slots()
        .iter()
        .find(|s| s.pid.load(Ordering::SeqCst) == pid as i32)
        .map(|s| s.status.load(Ordering::SeqCst))
}

/// A program looping allocations and launches stops making progress when
/// `vgpu suspend` signals it (its slot says 2), goes on after `vgpu resume`
/// (slot 1), and its own SIGUSR1 handler is still called.
#[test]
fn suspend_stops_allocations_and_launches_until_resume() {
    let env = HookEnv::new("suspend", "1g").env("SIMGPU_CONTEXT_BYTES", "64m");
    let exe = env.build("hook_suspend");
    let mut child = env
        .hooked(&exe, &["loop"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn hook_suspend");
    let pid = child.id();
    let iter = Arc::new(AtomicU64::new(0));
    let usr1 = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = {
        let (iter, usr1) = (iter.clone(), usr1.clone());
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if line == "ready" {
                    let _ = ready_tx.send(());
                } else if let Some(n) = field(&line, "iter") {
                    iter.store(n, Ordering::SeqCst);
                    usr1.store(field(&line, "usr1").unwrap_or(0), Ordering::SeqCst);
                } else {
                    eprintln!("hook_suspend: {line}");
                }
            }
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("hook_suspend never got ready");
    eventually(Duration::from_secs(10), "progress", || {
        iter.load(Ordering::SeqCst) >= 20
    });

    let region = env.region_path().display().to_string();
    let (ok, out) = vgpu(&["suspend", &region, "--timeout", "5"]);
    assert!(ok, "vgpu suspend: {out}");
    assert_eq!(slot_status(&env, pid), Some(status::SUSPENDED));
    // The iteration in flight may finish; after that nothing moves.
    std::thread::sleep(Duration::from_millis(200));
    let stalled = iter.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        iter.load(Ordering::SeqCst),
        stalled,
        "progress while suspended"
    );
    assert_eq!(slot_status(&env, pid), Some(status::SUSPENDED));

    let (ok, out) = vgpu(&["resume", &region, "--timeout", "5"]);
    assert!(ok, "vgpu resume: {out}");
    assert_eq!(slot_status(&env, pid), Some(status::RUNNING));
    eventually(Duration::from_secs(5), "progress after resume", || {
        iter.load(Ordering::SeqCst) >= stalled + 20
    });
    assert!(
        usr1.load(Ordering::SeqCst) >= 1,
        "the application's own SIGUSR1 handler was not called"
    );

    drop(child.stdin.take());
    let st = child.wait().expect("wait");
    let _ = reader.join();
    assert!(st.success(), "hook_suspend exited with {st}");
}

/// `cuDevicePrimaryCtxReset_v2` destroys the context's allocations in the
/// driver: the hook releases their accounting too, and the re-created
/// context is counted once.
#[test]
fn primary_context_reset_releases_its_allocations() {
    let env = HookEnv::new("reset", "1g").env("SIMGPU_CONTEXT_BYTES", "64m");
    let exe = env.build("hook_suspend");
    let (ok, out, err) = run(env.hooked(&exe, &["reset"]));
    assert!(ok, "{out}{err}");
    let before = field(&out, "before").expect("before");
    let after = field(&out, "after").expect("after");
    assert_eq!(before, 64 * M + 48 * M, "{out}");
    assert_eq!(after, 64 * M, "{out}");
}
