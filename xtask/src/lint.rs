//! `cargo xtask lint`: every gate that needs no test machine.
//!
//! - rustfmt, and clippy `-D warnings` in separate passes: the host crates,
//!   the shipped crates for aarch64 (code behind `target_arch` cfgs), and
//!   the eBPF crate (its own target and toolchain) once per architecture;
//! - every workspace member opts into the workspace's `[lints]`;
//! - `cargo deny` (offline, after `cargo fetch --locked`: licenses, bans,
//!   sources; `deny.toml`);
//! - `typos` over code and docs (`_typos.toml`);
//! - the ABI snapshots of every cross-process layout (`cargo xtask abi`);
//! - no `unsafe` in the hook's policy code (`unsafe_free`);
//! - no raw driver call (`real_cuda!`, `real_nvml!`) in the hook outside
//!   `real/` and the generated exports, and no path into `crate::real`
//!   outside those and the driver seam's real implementation
//!   (`driver_seam`).
//! - docs/README.md's map of the folders matches them (`docs_map`).
//! - every file path the docs and doc comments name in backticks exists
//!   (`doc_paths`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::arch::Arch;
use crate::{abi, doc_paths, docs_map, driver_seam, setup, unsafe_free, util};

pub fn run() -> Result<()> {
    util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
    lints_opt_in()?;
    unsafe_free::run()?;
    driver_seam::run()?;
    docs_map::run()?;
    doc_paths::run()?;
    // cargo deny reads every crate of every target and feature, dev-only and
    // other platforms' included; the build before it fetched only what it
    // compiled. Fetch the rest from the lock file so the offline check works
    // on a machine whose registry is empty.
    util::run(
        Command::new("cargo")
            .current_dir(util::root())
            .args(["fetch", "--locked"]),
    )?;
    util::run(
        Command::new("cargo")
            .current_dir(util::root())
            .args([
                "deny",
                "--offline",
                "--all-features",
                "check",
                "--hide-inclusion-graph",
            ])
            .args(["licenses", "bans", "sources"]),
    )?;
    util::run(Command::new(python_script("typos")?).current_dir(util::root()))?;
    abi::run(&abi::Args::default())?;
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
    // The shipped crates for the other architecture too: code behind
    // `target_arch` cfgs (the hook's dlsym trampoline, the node
    // architecture `install-hook` checks against) compiles only there.
    // Through cargo-zigbuild, as the build does: ring (the daemon's TLS)
    // compiles C even to be checked, and zig is the cross C compiler here.
    for arch in Arch::ALL.into_iter().filter(|a| !a.is_host()) {
        util::run(
            Command::new("cargo-zigbuild")
                .current_dir(util::root())
                .args(["clippy", "--target", &arch.gnu_target()])
                .args(["-p", "vgpu-hook", "-p", "vgpu-loader", "-p", "vgpu-common"])
                .args(["--", "-D", "warnings"])
                .env("AYA_BUILD_SKIP", "1"),
        )?;
    }
    // The eBPF crate, with Debian's toolchain and its prebuilt bpfel `core`,
    // once per architecture it reads probe arguments for (`bpf_target_arch`),
    // each in its own target dir so neither pass invalidates the other.
    for arch in Arch::ALL {
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
            .env("AYA_BPF_TARGET_ARCH", arch.name())
            .env("RUSTC_BOOTSTRAP", "aya_ebpf")
            .env(
                "CARGO_TARGET_DIR",
                util::target_dir().join(format!("ebpf-lint-{}", arch.name())),
            );
        util::run(&mut ebpf)?;
    }
    Ok(())
}

/// Every member of the workspace has `[lints] workspace = true`, so the
/// workspace's lint levels (unsafe_op_in_unsafe_fn, unwrap_used, ...) hold
/// in each crate, a new one included.
fn lints_opt_in() -> Result<()> {
    let root_manifest = util::root().join("Cargo.toml");
    let members = read_toml(&root_manifest)?
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .cloned()
        .context("Cargo.toml has no [workspace] members")?;
    let mut missing = Vec::new();
    for m in members {
        let Some(dir) = m.as_str() else { continue };
        let manifest = util::root().join(dir).join("Cargo.toml");
        let opted = read_toml(&manifest)?
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(|w| w.as_bool())
            == Some(true);
        if !opted {
            missing.push(dir.to_owned());
        }
    }
    if !missing.is_empty() {
        bail!(
            "these workspace members lack `[lints] workspace = true`: {}",
            missing.join(", ")
        );
    }
    Ok(())
}

fn read_toml(path: &std::path::Path) -> Result<toml::Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.parse()
        .with_context(|| format!("{} is not valid TOML", path.display()))
}

/// A command that pip installed into Python's scripts directory (which need
/// not be on PATH).
fn python_script(name: &str) -> Result<PathBuf> {
    let dir = util::output(Command::new("python3").args([
        "-c",
        "import sysconfig; print(sysconfig.get_path('scripts'))",
    ]))
    .context("python3 cannot say where its scripts are")?;
    let path = PathBuf::from(dir).join(name);
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    Ok(path)
}
