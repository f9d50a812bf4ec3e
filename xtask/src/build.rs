//! `cargo xtask build`: everything into `target/dist/`.
//!
//! ```text
//! target/dist/libvgpu.so            the hook (glibc >= 2.17)
//! target/dist/vgpu                  the loader, eBPF object embedded
//! target/dist/sim/libcuda.so.1      the simulated driver
//! target/dist/sim/libnvidia-ml.so.1 the simulated NVML
//! target/dist/sim/simgpu-server     its background server (started on demand)
//! target/dist/share/                completions (bash, zsh, fish) and man pages,
//!                                   written by the built `vgpu` from its clap tree
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::{setup, util};

#[derive(clap::Args, Default)]
pub struct Args {
    /// Build the debug profile instead of release.
    #[arg(long)]
    pub debug: bool,
}

const PACKAGES: &[&str] = &["vgpu-loader", "simgpu", "simgpu-cuda", "simgpu-nvml"];

/// The hook is linked by zig against glibc 2.17 symbol versions: it is
/// preloaded into every process of every GPU container, so it must load on
/// images older than this machine.
const HOOK_TARGET: &str = "x86_64-unknown-linux-gnu";
const HOOK_GLIBC: &str = "2.17";

/// (file in the profile dir, path under dist)
const ARTIFACTS: &[(&str, &str)] = &[
    ("vgpu", "vgpu"),
    ("libcuda.so", "sim/libcuda.so.1"),
    ("libnvidia_ml.so", "sim/libnvidia-ml.so.1"),
    ("simgpu-server", "sim/simgpu-server"),
];

pub fn run(args: &Args) -> Result<PathBuf> {
    setup::run(&setup::Args { check: false })?;
    let mut cmd = util::cargo();
    cmd.arg("build");
    if !args.debug {
        cmd.arg("--release");
    }
    for p in PACKAGES {
        cmd.args(["-p", p]);
    }
    util::run(&mut cmd)?;

    let profile_name = if args.debug { "debug" } else { "release" };
    let mut hook = util::cargo();
    hook.args(["zigbuild", "-p", "vgpu-hook", "--target"])
        .arg(format!("{HOOK_TARGET}.{HOOK_GLIBC}"));
    if !args.debug {
        hook.arg("--release");
    }
    util::run(&mut hook)?;

    let profile = util::target_dir().join(profile_name);
    let dist = util::dist_dir();
    fs::create_dir_all(dist.join("sim")).context("create target/dist/sim")?;
    for (from, to) in ARTIFACTS {
        install(&profile.join(from), &dist.join(to))?;
    }
    let hook_lib = util::target_dir()
        .join(HOOK_TARGET)
        .join(profile_name)
        .join("libvgpu.so");
    install(&hook_lib, &dist.join("libvgpu.so"))?;
    if !args.debug {
        for shipped in ["vgpu", "libvgpu.so"] {
            split_debug_info(&dist, shipped)?;
        }
    }
    generate_assets(&dist)?;
    // Linking test programs with `-lcuda` wants the unversioned names too.
    for (link, target) in [
        ("sim/libcuda.so", "libcuda.so.1"),
        ("sim/libnvidia-ml.so", "libnvidia-ml.so.1"),
    ] {
        let link = dist.join(link);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link)
            .with_context(|| format!("symlink {}", link.display()))?;
    }
    eprintln!("build: artifacts in {}", dist.display());
    Ok(dist)
}

/// Completions and man pages, from the binary just built (its hidden
/// `generate-assets`), into a fresh `dist/share`: a subcommand removed
/// leaves no stale page behind.
fn generate_assets(dist: &Path) -> Result<()> {
    let share = dist.join("share");
    if share.exists() {
        fs::remove_dir_all(&share).with_context(|| format!("remove {}", share.display()))?;
    }
    util::run(
        std::process::Command::new(dist.join("vgpu"))
            .arg("generate-assets")
            .arg(&share),
    )
}

/// Moves the debug info of `dist/<name>` into `dist/debug/<name>.debug`
/// (linked back by `.gnu_debuglink`, so gdb finds it): the shipped file
/// keeps its symbol table, so backtraces still name functions, at a
/// fraction of the size.
fn split_debug_info(dist: &Path, name: &str) -> Result<()> {
    let file = dist.join(name);
    let debug_dir = dist.join("debug");
    fs::create_dir_all(&debug_dir).context("create target/dist/debug")?;
    let debug = debug_dir.join(format!("{name}.debug"));
    util::run(
        std::process::Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&file)
            .arg(&debug),
    )?;
    util::run(
        std::process::Command::new("objcopy")
            .arg("--strip-debug")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&file),
    )?;
    Ok(())
}

/// Copies to a temporary name and renames, so a process that has the old
/// file mapped keeps a whole file.
fn install(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("tmp-install");
    fs::copy(from, &tmp)
        .with_context(|| format!("copy {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("rename to {}", to.display()))?;
    Ok(())
}
