//! The memory limit through every counted entry point, memory info under a
//! limit, and environment errors. Needs the built artifacts and the
//! simulated GPU (`cargo xtask test`).

use vgpu_tests::hook::{field, run, HookEnv, Running};

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
/// shows it, so memory info and the limit count it. The simulated module
/// costs 64 MiB: of 1 GiB, 500 MiB of context and 64 of code leave 460, and
/// 500 MiB more does not fit (without counting the code it would).
#[test]
fn gpu_code_loaded_after_the_context_is_counted() {
    let env = HookEnv::new("module", "1g");
    let exe = env.build("hook_mem");
    let mut c = env.hooked(&exe, &["module", &(500 * M).to_string()]);
    c.env("SIMGPU_MODULE_BYTES", "64m");
    let (ok, out, err) = run(c);
    assert!(ok, "{out}{err}");
    assert_eq!(field(&out, "module rc"), Some(0), "{out}");
    assert_eq!(field(&out, "free"), Some(G - 564 * M), "{out}{err}");
    assert_eq!(
        field(&out, "alloc rc"),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY: {out}{err}"
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
