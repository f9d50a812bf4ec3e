//! Where the built artifacts are, and compiling small C test programs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `target/dist`, as `cargo xtask build` lays it out. `VGPU_DIST` overrides;
/// otherwise `$CARGO_TARGET_DIR/dist` when that is set.
pub fn dist_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VGPU_DIST") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace_root().join(t)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("dist")
}

/// `libvgpu.so`, the hook.
pub fn hook_lib() -> PathBuf {
    artifact("libvgpu.so")
}

/// The `vgpu` loader binary.
pub fn vgpu_bin() -> PathBuf {
    artifact("vgpu")
}

/// The directory holding the simulated `libcuda.so.1` and `libnvidia-ml.so.1`.
pub fn sim_dir() -> PathBuf {
    let dir = dist_dir().join("sim");
    assert!(
        dir.join("libcuda.so.1").exists(),
        "{} has no libcuda.so.1: run `cargo xtask build` first",
        dir.display()
    );
    dir
}

fn artifact(name: &str) -> PathBuf {
    let p = dist_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask build` first",
        p.display()
    );
    p
}

/// Directory with test C sources (`tests/c/`).
pub fn c_dir() -> PathBuf {
    workspace_root().join("tests").join("c")
}

/// Compiles `tests/c/<name>.c` into `out_dir/<name>`, linked against the
/// simulated `libcuda.so.1` (and `libnvidia-ml.so.1` when `nvml`) the way a
/// real program links `-lcuda`. Returns the executable's path.
pub fn compile_c(name: &str, out_dir: &Path, nvml: bool) -> PathBuf {
    let sim = sim_dir();
    let src = c_dir().join(format!("{name}.c"));
    let exe = out_dir.join(name);
    let mut cmd = Command::new("cc");
    cmd.arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(c_dir())
        .arg(format!("-L{}", sim.display()))
        .arg("-l:libcuda.so.1");
    if nvml {
        cmd.arg("-l:libnvidia-ml.so.1");
    }
    cmd.arg("-lpthread").arg("-ldl");
    let out = cmd.output().expect("run cc");
    assert!(
        out.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The exports `vgpu install-hook` takes as the mark of the hook (the
/// loader's `HOOK_EXPORTS`, `loader/src/install/elf.rs`).
pub const HOOK_EXPORTS: &[&str] = &[
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuLaunchKernel",
    "nvmlDeviceGetMemoryInfo",
    "dlsym",
];

/// Compiles `dir/<name>.so`, a stand-in for the hook that install-hook
/// accepts: it exports every name of [`HOOK_EXPORTS`] (stubs returning 0),
/// plus whatever `c` defines. It is never preloaded, so its `dlsym` stub
/// interposes nothing.
pub fn stand_in_hook(dir: &Path, name: &str, c: &str) -> PathBuf {
    let mut src = String::from(c);
    for f in HOOK_EXPORTS {
        src.push_str(&format!("\nlong {f}(void) {{ return 0; }}"));
    }
    src.push('\n');
    shared_lib(dir, name, &src)
}

/// Compiles the C source `c` into the shared library `dir/<name>.so`.
pub fn shared_lib(dir: &Path, name: &str, c: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, c).expect("write the C source");
    let out = dir.join(format!("{name}.so"));
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}
