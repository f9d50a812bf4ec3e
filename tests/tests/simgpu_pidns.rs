//! Like the real driver, the simulator reports *host* PIDs for processes in
//! PID namespaces (containers).

use std::process::Command;

use vgpu_tests::sim::{c_program, fields, Running, SimGpu};

#[test]
fn process_in_pid_namespace_is_listed_with_its_host_pid() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("100m").build();
    let tool = c_program("simgpu_tool");
    let mut inner = Running::start_cmd(
        &gpu,
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc"])
            .arg(&tool)
            .args(["alloc", "1048576", "pid", "hold"]),
    );
    assert_eq!(inner.line("alloc"), "alloc 0");
    let pid_line = inner.line("pid");
    let f = fields(&pid_line);
    let (ns_pid, host_pid) = (f[0], f[1] as u32);
    assert_eq!(ns_pid, 1, "getpid() inside the namespace: {pid_line}");
    assert_ne!(host_pid, 1);
    inner.line("ready");

    // The pid the host sees for that process: NSpid lists host pid then 1.
    let status =
        std::fs::read_to_string(format!("/proc/{host_pid}/status")).expect("host /proc entry");
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .unwrap_or_default();
    assert_eq!(
        nspid.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec![host_pid.to_string(), "1".to_string()],
        "{nspid}"
    );
    let exe = std::fs::read_link(format!("/proc/{host_pid}/exe")).expect("exe");
    assert_eq!(exe, tool);

    // NVML (from the host) lists it by host pid, with its memory.
    let out = gpu
        .apply(Command::new(c_program("simgpu_nvml")).arg("procs"))
        .output()
        .expect("run simgpu_nvml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("procs 1"), "{text}");
    assert!(
        text.contains(&format!("proc {host_pid} {}", (100 << 20) + (1 << 20))),
        "{text}"
    );
    let p = gpu.process(0, host_pid).expect("slot by host pid");
    assert_eq!(p.ns_pid, 1);
    assert!(inner.finish().success());
}
