//! `vgpu trace` on the simulated driver (root): real CUDA driver-API
//! programs (`tests/c/bench_launch.c`, `tests/c/daemon_prog.c`) in a PID
//! namespace and child cgroup; the trace's counts must equal what the
//! simulator itself executed, and each context call names its device.

use std::{
    ffi::OsStr,
    io::Read as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use vgpu_tests::wait::poll_until;
use vgpu_tests::{container::Cgroup, daemon::Workdir, dist, sim::SimGpu};

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
    // Whether they all arrive or not, the trace's count is judged below.
    poll_until(Duration::from_secs(10), || {
        gpu.launches(0) >= LAUNCHES + 1000
    });
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

/// `vgpu trace --libcuda <lib> --cgroup <id> ARGS` with the simulator's
/// environment (its NVML names the devices), stdout and stderr to files in
/// `dir`; returns once the probes are attached.
fn start_trace(work: &Workdir, gpu: &SimGpu, cg: &Cgroup, name: &str, args: &[&str]) -> Child {
    let file = |ext: &str| std::fs::File::create(work.path(&format!("{name}.{ext}"))).unwrap();
    let mut child = Command::new(dist::vgpu_bin())
        .arg("trace")
        .arg("--libcuda")
        .arg(work.libcuda())
        .arg("--cgroup")
        .arg(cg.id().to_string())
        .args(args)
        .envs(work.envs(gpu))
        .stdout(file("out"))
        .stderr(file("err"))
        .spawn()
        .unwrap();
    let t = Instant::now();
    let err = work.path(&format!("{name}.err"));
    while !std::fs::read_to_string(&err)
        .unwrap_or_default()
        .contains("Ctrl-C to stop")
    {
        if t.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "vgpu trace did not attach: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Stops a trace with SIGINT; returns its stdout.
fn stop_trace(work: &Workdir, mut child: Child, name: &str) -> String {
    Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(work.path(&format!("{name}.err"))).unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("lost events: 0"), "{err}");
    std::fs::read_to_string(work.path(&format!("{name}.out"))).unwrap()
}

/// Waits until `daemon_prog` has made its context (or failed).
fn wait_note(path: &Path) -> String {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    poll_until(Duration::from_secs(20), || {
        let s = read();
        (s.contains("allocated") || s.contains("error")).then_some(s)
    })
    .unwrap_or_else(read)
}

/// Two simulated devices; one process with `CUDA_VISIBLE_DEVICES=1`, one
/// without, each retaining the primary context of its CUDA ordinal 0: the
/// first is the container's device 1, the second its device 0, in the JSON
/// line and in the table's DEVICES column.
#[test]
fn trace_names_each_context_calls_device() {
    let gpu = SimGpu::builder().devices(2).build();
    let work = Workdir::new("vgpu-trace-dev-", &[]);
    let cg = Cgroup::unique("dev");
    let json_trace = start_trace(&work, &gpu, &cg, "json", &["--json"]);
    let table_trace = start_trace(&work, &gpu, &cg, "table", &["--interval", "0.2"]);

    let envs = work.envs(&gpu);
    let mut procs = Vec::new();
    for visible in [Some("1"), None] {
        let note = work.path(&format!("note-{}", visible.unwrap_or("unset")));
        let mut env: Vec<(&str, &OsStr)> = envs
            .iter()
            .map(|(k, v)| (k.as_str(), OsStr::new(v.as_str())))
            .collect();
        if let Some(v) = visible {
            env.push(("CUDA_VISIBLE_DEVICES", OsStr::new(v)));
        }
        let mut p = cg.spawn(
            &[work.prog.as_os_str(), note.as_os_str(), OsStr::new("0")],
            &env,
        );
        p.send_line("go");
        let got = wait_note(&note);
        assert!(got.contains("allocated"), "daemon_prog: {got}");
        procs.push((p.host_pid(), p));
    }
    // A few table frames while both processes live.
    std::thread::sleep(Duration::from_millis(800));
    let json_out = stop_trace(&work, json_trace, "json");
    let table_out = stop_trace(&work, table_trace, "table");
    let pids: Vec<u32> = procs.iter().map(|(pid, _)| *pid).collect();
    for (_, p) in procs {
        assert!(p.wait().success());
    }

    let events: Vec<Value> = json_out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect();
    let retain = |pid: u32| -> &Value {
        events
            .iter()
            .find(|e| e["host_tgid"] == pid && e["func"] == "cuDevicePrimaryCtxRetain")
            .unwrap_or_else(|| panic!("no cuDevicePrimaryCtxRetain of {pid}:\n{json_out}"))
    };
    let uuid = simgpu::model::device_uuid_string;
    let want = |dev: u32| json!({"device": 0, "device_uuid": uuid(dev), "device_index": dev});
    assert_eq!(retain(pids[0])["args"], want(1), "CUDA_VISIBLE_DEVICES=1");
    assert_eq!(retain(pids[0])["result"], 0);
    assert_eq!(retain(pids[1])["args"], want(0), "no CUDA_VISIBLE_DEVICES");

    let last = &table_out[table_out.rfind("vgpu trace ").unwrap()..];
    let devices = |pid: u32| -> String {
        last.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|c| c.first() == Some(&pid.to_string().as_str()))
            .and_then(|c| c.last().map(|s| s.to_string()))
            .unwrap_or_else(|| panic!("no row for {pid}:\n{last}"))
    };
    // PID NSPID CGROUP CONTAINER COMM ... HELD_BYTES DEVICES
    assert!(
        last.lines().nth(1).unwrap().trim_end().ends_with("DEVICES"),
        "{last}"
    );
    assert_eq!(devices(pids[0]), "1", "{last}");
    assert_eq!(devices(pids[1]), "0", "{last}");
}
