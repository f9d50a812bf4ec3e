//! `cargo xtask lint`: rustfmt and clippy `-D warnings`, in two passes as the
//! eBPF crate needs its own target and toolchain (style.md practice 11).

use std::process::Command;

use anyhow::Result;

use crate::{setup, util};

pub fn run() -> Result<()> {
    util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
    // Host crates. The eBPF object is not needed to lint the loader's Rust.
    util::run(
        util::cargo()
            .args(["clippy", "--workspace", "--all-targets"])
            .args(["--exclude", "vgpu-ebpf", "--exclude", "vgpu-tests"])
            .args(["--", "-D", "warnings"])
            .env("AYA_BUILD_SKIP", "1"),
    )?;
    // The integration tests: their helpers panic on a broken setup by design
    // (a test that cannot set up must fail loudly), so unwrap/expect are fine.
    util::run(
        util::cargo()
            .args([
                "clippy",
                "-p",
                "vgpu-tests",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
            .args(["-A", "clippy::unwrap_used", "-A", "clippy::expect_used"])
            .env("AYA_BUILD_SKIP", "1"),
    )?;
    // The eBPF crate, with Debian's toolchain and its prebuilt bpfel `core`.
    let mut ebpf = Command::new("cargo");
    ebpf.current_dir(util::root())
        .args([
            &format!("+{}", setup::EBPF_TOOLCHAIN),
            "clippy",
            "-p",
            "vgpu-ebpf",
        ])
        .args(["--target", "bpfel-unknown-none", "--", "-D", "warnings"])
        .env("AYA_BUILD_SKIP", "1")
        .env("RUSTC_BOOTSTRAP", "aya_ebpf")
        .env("CARGO_TARGET_DIR", util::target_dir().join("ebpf-lint"));
    util::run(&mut ebpf)
}
