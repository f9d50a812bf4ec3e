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
            .args(["clippy", "--workspace", "--exclude", "vgpu-ebpf", "--all-targets"])
            .args(["--", "-D", "warnings"]),
    )?;
    // The eBPF crate, with Debian's toolchain and its prebuilt bpfel `core`.
    let mut ebpf = Command::new("rustup");
    ebpf.current_dir(util::root().join("ebpf"))
        .args(["run", setup::EBPF_TOOLCHAIN, "cargo", "clippy"])
        .args(["--target", "bpfel-unknown-none", "--release"])
        .args(["--", "-D", "warnings"])
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,vgpu_ebpf")
        .env("CARGO_TARGET_DIR", util::target_dir().join("ebpf-lint"));
    util::run(&mut ebpf)
}
