//! `cargo xtask build`: everything into `target/dist/`, or with `--arch`
//! the other architecture's files into `target/dist-<arch>/` (same layout).
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
//!
//! The other architecture's files are linked by zig (`cargo zigbuild`), the
//! hook against glibc 2.17 as on the host, the programs against 2.28
//! (`CROSS_PROGRAMS_GLIBC`): the loader embeds an eBPF object built
//! for that architecture (aya-build passes the loader's target arch to the
//! eBPF crate as `bpf_target_arch`, which decides how probe arguments are
//! read: `ebpf/src/args.rs`), and its completions and man pages are written
//! by that `vgpu` itself under qemu-user (`crate::arch`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::arch::Arch;
use crate::{setup, util};

#[derive(clap::Args, Default)]
pub struct Args {
    /// Build the debug profile instead of release.
    #[arg(long)]
    pub debug: bool,
    /// The architecture to build for (default: this machine's). The other
    /// one is cross-built into target/dist-<arch>/; its test run needs
    /// qemu-user and Debian's cross C library (`cargo xtask setup`).
    #[arg(long, value_enum)]
    pub arch: Option<Arch>,
}

const PACKAGES: &[&str] = &["vgpu-loader", "simgpu", "simgpu-cuda", "simgpu-nvml"];

/// The hook is linked by zig against glibc 2.17 symbol versions: it is
/// preloaded into every process of every GPU container, so it must load on
/// images older than this machine.
const HOOK_GLIBC: &str = "2.17";
/// The other architecture's programs (`vgpu`, the simulated driver) are
/// linked by zig too. Executables cannot leave std's `getrandom` (glibc
/// 2.25) unresolved as the hook does; `vgpu` runs in its image on that
/// image's C library (Debian's 2.36), and 2.28 keeps the dist's files
/// runnable on Arm distributions back to RHEL 8 and Debian 10.
const CROSS_PROGRAMS_GLIBC: &str = "2.28";

/// (file in the profile dir, path under dist)
const ARTIFACTS: &[(&str, &str)] = &[
    ("vgpu", "vgpu"),
    ("libcuda.so", "sim/libcuda.so.1"),
    ("libnvidia_ml.so", "sim/libnvidia-ml.so.1"),
    ("simgpu-server", "sim/simgpu-server"),
];

pub fn run(args: &Args) -> Result<PathBuf> {
    setup::run(&setup::Args { check: false })?;
    let arch = args.arch.unwrap_or_else(Arch::host);
    let profile_name = if args.debug { "debug" } else { "release" };
    let zigbuild = |packages: &[&str], glibc: &str, target_dir: &Path| -> Result<PathBuf> {
        let mut cmd = util::cargo();
        cmd.args(["zigbuild", "--target"])
            .arg(format!("{}.{glibc}", arch.gnu_target()))
            .arg("--target-dir")
            .arg(target_dir);
        for p in packages {
            cmd.args(["-p", p]);
        }
        if !args.debug {
            cmd.arg("--release");
        }
        if !arch.is_host() {
            // Debug info only for the workspace's own crates: a second
            // architecture's dependencies, build scripts and proc-macros
            // (the nested eBPF build's too, which inherits the environment)
            // would otherwise add about as much disk as the host's build.
            cmd.args(["--config", "profile.release.package.'*'.debug=false"])
                .env("CARGO_PROFILE_RELEASE_BUILD_OVERRIDE_DEBUG", "false");
        }
        util::run(&mut cmd)?;
        Ok(target_dir.join(arch.gnu_target()).join(profile_name))
    };
    let (profile, hook_profile) = if arch.is_host() {
        let mut cmd = util::cargo();
        cmd.arg("build");
        if !args.debug {
            cmd.arg("--release");
        }
        for p in PACKAGES {
            cmd.args(["-p", p]);
        }
        util::run(&mut cmd)?;
        let hook = zigbuild(&["vgpu-hook"], HOOK_GLIBC, &util::target_dir())?;
        (util::target_dir().join(profile_name), hook)
    } else {
        // Two glibc floors are two sets of compiler flags: each its own
        // target dir, or every build would rebuild the other's crates.
        let programs = zigbuild(PACKAGES, CROSS_PROGRAMS_GLIBC, &util::target_dir())?;
        let hook_dir = util::target_dir().join(format!("hook-glibc-{HOOK_GLIBC}"));
        (programs, zigbuild(&["vgpu-hook"], HOOK_GLIBC, &hook_dir)?)
    };

    let dist = arch.dist_dir();
    fs::create_dir_all(dist.join("sim"))
        .with_context(|| format!("create {}/sim", dist.display()))?;
    for (from, to) in ARTIFACTS {
        install(&profile.join(from), &dist.join(to))?;
    }
    install(&hook_profile.join("libvgpu.so"), &dist.join("libvgpu.so"))?;
    if !args.debug {
        for shipped in ["vgpu", "libvgpu.so"] {
            split_debug_info(arch, &dist, shipped)?;
        }
    }
    generate_assets(arch, &dist)?;
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
fn generate_assets(arch: Arch, dist: &Path) -> Result<()> {
    let share = dist.join("share");
    if share.exists() {
        fs::remove_dir_all(&share).with_context(|| format!("remove {}", share.display()))?;
    }
    util::run(
        arch.command(&dist.join("vgpu"))
            .arg("generate-assets")
            .arg(&share),
    )
}

/// Moves the debug info of `dist/<name>` into `dist/debug/<name>.debug`
/// (linked back by `.gnu_debuglink`, so gdb finds it): the shipped file
/// keeps its symbol table, so backtraces still name functions, at a
/// fraction of the size.
fn split_debug_info(arch: Arch, dist: &Path, name: &str) -> Result<()> {
    // Debian's binutils read only the host's ELF machine; LLVM's objcopy
    // (llvm-22, beside bpf-linker's LLVM) reads them all.
    let objcopy = if arch.is_host() {
        "objcopy".to_owned()
    } else {
        format!("llvm-objcopy-{}", setup::LLVM_MAJOR)
    };
    let file = dist.join(name);
    let debug_dir = dist.join("debug");
    fs::create_dir_all(&debug_dir).context("create target/dist/debug")?;
    let debug = debug_dir.join(format!("{name}.debug"));
    util::run(
        std::process::Command::new(&objcopy)
            .arg("--only-keep-debug")
            .arg(&file)
            .arg(&debug),
    )?;
    util::run(
        std::process::Command::new(&objcopy)
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
