//! `vgpu trace` on the simulated driver (root): a real CUDA driver-API
//! program (`tests/c/bench_launch.c`) in a PID namespace and child cgroup;
//! the trace's counts must equal what the simulator itself executed.

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use vgpu_tests::{container::Cgroup, dist, sim::SimGpu};

#[test]
fn trace_counts_match_the_simulator() {
    const LAUNCHES: u64 = 3000; // plus 1000 warm-up launches in the program
    const PAIRS: u64 = 30; // plus 50 warm-up alloc/free pairs
    let gpu = SimGpu::new();
    let tmp = tempfile::tempdir().unwrap();
    let exe = dist::compile_c("bench_launch", tmp.path(), false);
    let lib = gpu.lib_dir().join("libcuda.so.1");
    let cg = Cgroup::unique("sim");

    let mut trace = Command::new(dist::vgpu_bin())
        .args(["trace", "--interval", "0.5", "--cgroup"])
        .arg(cg.id().to_string())
        .arg("--libcuda")
        .arg(&lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attached once the first table is printed.
    let mut out = trace.stdout.take().unwrap();
    let mut first = [0u8; 10];
    out.read_exact(&mut first)
        .expect("vgpu trace printed nothing");

    let envs = gpu.envs();
    let envs: Vec<(&str, &std::ffi::OsStr)> = envs
        .iter()
        .map(|(k, v)| (k.as_str(), std::ffi::OsStr::new(v.as_str())))
        .collect();
    let p = cg.spawn(
        &[
            exe.as_os_str(),
            std::ffi::OsStr::new(&LAUNCHES.to_string()),
            std::ffi::OsStr::new(&PAIRS.to_string()),
        ],
        &envs,
    );
    let host_pid = p.host_pid();
    assert!(p.wait().success(), "bench_launch failed");
    let t = Instant::now();
    while gpu.launches(0) < LAUNCHES + 1000 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill")
        .arg("-INT")
        .arg(trace.id().to_string())
        .status()
        .unwrap();
    let mut text = String::from_utf8_lossy(&first).into_owned();
    out.read_to_string(&mut text).unwrap();
    let status = trace.wait().unwrap();
    let mut err = String::new();
    trace
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("lost events: 0"), "{err}");

    let last = &text[text.rfind("vgpu trace ").unwrap()..];
    let row: Vec<&str> = last
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&host_pid.to_string().as_str()))
        .unwrap_or_else(|| panic!("no row for {host_pid}:\n{last}"));
    // PID NSPID CGROUP CONTAINER COMM LAUNCH/s GRAPH/s LAUNCHES GRAPHS ALLOCS FREES HELD_BYTES
    assert_eq!(row[1], "1", "{last}");
    assert_eq!(
        row[7],
        gpu.launches(0).to_string(),
        "simulator's count:\n{last}"
    );
    assert_eq!(row[7], (LAUNCHES + 1000).to_string(), "{last}");
    assert_eq!(row[9], (PAIRS + 50).to_string(), "allocs:\n{last}");
    assert_eq!(row[10], (PAIRS + 50).to_string(), "frees:\n{last}");
    assert_eq!(row[11], "0", "held bytes:\n{last}");
}
