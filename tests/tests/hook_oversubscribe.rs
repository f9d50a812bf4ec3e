//! `CUDA_OVERSUBSCRIBE` on a simulated GPU that another (unhooked) process
//! has nearly filled: an allocation that fits the container's limit but not
//! the device is served from host memory, works, is shown by `vgpu
//! inspect`, and is released on free; the limit still refuses; without the
//! variable the device's `CUDA_ERROR_OUT_OF_MEMORY` comes back as before.
//! Needs the built artifacts (`cargo xtask build`) and root.
#![allow(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine misbehaves"
)]

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use vgpu_tests::dist::vgpu_bin;
use vgpu_tests::hook::{field, HookEnv, Running};

const M: u64 = 1 << 20;
/// The device: 2 GiB, a context costs 100 MiB.
const DEVICE: &str = "2g";
const CONTEXT: u64 = 100 * M;
/// Held by the unhooked neighbour, besides its context: 200 MiB stay free.
const NEIGHBOUR: u64 = 1700 * M;
/// The container's limit is 1 GiB: after its 100 MiB context, 512 MiB fit
/// the limit but not the device (100 MiB free).
const LIMIT: &str = "1g";
const FITS_LIMIT: u64 = 512 * M;
/// 512 MiB more would pass the 1 GiB limit.
const PAST_LIMIT: u64 = 512 * M;
/// GPU code the program loads after its overflow (it fits the device).
const MODULE: u64 = 64 * M;

const CUDA_SUCCESS: u64 = 0;
const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;

fn env(name: &str) -> HookEnv {
    HookEnv::new(name, LIMIT)
        .env("SIMGPU_MEMORY", DEVICE)
        .env("SIMGPU_CONTEXT_BYTES", "100m")
}

/// Starts the unhooked neighbour holding `bytes` bytes.
fn neighbour(env: &HookEnv, exe: &Path, bytes: u64) -> Running {
    let mut n = Running::start(env.unhooked(exe, &["hold", &bytes.to_string()]));
    let l = n.wait_for("held");
    assert_eq!(field(&l, "held rc"), Some(CUDA_SUCCESS), "neighbour: {l}");
    n
}

