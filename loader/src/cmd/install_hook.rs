//! `vgpu install-hook`: put libvgpu.so and ld.so.preload in the host
//! directory HAMi's device plugin mounts into GPU containers.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::install::{self, Outcome, Plan};

/// Install the hook on this node: copy libvgpu.so into the host directory
/// (atomically: write a temporary file, then rename, so running containers
/// keep a whole library) and write ld.so.preload beside it. Checks the ELF
/// architecture and glibc symbol versions first and refuses a library that
/// would not load. Idempotent; the first install keeps what was there, and
/// `--uninstall` restores it.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Host directory HAMi mounts into containers (its `${HOOK_PATH}/vgpu`).
    #[arg(long, default_value = "/usr/local/vgpu")]
    host_dir: PathBuf,
    /// The library to install [default: libvgpu.so next to this binary].
    #[arg(long)]
    from: Option<PathBuf>,
    /// Path of the library inside containers, written into ld.so.preload.
    #[arg(long, default_value = "/usr/local/vgpu/libvgpu.so")]
    container_path: PathBuf,
    /// The node's C library to check symbol versions against
    /// [default: the one this process runs on].
    #[arg(long)]
    libc: Option<PathBuf>,
    /// Restore what the first install replaced, and remove vgpu's files.
    #[arg(long)]
    uninstall: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let outcome = if args.uninstall {
        install::uninstall(&args.host_dir)?
    } else {
        let lib = match args.from {
            Some(p) => p,
            None => std::env::current_exe()
                .context("cannot find this binary's directory; pass --from")?
                .with_file_name(install::LIB_NAME),
        };
        let libc = match args.libc {
            Some(p) => p,
            None => install::running_libc()
                .context("cannot find the C library in /proc/self/maps; pass --libc")?,
        };
        install::install(&Plan {
            lib,
            host_dir: args.host_dir.clone(),
            container_path: args.container_path,
            libc,
        })?
    };
    let dir = args.host_dir.display();
    println!(
        "{}",
        match outcome {
            Outcome::Installed => format!("installed the vgpu hook in {dir}"),
            Outcome::AlreadyInstalled => format!("the vgpu hook in {dir} is already up to date"),
            Outcome::Restored => format!("restored {dir} to its state before vgpu"),
            Outcome::NothingToUninstall => format!("nothing to uninstall in {dir}"),
        }
    );
    Ok(ExitCode::SUCCESS)
}
