//! PIDs in PID namespaces (containers) as the real driver (R580) reports
//! them: host callers see host PIDs; a caller inside a container sees its
//! own namespace's processes with their namespace PIDs, and nothing else.

use std::path::Path;
use std::process::Command;

use vgpu_tests::dist;
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

const M: u64 = 1 << 20;
const CTX: u64 = 100 * M;

/// `CUDA_DEVICE_MEMORY_*` of a hooked container with its own region.
fn hooked(cmd: &mut Command, region: &Path, limit: &str) {
    cmd.env("LD_PRELOAD", dist::hook_lib())
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit);
}

/// `simgpu_tool alloc BYTES [launch busy_1000us 100] pid hold` started by
/// `launcher` (unshare or nsenter); returns it running with its (namespace
/// pid, host pid).
fn holder(
    gpu: &SimGpu,
    mut launcher: Command,
    bytes: u64,
    busy: bool,
    hook: Option<(&Path, &str)>,
) -> (Running, u64, u32) {
    launcher
        .arg(c_program("simgpu_tool"))
        .args(["alloc", &bytes.to_string()]);
    if busy {
        launcher.args(["launch", "busy_1000us", "100"]);
    }
    launcher.args(["pid", "hold"]);
    if let Some((region, limit)) = hook {
        hooked(&mut launcher, region, limit);
    }
    let mut r = Running::start_cmd(gpu, &mut launcher);
    assert_eq!(r.line("alloc"), "alloc 0");
    let f = fields(&r.line("pid"));
    r.line("ready");
    (r, f[0], f[1] as u32)
}

/// What `simgpu_nvml mem procs putil 1500000` prints: the memory line, the
/// listed `(pid, bytes)` and the PIDs of the utilization samples.
struct NvmlView {
    mem: Vec<u64>,
    procs: Vec<(u64, u64)>,
    sampled: Vec<u64>,
}

/// [`NvmlView`] from inside the PID namespace of host pid `target` (or on
/// the host for `None`).
fn nvml_view(gpu: &SimGpu, target: Option<u32>, hook: Option<(&Path, &str)>) -> NvmlView {
    let client = c_program("simgpu_nvml");
    let mut cmd = match target {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.args(["--target", &pid.to_string(), "--pid", "--"])
                .arg(client);
            c
        }
        None => Command::new(client),
    };
    cmd.args(["mem", "procs", "putil", "1500000"]);
    if let Some((region, limit)) = hook {
        hooked(&mut cmd, region, limit);
    }
    let out = gpu.apply(&mut cmd).output().expect("run simgpu_nvml");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mem = text
        .lines()
        .find(|l| l.starts_with("mem "))
        .map(fields)
        .unwrap_or_default();
    let n = text
        .lines()
        .find(|l| l.starts_with("procs "))
        .map(|l| fields(l)[0])
        .unwrap_or_else(|| panic!("no procs line: {text}"));
    let mut procs: Vec<(u64, u64)> = text
        .lines()
        .filter(|l| l.starts_with("proc "))
        .map(|l| {
            let f = fields(l);
            (f[0], f[1])
        })
        .collect();
    assert_eq!(procs.len() as u64, n, "{text}");
    procs.sort();
    let mut sampled: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("sample "))
        .map(|l| fields(l)[0])
        .collect();
    sampled.sort();
    NvmlView {
        mem,
        procs,
        sampled,
    }
}

#[test]
fn nvml_inside_a_container_lists_its_own_processes_with_namespace_pids() {
    let gpu = SimGpu::builder().memory("8g").context_bytes("100m").build();
    let dir = tempfile::tempdir().unwrap();
    let region_a = dir.path().join("a.cache");
    let unshare = || {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc"]);
        c
    };
    // Container A (hooked, 1 GiB): two processes, the first ran kernels.
    // Container B (no hook): one, idle. And a process on the host that ran
    // kernels.
    let (a1, a1_ns, a1_host) = holder(&gpu, unshare(), M, true, Some((&region_a, "1g")));
    let mut enter_a = Command::new("nsenter");
    enter_a.args(["--target", &a1_host.to_string(), "--pid", "--"]);
    let (a2, a2_ns, a2_host) = holder(&gpu, enter_a, 2 * M, false, Some((&region_a, "1g")));
    let (b, b_ns, b_host) = holder(&gpu, unshare(), 3 * M, false, None);
    let (h, h_pid, h_host) = holder(&gpu, Command::new("env"), 4 * M, true, None);
    assert_eq!((a1_ns, b_ns), (1, 1));
    assert_ne!(a2_ns, 1);
    assert_eq!(h_pid, u64::from(h_host));

    // From the host: everyone, by host PID.
    let host = nvml_view(&gpu, None, None);
    let all = host.procs;
    let mut expect = vec![
        (u64::from(a1_host), CTX + M),
        (u64::from(a2_host), CTX + 2 * M),
        (u64::from(b_host), CTX + 3 * M),
        (u64::from(h_host), CTX + 4 * M),
    ];
    expect.sort();
    assert_eq!(all, expect);
    let mut busy = vec![u64::from(a1_host), u64::from(h_host)];
    busy.sort();
    assert_eq!(host.sampled, busy, "utilization samples on the host");

    // Inside A, with and without the hook: exactly A's two processes,
    // namespace PIDs, the driver's memory figures.
    let a_expect = {
        let mut v = vec![(a1_ns, CTX + M), (a2_ns, CTX + 2 * M)];
        v.sort();
        v
    };
    let plain = nvml_view(&gpu, Some(a1_host), None);
    assert_eq!(plain.procs, a_expect, "inside A, no hook");
    assert_eq!(plain.sampled, [1], "utilization samples inside A");
    let hooked_a = nvml_view(&gpu, Some(a1_host), Some((&region_a, "1g")));
    assert_eq!(hooked_a.procs, a_expect, "inside A, under the hook");
    assert_eq!(
        hooked_a.sampled,
        [1],
        "utilization samples inside A, hooked"
    );
    let mem = hooked_a.mem;
    // ...while the device's memory shows the container's limit and usage.
    assert_eq!(
        mem[0],
        1 << 30,
        "total under the hook is the limit: {mem:?}"
    );
    assert_eq!(
        mem[2],
        2 * CTX + 3 * M,
        "used under the hook is the container's: {mem:?}"
    );

    // Inside B: only B's process; B ran nothing, so no sample at all.
    let in_b = nvml_view(&gpu, Some(b_host), None);
    assert_eq!(in_b.procs, vec![(1, CTX + 3 * M)], "inside B");
    assert!(in_b.sampled.is_empty(), "inside B: {:?}", in_b.sampled);
    let in_b_hooked = nvml_view(
        &gpu,
        Some(b_host),
        Some((&dir.path().join("b.cache"), "2g")),
    );
    assert_eq!(
        in_b_hooked.procs,
        vec![(1, CTX + 3 * M)],
        "inside B, under the hook"
    );

    // A's second process first: its namespace ends with A's PID 1.
    for r in [a2, a1, b, h] {
        assert!(r.finish().success());
    }
}
