//! Interposition: cuGetProcAddress version/flag mapping, and NVML reached
//! through dlopen + dlsym (as nvidia-smi does).

use std::io::Write;

use vgpu_tests::hook::{field, run, HookEnv, Running};

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

#[test]
fn get_proc_address_returns_the_hook_for_11_12_13_and_ptsz() {
    let env = HookEnv::new("procaddr", "1g");
    let exe = env.build("hook_procaddr");
    let (ok, out, err) = run(env.hooked(&exe, &[]));
    assert!(ok && out.contains("PASS"), "{out}{err}");
}

/// A program that only dlopens NVML sees the limit as total and the
/// container's usage (another process holding a context and 256 MiB) as used.
#[test]
fn nvml_through_dlsym_shows_the_limit() {
    let env = HookEnv::new("nvml", "1g");
    let mem = env.build("hook_mem");
    let nvml = env.build("hook_nvml");
    let mut holder = Running::start(env.hooked(&mem, &["hold", "268435456"]));
    assert_eq!(holder.wait_for("held"), "held rc 0");
    let (ok, out, err) = run(env.hooked(&nvml, &["info"]));
    let _ = writeln!(holder.child.stdin.as_mut().expect("stdin"));
    assert!(ok, "{out}{err}");
    for v in ["v1", "v2"] {
        let line = out.lines().find(|l| l.starts_with(v)).unwrap_or("");
        assert_eq!(field(line, "rc"), Some(0), "{out}");
        assert_eq!(field(line, "total"), Some(G), "{out}");
        assert_eq!(field(line, "used"), Some(500 * M + 256 * M), "{out}");
        assert_eq!(field(line, "free"), Some(G - 756 * M), "{out}");
    }
}
