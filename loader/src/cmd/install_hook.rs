//! `vgpu install-hook`: put libvgpu.so and ld.so.preload in the host
//! directory HAMi's device plugin mounts into GPU containers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::install::{self, Mounted, Outcome, Plan, Report};

/// Install the hook on this node: copy libvgpu.so into the host directory
/// (atomically: write a temporary file, then rename, so running containers
/// keep a whole library) and write ld.so.preload beside it. Checks the ELF
/// architecture and glibc symbol versions first and refuses a library that
/// would not load. Idempotent; the first install keeps what was there, and
/// `--uninstall` restores it.
///
/// On a HAMi node add `--hami`: HAMi's device plugin (2.5 and later) mounts
/// `libvgpu.so.<HAMi version>` when that file exists and `libvgpu.so` only
/// otherwise, and copies its versioned file back each time it starts. With
/// `--hami` every `libvgpu.so.<version>` is moved into the backup (never
/// overwritten), so the device plugin mounts vgpu's `libvgpu.so`; with
/// `--watch` it keeps doing so after a device-plugin restart copies HAMi's
/// file back. docs/kubernetes.md explains the design.
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
    /// The C library to check the hook's glibc symbol versions against
    /// [default: the one this process runs on].
    #[arg(long)]
    libc: Option<PathBuf>,
    /// Move HAMi's versioned libraries (`libvgpu.so.<version>`) aside so
    /// its device plugin mounts vgpu's `libvgpu.so`.
    #[arg(long)]
    hami: bool,
    /// Stay running and install again whenever the host directory changes
    /// (HAMi's device plugin copying its library back when it restarts;
    /// inotify, within milliseconds), and at least every SECS seconds;
    /// prints each change.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    /// Restore what the first install replaced (HAMi's versioned files
    /// included), and remove vgpu's files.
    #[arg(long, conflicts_with = "watch")]
    uninstall: bool,
    /// Change nothing; say which library HAMi's device plugin mounts into
    /// new containers now. Exits 0 when it is vgpu's (the --from library),
    /// 3 otherwise.
    #[arg(long, conflicts_with_all = ["watch", "uninstall"])]
    check: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let dir = args.host_dir.display().to_string();
    if args.uninstall {
        let report = install::uninstall(&args.host_dir)?;
        println!("{}", describe(&report, &dir));
        return Ok(ExitCode::SUCCESS);
    }
    let lib = match args.from {
        Some(p) => p,
        None => std::env::current_exe()
            .context("cannot find this binary's directory; pass --from")?
            .with_file_name(install::LIB_NAME),
    };
    if args.check {
        return check(&args.host_dir, &lib);
    }
    let libc = match args.libc {
        Some(p) => p,
        None => install::running_libc()
            .context("cannot find the C library in /proc/self/maps; pass --libc")?,
    };
    let plan = Plan {
        lib,
        host_dir: args.host_dir.clone(),
        container_path: args.container_path,
        libc,
        hami: args.hami,
    };
    let report = install::install(&plan)?;
    println!("{}", describe(&report, &dir));
    let Some(secs) = args.watch else {
        return Ok(ExitCode::SUCCESS);
    };
    let period = Duration::try_from_secs_f64(secs.max(0.1)).unwrap_or(Duration::from_secs(2));
    let watch = match install::DirWatch::new(&args.host_dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "install-hook --watch: no inotify on {dir} ({e}); checking every {secs}s"
            );
            None
        }
    };
    let mut failing = false;
    loop {
        match &watch {
            Some(w) => {
                if let Err(e) = w.wait(period) {
                    tracing::warn!("install-hook --watch: inotify: {e}");
                    std::thread::sleep(period);
                }
            }
            None => std::thread::sleep(period),
        }
        match install::install(&plan) {
            Ok(r) => {
                failing = false;
                if r.outcome == Outcome::Installed || !r.versioned.is_empty() {
                    println!("{}", describe(&r, &dir));
                }
            }
            // Once per run of failures: the next success says it recovered.
            Err(e) if !failing => {
                failing = true;
                tracing::error!("install-hook --watch: {e}");
            }
            Err(_) => {}
        }
    }
}

fn check(host_dir: &std::path::Path, lib: &std::path::Path) -> Result<ExitCode> {
    let dir = host_dir.display();
    let (line, ok) = match install::mounted(host_dir, lib)? {
        Mounted::Vgpu => (
            format!("new GPU containers get vgpu's hook ({dir}/libvgpu.so)"),
            true,
        ),
        Mounted::Versioned(names) => (
            format!(
                "new GPU containers get HAMi's library ({dir}/{}); run install-hook --hami",
                names.join(", ")
            ),
            false,
        ),
        Mounted::Other => (
            format!("{dir}/libvgpu.so is not the library of {}", lib.display()),
            false,
        ),
        Mounted::Nothing => (format!("no hook library in {dir}"), false),
    };
    println!("{line}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn describe(r: &Report, dir: &str) -> String {
    let mut line = match r.outcome {
        Outcome::Installed => format!("installed the vgpu hook in {dir}"),
        Outcome::AlreadyInstalled => format!("the vgpu hook in {dir} is already up to date"),
        Outcome::Restored => format!("restored {dir} to its state before vgpu"),
        Outcome::NothingToUninstall => format!("nothing to uninstall in {dir}"),
    };
    if !r.versioned.is_empty() {
        let verb = match r.outcome {
            Outcome::Restored => "put back",
            _ => "moved aside",
        };
        line.push_str(&format!("; {verb} HAMi's {}", r.versioned.join(", ")));
    }
    line
}
