//! The simulated device's memory: capacity, sharing between processes, and
//! cleanup when a process exits or is killed.

use std::process::Command;
use std::time::Duration;

use vgpu_tests::sim::{c_program, fields, Running, SimGpu};

const MIB: u64 = 1 << 20;

#[test]
fn memory_runs_out_at_capacity_and_free_makes_room() {
    let gpu = SimGpu::builder().memory("1g").context_bytes("500m").build();
    let tool = c_program("simgpu_tool");
    let out = gpu
        .apply(Command::new(&tool).args([
            "info",
            "fill",
            "104857600",
            "info",
            "free",
            "alloc",
            "104857600",
            "alloc",
            "104857600",
        ]))
        .output()
        .expect("run simgpu_tool");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    // 1 GiB - 500 MiB context = 524 MiB free: five 100 MiB blocks fit.
    assert_eq!(fields(lines[1]), vec![524 * MIB, 1024 * MIB, 0], "{text}");
    assert_eq!(
        fields(lines[2]),
        vec![5, 2],
        "fill: 5 blocks then CUDA_ERROR_OUT_OF_MEMORY: {text}"
    );
    assert_eq!(fields(lines[3]), vec![24 * MIB, 1024 * MIB, 0], "{text}");
    assert_eq!(lines[4], "free 0");
    assert_eq!(lines[5], "alloc 0", "freed room is usable: {text}");
    assert_eq!(lines[6], "alloc 2", "and then full again: {text}");
    // The process exited: everything is back.
    assert!(gpu.wait_for(Duration::from_secs(5), |g| g.used(0) == 0));
}

#[test]
fn processes_see_each_others_usage_until_exit_or_sigkill() {
    let gpu = SimGpu::builder().memory("4g").context_bytes("300m").build();
    let tool = c_program("simgpu_tool");
    let nvml = c_program("simgpu_nvml");
    let read = |args: &[&str]| -> String {
        let out = gpu
            .apply(Command::new(&nvml).args(args))
            .output()
            .expect("run simgpu_nvml");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // A holds 1 GiB + its context.
    let mut a = Running::start(&gpu, &tool, &["alloc", "1073741824", "hold"]);
    assert_eq!(a.line("alloc"), "alloc 0");
    a.line("ready");
    let a_bytes = 1024 * MIB + 300 * MIB;
    assert_eq!(gpu.process(0, a.pid()).map(|p| p.used), Some(a_bytes));

    // B sees it through cuMemGetInfo ...
    let out = gpu
        .apply(Command::new(&tool).arg("info"))
        .output()
        .expect("run B");
    let text = String::from_utf8_lossy(&out.stdout);
    let info = fields(text.lines().nth(1).unwrap_or_default());
    assert_eq!(info[1], 4096 * MIB);
    assert_eq!(
        info[0],
        4096 * MIB - a_bytes - 300 * MIB,
        "B's free counts A and B's own context: {text}"
    );
    // ... and through NVML (v1 and v2), with A in the process list.
    let text = read(&["mem", "procs"]);
    let mem: Vec<Vec<u64>> = text.lines().take(2).map(fields).collect();
    assert_eq!(
        mem[0],
        vec![4096 * MIB, 4096 * MIB - a_bytes, a_bytes],
        "{text}"
    );
    assert_eq!(
        mem[1],
        vec![4096 * MIB, 0, 4096 * MIB - a_bytes, a_bytes],
        "{text}"
    );
    assert!(
        text.contains(&format!("proc {} {}", a.pid(), a_bytes)),
        "{text}"
    );
    assert!(text.contains("procs 1"), "only A holds a context: {text}");

    // A exits normally: its memory is back.
    assert!(a.finish().success());
    assert!(gpu.wait_for(Duration::from_secs(5), |g| g.used(0) == 0));
    assert!(read(&["procs"]).contains("procs 0"));

    // C is SIGKILLed while holding memory: the server frees it.
    let mut c = Running::start(&gpu, &tool, &["alloc", "2147483648", "hold"]);
    c.line("ready");
    let c_pid = c.pid();
    assert_eq!(gpu.used(0), 2048 * MIB + 300 * MIB);
    assert!(read(&["procs"]).contains(&format!("proc {c_pid} ")));
    c.kill();
    assert!(
        gpu.wait_for(Duration::from_secs(5), |g| g.used(0) == 0),
        "SIGKILL releases memory"
    );
    let text = read(&["mem", "procs"]);
    assert!(
        text.contains(&format!("mem {} {} 0", 4096 * MIB, 4096 * MIB)),
        "{text}"
    );
    assert!(text.contains("procs 0"), "{text}");
}

#[test]
fn contexts_cost_memory_until_destroyed() {
    let gpu = SimGpu::builder().memory("2g").context_bytes("700m").build();
    let tool = c_program("simgpu_tool");
    let mut a = Running::start(&gpu, &tool, &["hold"]);
    a.line("ready");
    let mut b = Running::start(&gpu, &tool, &["hold"]);
    b.line("ready");
    assert_eq!(gpu.used(0), 1400 * MIB);
    // A third context does not fit in 2 GiB.
    let out = gpu.apply(&mut Command::new(&tool)).output().expect("run");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "init 2",
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(a.finish().success());
    assert!(b.finish().success());
    assert!(gpu.wait_for(Duration::from_secs(5), |g| g.used(0) == 0));
}
