//! The memory limit through every counted entry point, memory info under a
//! limit, and environment errors. Needs the built artifacts and the
//! simulated GPU (`cargo xtask test`).

use std::sync::atomic::Ordering::SeqCst;

use vgpu_tests::hook::{field, run, HookEnv, Running};
use vgpu_tests::sim::SimGpu;

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

/// With a 1 GiB limit, each entry point succeeds at exactly the limit
/// (context included), returns CUDA_ERROR_OUT_OF_MEMORY one byte past it,
/// and leaks nothing (see `limit()` in tests/c/hook_mem.c).
#[test]
fn limit_is_exact_for_every_counted_entry_point() {
    let env = HookEnv::new("limits", "1g");
    let exe = env.build("hook_mem");
    let mut failures = Vec::new();
    for entry in [
        "alloc", "pitch", "managed", "create", "async", "pool", "array", "mipmap", "graph",
    ] {
        let (ok, out, err) = run(env.hooked(&exe, &["limit", entry]));
        if !ok || !out.contains(&format!("PASS {entry}")) {
            failures.push(format!("{entry}:\n{out}{err}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An IPC import is counted at its real size (the exporter runs in another
/// region, without a limit).
#[test]
fn ipc_import_is_counted() {
    let env = HookEnv::new("ipc", "1g");
    let exe = env.build("hook_mem");
    let exporter_env = HookEnv::new("ipc-exporter", "0");
    let mut exporter = exporter_env.hooked(&exe, &["ipc_export", "4194304"]);
    exporter.env("SIMGPU_DIR", env.dir.join("sim"));
    let mut exporter = Running::start(exporter);
    let handle = exporter.line();
    assert_eq!(handle.len(), 128, "exporter printed {handle:?}");
    let (ok, out, err) = run(env.hooked(&exe, &["limit", "ipc", &handle]));
    assert!(ok && out.contains("PASS ipc"), "{out}{err}");
}

/// cuDeviceTotalMem and cuMemGetInfo show the limit; the context is counted.
#[test]
fn memory_info_shows_the_limit_and_counts_the_context() {
    let env = HookEnv::new("info", "1g");
    let exe = env.build("hook_mem");
    let (ok, out, err) = run(env.hooked(&exe, &["info"]));
    assert!(ok, "{out}{err}");
    assert_eq!(field(&out, "devtotal"), Some(G), "{out}");
    assert_eq!(field(&out, "meminfo total"), Some(G), "{out}");
    let free = field(&out, "free").expect("free");
    // The simulated context costs 500 MiB by default.
    assert_eq!(free, G - 500 * M, "{out}");
}

/// GPU code loaded after the context (lazily loaded kernels) takes device
/// memory no allocation call passes through: NVML's line for the process
/// shows it. While the process then makes no CUDA call at all (a training
/// loop whose caching allocator no longer calls the driver), its slot comes
/// to what the driver charges it within 2.5 s, within NVML's rounding; memory
/// info and the limit count it. Of 1 GiB, 100 MiB of context and 96 of code
/// leave 828, and 900 MiB more does not fit (without counting the code it
/// would).
#[test]
fn gpu_code_loaded_after_the_context_is_counted_while_the_process_is_idle() {
    use std::io::Write;
    use std::time::Duration;
    let gpu = SimGpu::builder().memory("4g").context_bytes("100m").build();
    let mut env = HookEnv::new("module", "1g").env("SIMGPU_MODULE_BYTES", "96m");
    for (k, v) in gpu.envs() {
        env = env.env(&k, &v);
    }
    let exe = env.build("hook_mem");
    let mut p = Running::start(env.hooked(&exe, &["module", &(900 * M).to_string(), "idle"]));
    assert_eq!(p.wait_for("loaded"), "loaded");
    std::thread::sleep(Duration::from_millis(2500));
    let pid = p.child.id();
    let driver = gpu.process(0, pid).map(|i| i.used);
    let region = env.region();
    let r = region.region();
    let slot = r
        .active_slots()
        .iter()
        .find(|s| s.pid.load(SeqCst) == pid as i32)
        .map(|s| s.used[0].total.load(SeqCst));
    assert_eq!(driver, Some(196 * M), "the simulated driver's charge");
    let (Some(slot), Some(driver)) = (slot, driver) else {
        panic!("no slot for pid {pid}");
    };
    assert!(
        slot.abs_diff(driver) <= 2 * M,
        "slot {} MiB, the driver charges {} MiB",
        slot >> 20,
        driver >> 20
    );
    p.child
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("write to the program");
    let out: String = std::iter::from_fn(|| Some(p.line()).filter(|l| !l.is_empty()))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(field(&out, "module rc"), Some(0), "{out}");
    assert_eq!(field(&out, "free"), Some(G - 196 * M), "{out}");
    assert_eq!(
        field(&out, "alloc rc"),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY: {out}"
    );
}

/// Destroying a context frees its allocations: the hook releases them, so
/// the memory is usable again under the limit.
#[test]
fn a_destroyed_context_gives_its_memory_back() {
    let env = HookEnv::new("ctxdestroy", "2g");
    let exe = env.build("hook_mem");
    let (ok, out, err) = run(env.hooked(&exe, &["ctxdestroy"]));
    assert!(ok && out.contains("PASS ctxdestroy"), "{out}{err}");
    // The simulated context costs 500 MiB: 2 GiB - 500 MiB free before and after.
    assert_eq!(
        field(&out, "PASS ctxdestroy free"),
        Some(2 * G - 500 * M),
        "{out}"
    );
}

/// Without a limit the driver's values come back; cuDeviceTotalMem is never 0.
#[test]
fn no_limit_means_physical_values() {
    let env = HookEnv::new("nolimit", "0");
    let exe = env.build("hook_mem");
    let (ok, out, err) = run(env.hooked(&exe, &["info"]));
    assert!(ok, "{out}{err}");
    let (_, plain, _) = run(env.unhooked(&exe, &["info"]));
    assert_eq!(
        field(&out, "devtotal"),
        field(&plain, "devtotal"),
        "{out} vs {plain}"
    );
    assert!(field(&out, "devtotal").unwrap_or(0) > G, "{out}");
}

/// `1024mb` is refused loudly, not read as 1024 bytes: no limit applies.
#[test]
fn a_bad_limit_is_reported_and_refused() {
    let env = HookEnv::new("badlimit", "1024mb");
    let exe = env.build("hook_mem");
    let (ok, out, err) = run(env.hooked(&exe, &["info"]));
    assert!(ok, "{out}{err}");
    assert!(
        err.contains("CUDA_DEVICE_MEMORY_LIMIT") && err.contains("[vgpu pid="),
        "stderr: {err}"
    );
    assert!(field(&out, "devtotal").unwrap_or(0) > G, "{out}");
}

/// `cuMemGetInfo` under a limit answers from what the hook already counts
/// (the look at NVML runs in the background): within 8× of the bare
/// simulated call, medians of 5 interleaved runs of 20000 calls each. (With
/// an NVML query per call it cost about 57×.)
#[test]
fn memory_info_costs_within_8x_of_the_bare_call() {
    let env = HookEnv::new("meminfo-cost", "1g");
    let exe = env.build("bench_launch");
    let per_call = |c: std::process::Command| -> f64 {
        let (ok, out, err) = run(c);
        assert!(ok, "{out}{err}");
        out.lines()
            .find_map(|l| l.strip_prefix("meminfo_ns_per_call "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no meminfo_ns_per_call: {out}"))
    };
    let args = ["1000", "2000"];
    let (mut bare, mut hooked) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        bare.push(per_call(env.unhooked(&exe, &args)));
        hooked.push(per_call(env.hooked(&exe, &args)));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, h) = (median(&mut bare), median(&mut hooked));
    assert!(
        h <= 8.0 * b,
        "cuMemGetInfo: {h:.0} ns hooked, {b:.0} ns bare ({:.1}×); runs: {hooked:?} / {bare:?}",
        h / b
    );
}
