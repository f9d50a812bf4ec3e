//! The aarch64 build (`cargo xtask build --arch aarch64`, in
//! `target/dist-aarch64/`) run on an x86-64 machine: its programs under
//! qemu-user, on Debian's arm64 C library (`libc6-arm64-cross`), and small
//! C test programs for aarch64 compiled with zig, which `cargo xtask setup`
//! installs for the hook's build.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::dist;

/// Debian's arm64 C library: the dynamic loader and libc of every aarch64
/// program run here.
pub const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// `target/dist-aarch64`: `VGPU_DIST_AARCH64` (set by `cargo xtask test`),
/// else beside the host's dist directory.
pub fn dist_dir() -> PathBuf {
    let dir = std::env::var_os("VGPU_DIST_AARCH64")
        .map(PathBuf::from)
        .unwrap_or_else(|| dist::dist_dir().with_file_name("dist-aarch64"));
    assert!(
        dir.join("vgpu").exists(),
        "{} has no vgpu: run `cargo xtask build --arch aarch64` first",
        dir.display()
    );
    dir
}

/// `program` (an aarch64 executable) under `qemu-aarch64-static`, which
/// passes its own environment (`LD_PRELOAD`, `LD_LIBRARY_PATH`, …) to the
/// program's dynamic loader.
pub fn command(program: &Path) -> Command {
    let mut c = Command::new("qemu-aarch64-static");
    c.arg("-L").arg(SYSROOT).arg(program);
    c
}

/// Compiles `tests/c/<name>.c` for aarch64 into `out_dir/<name>`, linked
/// against the aarch64 simulated `libcuda.so.1`, whose references to glibc
/// newer than the program's floor (2.28, as xtask's cross-built programs)
/// resolve at run time against the sysroot's.
pub fn compile_c(name: &str, out_dir: &Path) -> PathBuf {
    let sim = dist_dir().join("sim");
    let src = dist::c_dir().join(format!("{name}.c"));
    let exe = out_dir.join(name);
    let out = cc()
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(dist::c_dir())
        .arg(format!("-L{}", sim.display()))
        .args(["-lcuda", "-lpthread", "-ldl", "-Wl,--allow-shlib-undefined"])
        .output()
        .unwrap_or_else(|e| panic!("run zig cc (python3 -m ziglang): {e}"));
    assert!(
        out.status.success(),
        "compiling {} for aarch64: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// zig's C compiler for aarch64 glibc 2.28 (as xtask's cross-built
/// programs): append the arguments of `cc`.
pub fn cc() -> Command {
    let mut c = Command::new("python3");
    c.args(["-m", "ziglang", "cc", "-target", "aarch64-linux-gnu.2.28"]);
    c
}

/// The ELF machine of `path` (`e_machine`): 183 for AArch64, 62 for x86-64.
pub fn elf_machine(path: &Path) -> u16 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 20 && bytes.starts_with(b"\x7fELF"),
        "{} is not an ELF file",
        path.display()
    );
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// The eBPF object (`EM_BPF`) embedded in the `vgpu` binary at `path`: an
/// ELF header at some offset whose section headers end the object.
pub fn embedded_bpf_object(path: &Path) -> Vec<u8> {
    const EM_BPF: u16 = 247;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let mut from = 0;
    while let Some(i) = bytes[from..]
        .windows(6)
        .position(|w| w == b"\x7fELF\x02\x01")
        .map(|i| from + i)
    {
        if i + 64 <= bytes.len() && u16_at(i + 18) == EM_BPF {
            let mut shoff = [0u8; 8];
            shoff.copy_from_slice(&bytes[i + 0x28..i + 0x30]);
            let end = i
                + u64::from_le_bytes(shoff) as usize
                + usize::from(u16_at(i + 0x3a)) * usize::from(u16_at(i + 0x3c));
            assert!(
                end <= bytes.len(),
                "truncated eBPF object in {}",
                path.display()
            );
            return bytes[i..end].to_vec();
        }
        from = i + 1;
    }
    panic!("no eBPF object embedded in {}", path.display())
}
