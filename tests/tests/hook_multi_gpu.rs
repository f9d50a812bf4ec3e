//! Several devices under the hook (a two-device simulated GPU): each
//! device's limit is the one HAMi's device plugin gave its container index
//! (`CUDA_DEVICE_MEMORY_LIMIT_<i>`), whatever `CUDA_VISIBLE_DEVICES` does to
//! a process's CUDA ordinals, and the region counts each device's memory
//! under that index.

use std::io::Write;
use std::sync::atomic::Ordering::Acquire;

use vgpu_common::region::SharedRegion;
use vgpu_tests::hook::{field, run, HookEnv, Running};

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;
/// The simulated context's size.
const CTX: u64 = 500 * M;

/// Two devices, limit 1 GiB on the container's device 0 and 2 GiB on 1.
fn two_gpus(name: &str) -> HookEnv {
    HookEnv::new(name, "0")
        .env("SIMGPU_DEVICES", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g")
}

/// The simulated GPU's UUID of physical device `d`.
fn sim_uuid(d: u32) -> String {
    simgpu::model::device_uuid_string(d)
}

/// What the container uses on its device `dev`, summed over the slots.
fn container_used(r: &SharedRegion, dev: usize) -> u64 {
    r.procs
        .iter()
        .filter(|s| s.pid.load(Acquire) != 0)
        .map(|s| s.used_total(dev))
        .sum()
}

fn uuid_of(r: &SharedRegion, dev: usize) -> String {
    let (b, n) = r.uuid(dev);
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// `cuDeviceTotalMem` and `cuMemGetInfo` on CUDA ordinal `ordinal`.
fn totals(
    env: &HookEnv,
    exe: &std::path::Path,
    ordinal: &str,
    visible: Option<&str>,
) -> (u64, u64) {
    let mut c = env.hooked(exe, &["-d", ordinal, "info"]);
    if let Some(v) = visible {
        c.env("CUDA_VISIBLE_DEVICES", v);
    }
    let (ok, out, err) = run(c);
    assert!(ok, "{out}{err}");
    (
        field(&out, "devtotal").expect("devtotal"),
        field(&out, "meminfo total").expect("meminfo total"),
    )
}

/// Without `CUDA_VISIBLE_DEVICES` ordinal i is the container's device i;
/// with `1,0` ordinal 0 is device 1 and gets device 1's limit, through both
/// `cuDeviceTotalMem` and `cuMemGetInfo`.
#[test]
fn each_device_shows_its_own_limit_under_any_visible_devices_order() {
    let env = two_gpus("mgpu-info");
    let exe = env.build("hook_mem");
    assert_eq!(totals(&env, &exe, "0", None), (G, G));
    assert_eq!(totals(&env, &exe, "1", None), (2 * G, 2 * G));
    assert_eq!(totals(&env, &exe, "0", Some("1,0")), (2 * G, 2 * G));
    assert_eq!(totals(&env, &exe, "1", Some("1,0")), (G, G));
    assert_eq!(
        totals(&env, &exe, "0", Some(&sim_uuid(1))),
        (2 * G, 2 * G),
        "a UUID in CUDA_VISIBLE_DEVICES"
    );
    let r = env.region();
    let r = r.region();
    assert_eq!(r.device_num.load(Acquire), 2);
    assert_eq!(uuid_of(r, 0), sim_uuid(0));
    assert_eq!(uuid_of(r, 1), sim_uuid(1));
}

/// Every counted entry point refuses exactly at the device's own limit
/// with the ordinals reversed (`limit` in tests/c/hook_mem.c checks
/// exactness against what `cuMemGetInfo` reports; that this is the right
/// device's limit is the test above).
#[test]
fn the_limit_is_exact_on_each_device_with_reversed_ordinals() {
    let env = two_gpus("mgpu-limit").env("CUDA_VISIBLE_DEVICES", "1,0");
    let exe = env.build("hook_mem");
    let mut failures = Vec::new();
    for ordinal in ["0", "1"] {
        for entry in ["alloc", "create", "async", "graph"] {
            let (ok, out, err) = run(env.hooked(&exe, &["-d", ordinal, "limit", entry]));
            if !ok || !out.contains(&format!("PASS {entry}")) {
                failures.push(format!("ordinal {ordinal} {entry}:\n{out}{err}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Two processes of one container, one per GPU, each seeing only its GPU
/// as CUDA device 0 (a common launcher setup): each one's memory is counted
/// on its own device, and each is held to that device's limit.
#[test]
fn one_process_per_gpu_counts_on_each_ones_own_device() {
    let env = two_gpus("mgpu-split");
    let exe = env.build("hook_mem");
    let hold = |visible: &str, bytes: u64| {
        let mut c = env.hooked(&exe, &["hold", &bytes.to_string()]);
        c.env("CUDA_VISIBLE_DEVICES", visible);
        let mut p = Running::start(c);
        assert_eq!(
            p.wait_for("held"),
            "held rc 0",
            "CUDA_VISIBLE_DEVICES={visible}"
        );
        p
    };
    let mut on1 = hold("1", 300 * M);
    let mut on0 = hold("0", 100 * M);
    {
        let f = env.region();
        let r = f.region();
        assert_eq!(container_used(r, 0), CTX + 100 * M, "device 0");
        assert_eq!(container_used(r, 1), CTX + 300 * M, "device 1");
    }
    // Device 1's 2 GiB leave 2 GiB - 800 MiB - a second context for a
    // process on it; device 0's 1 GiB would not hold that much.
    let mut c = env.hooked(&exe, &["info"]);
    c.env("CUDA_VISIBLE_DEVICES", "1");
    let (ok, out, err) = run(c);
    assert!(ok, "{out}{err}");
    assert_eq!(field(&out, "meminfo total"), Some(2 * G), "{out}");
    assert_eq!(
        field(&out, "free"),
        Some(2 * G - 2 * CTX - 300 * M),
        "{out}"
    );
    for p in [&mut on0, &mut on1] {
        let _ = writeln!(p.child.stdin.as_mut().expect("stdin"));
        drop(p.child.stdin.take());
        let _ = p.child.wait();
    }
}

/// HAMi's device plugin lists the devices it allocated in
/// `NVIDIA_VISIBLE_DEVICES`, in the order of its `_<i>` limits: when that
/// order is not the driver's, the limits follow the list.
#[test]
fn the_device_plugins_uuid_order_names_the_limits() {
    let order = format!("{},{}", sim_uuid(1), sim_uuid(0));
    let env = two_gpus("mgpu-plugin").env("NVIDIA_VISIBLE_DEVICES", &order);
    let exe = env.build("hook_mem");
    assert_eq!(totals(&env, &exe, "0", None), (2 * G, 2 * G));
    assert_eq!(totals(&env, &exe, "1", None), (G, G));
    let f = env.region();
    let r = f.region();
    assert_eq!(uuid_of(r, 0), sim_uuid(1));
    assert_eq!(uuid_of(r, 1), sim_uuid(0));
}

/// NVML (nvidia-smi's view) ignores `CUDA_VISIBLE_DEVICES`: its device i
/// is the container's device i, shown with that device's limit and usage.
#[test]
fn nvml_shows_each_devices_limit_and_usage() {
    let env = two_gpus("mgpu-nvml");
    let mem = env.build("hook_mem");
    let nvml = env.build("hook_nvml");
    let mut c = env.hooked(&mem, &["hold", "268435456"]);
    c.env("CUDA_VISIBLE_DEVICES", "1");
    let mut holder = Running::start(c);
    assert_eq!(holder.wait_for("held"), "held rc 0");
    let info = |index: &str| {
        let (ok, out, err) = run(env.hooked(&nvml, &["-i", index, "info"]));
        assert!(ok, "{out}{err}");
        let line = out
            .lines()
            .find(|l| l.starts_with("v2"))
            .unwrap_or("")
            .to_owned();
        (field(&line, "total"), field(&line, "used"))
    };
    assert_eq!(info("0"), (Some(G), Some(0)));
    assert_eq!(info("1"), (Some(2 * G), Some(CTX + 256 * M)));
    let _ = writeln!(holder.child.stdin.as_mut().expect("stdin"));
    drop(holder.child.stdin.take());
    let _ = holder.child.wait();
}