/// Device 0's usage of the slot of `pid`, from `vgpu inspect --json`.
fn usage(env: &HookEnv, pid: u32) -> Value {
    let out = Command::new(vgpu_bin())
        .args(["inspect", "--json"])
        .arg(env.region_path())
        .output()
        .expect("run vgpu inspect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    let slot = doc["regions"][0]["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .find(|s| s["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("no slot of pid {pid}: {doc:#}"));
    slot["usage"]
        .as_array()
        .expect("usage")
        .iter()
        .find(|u| u["device"] == 0)
        .cloned()
        .unwrap_or_else(|| panic!("no device 0 usage: {slot:#}"))
}

fn next_line(p: &mut Running) {
    p.child
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("write to the program");
}

/// Runs the overflow scenario through `cuMemAlloc_v2`, or
/// `cuMemAllocPitch_v2` with `pitch`.
fn overflows(name: &str, pitch: bool) {
    let env = env(name).env("CUDA_OVERSUBSCRIBE", "true");
    let exe = env.build("hook_mem");
    let _n = neighbour(&env, &exe, NEIGHBOUR);
    let (fits, past) = (FITS_LIMIT.to_string(), PAST_LIMIT.to_string());
    let mut args = vec!["overflow", fits.as_str(), past.as_str()];
    if pitch {
        args.push("pitch");
    }
    let mut cmd = env.hooked(&exe, &args);
    cmd.env("SIMGPU_MODULE_BYTES", "64m");
    let mut c = Running::start(cmd);
    let pid = c.child.id();
    let l = c.wait_for("alloc rc");
    assert_eq!(field(&l, "alloc rc"), Some(CUDA_SUCCESS), "{l}");
    if pitch {
        let l = c.wait_for("pitch");
        assert_eq!(field(&l, "pitch"), Some(M), "1 MiB rows: {l}");
    }
    assert_eq!(c.wait_for("readback"), "readback ok");
    let l = c.wait_for("module rc");
    assert_eq!(field(&l, "module rc"), Some(CUDA_SUCCESS), "{l}");
    assert_eq!(c.wait_for("held"), "held");
    // NVML does not see host-backed bytes: the GPU code loaded after them
    // is still found in its line and counted, by the hook's background look
    // (once a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(2500);
    let u = loop {
        let u = usage(&env, pid);
        if u["module_bytes"] == MODULE || std::time::Instant::now() >= deadline {
            break u;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(u["module_bytes"], MODULE, "{u:#}");
    assert_eq!(u["host_bytes"], FITS_LIMIT, "{u:#}");
    assert_eq!(u["data_bytes"], FITS_LIMIT, "counted like any other: {u:#}");
    assert_eq!(u["total_bytes"], CONTEXT + FITS_LIMIT + MODULE, "{u:#}");

    // Past the limit: refused, host memory or not.
    next_line(&mut c);
    let l = c.wait_for("more rc");
    assert_eq!(field(&l, "more rc"), Some(CUDA_ERROR_OUT_OF_MEMORY), "{l}");
    let l = c.wait_for("free rc");
    assert_eq!(field(&l, "free rc"), Some(CUDA_SUCCESS), "{l}");
    assert_eq!(c.wait_for("freed"), "freed");
    let u = usage(&env, pid);
    assert_eq!(u["host_bytes"], 0, "{u:#}");
    assert_eq!(u["data_bytes"], 0, "{u:#}");
    assert_eq!(u["total_bytes"], CONTEXT + MODULE, "{u:#}");
}

#[test]
fn an_allocation_past_the_device_but_within_the_limit_overflows_to_host_memory() {
    overflows("oversub", false);
}

#[test]
fn a_pitched_allocation_overflows_too() {
    overflows("oversub-pitch", true);
}

#[test]
fn without_oversubscription_a_full_device_still_refuses() {
    let env = env("no-oversub");
    let exe = env.build("hook_mem");
    let _n = neighbour(&env, &exe, NEIGHBOUR);
    let mut c = Running::start(env.hooked(
        &exe,
        &["overflow", &FITS_LIMIT.to_string(), &PAST_LIMIT.to_string()],
    ));
    let pid = c.child.id();
    let l = c.wait_for("alloc rc");
    assert_eq!(field(&l, "alloc rc"), Some(CUDA_ERROR_OUT_OF_MEMORY), "{l}");
    assert_eq!(c.wait_for("held"), "held");
    let u = usage(&env, pid);
    assert_eq!(u["host_bytes"], 0, "{u:#}");
    assert_eq!(u["total_bytes"], CONTEXT, "{u:#}");
}

/// Held by the neighbour in [`reserve_case`]: 600 MiB of the device stay
/// free after the container's context.
const NEIGHBOUR_LIGHT: u64 = 1248 * M;
/// GPU code the program loads after its allocation in [`reserve_case`]:
/// more than the device keeps free if the allocation takes the device.
const BIG_MODULE: &str = "200m";

/// A 512 MiB allocation on a device with 600 MiB free, then 200 MiB of GPU
/// code (what cuDNN's or cuBLAS's kernels take at their first launch):
/// returns (alloc rc, module rc, host-backed bytes).
fn reserve_case(name: &str, reserve: Option<&str>) -> (u64, u64, Value) {
    let mut env = env(name).env("CUDA_OVERSUBSCRIBE", "true");
    if let Some(r) = reserve {
        env = env.env("VGPU_OVERSUBSCRIBE_RESERVE", r);
    }
    let exe = env.build("hook_mem");
    let _n = neighbour(&env, &exe, NEIGHBOUR_LIGHT);
    let mut cmd = env.hooked(
        &exe,
        &["overflow", &FITS_LIMIT.to_string(), &PAST_LIMIT.to_string()],
    );
    cmd.env("SIMGPU_MODULE_BYTES", BIG_MODULE);
    let mut c = Running::start(cmd);
    let pid = c.child.id();
    let alloc = field(&c.wait_for("alloc rc"), "alloc rc").expect("alloc rc");
    let module = field(&c.wait_for("module rc"), "module rc").expect("module rc");
    assert_eq!(c.wait_for("held"), "held");
    let host = usage(&env, pid)["host_bytes"].clone();
    next_line(&mut c);
    (alloc, module, host)
}

/// The device is not filled to the brim: what cannot go to host memory
/// (GPU code loaded at a library's first launch) finds room. Filled to the
/// brim (a reserve of 0, the behaviour before the reserve), that code
/// fails to load, as would a library's streams and handles, which need
/// device memory too.
#[test]
fn oversubscription_keeps_device_memory_free_for_gpu_code() {
    let (alloc, module, host) = reserve_case("oversub-reserve", None);
    assert_eq!(alloc, CUDA_SUCCESS);
    assert_eq!(host, FITS_LIMIT, "fits the device, not its reserve: host");
    assert_eq!(module, CUDA_SUCCESS, "the reserve holds the GPU code");

    let (alloc, module, host) = reserve_case("oversub-brim", Some("0"));
    assert_eq!(alloc, CUDA_SUCCESS);
    assert_eq!(host, 0, "fits the device: device");
    assert_eq!(
        module, CUDA_ERROR_OUT_OF_MEMORY,
        "no room left for the code"
    );
}
