//! The simulator survives what real programs do: being killed inside the
//! shared lock, the server going idle, bad configuration, and a server
//! started from inside a container.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vgpu_tests::sim::{c_program, Running, SimGpu};
use vgpu_tests::wait::eventually;

#[test]
fn process_killed_holding_the_lock_does_not_wedge_others() {
    let gpu = SimGpu::new();
    let tool = c_program("simgpu_tool");
    let mut a = Running::start(&gpu, &tool, &["hold"]);
    a.line("ready");
    let slot = gpu.process(0, a.pid()).expect("A registered").slot;
    // Pretend A was SIGKILLed in the middle of a critical section.
    let lock = &gpu.shm().shared().header.lock;
    lock.store(slot + 1, Ordering::SeqCst);
    // B's cuInit charges its context, which needs the lock.
    let mut b = Running::start(&gpu, &tool, &["alloc", "1048576", "info"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        b.child.try_wait().expect("try_wait").is_none(),
        "B waits for the lock"
    );
    a.kill();
    let t = Instant::now();
    assert_eq!(b.line("init"), "init 0");
    assert_eq!(b.line("alloc"), "alloc 0");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(b.finish().success());
    assert_eq!(lock.load(Ordering::SeqCst), 0);
}

fn sim_cmd(dir: &std::path::Path, program: &std::path::Path) -> Command {
    let lib = vgpu_tests::dist::sim_dir();
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", &lib)
        .env("SIMGPU_DIR", dir)
        .env("SIMGPU_SERVER", lib.join("simgpu-server"));
    c
}

#[test]
fn idle_server_exits_and_restarts_on_demand() {
    let dir = std::path::PathBuf::from(format!("/tmp/simgpu-idle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tool = c_program("simgpu_tool");
    let run = || {
        let out = sim_cmd(&dir, &tool)
            .env("SIMGPU_IDLE_EXIT_MS", "300")
            .arg("info")
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(dir.join("server.pid")).expect("server.pid")
    };
    let first = run();
    let sock = dir.join("simgpu.sock");
    eventually(
        Duration::from_secs(5),
        "the idle server to remove its socket and exit",
        || !sock.exists(),
    );
    assert!(!dir.join("server.pid").exists());
    let second = run();
    assert_ne!(first, second, "a new server was started");
    let pid: i32 = second.trim().parse().expect("pid");
    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_configuration_fails_fast_with_a_message() {
    let dir = std::path::PathBuf::from(format!("/tmp/simgpu-badcfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let t = Instant::now();
    let out = sim_cmd(&dir, &c_program("simgpu_tool"))
        .env("SIMGPU_MEMORY", "1gb")
        .output()
        .expect("run");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "init 100",
        "CUDA_ERROR_NO_DEVICE"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SIMGPU_MEMORY") && err.contains("1gb"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_started_inside_a_pid_namespace_warns() {
    let dir = std::path::PathBuf::from(format!("/tmp/simgpu-nsserver-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tool = c_program("simgpu_tool");
    let out = sim_cmd(&dir, std::path::Path::new("unshare"))
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(&tool)
        .arg("pid")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    assert!(
        log.contains("WARNING") && log.contains("PID namespace"),
        "{log}"
    );
    // The server died with the namespace's init; nothing to clean but files.
    let _ = std::fs::remove_dir_all(&dir);
}
