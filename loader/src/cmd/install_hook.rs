//! `vgpu install-hook`: put libvgpu.so and ld.so.preload in the host
//! directory HAMi's device plugin mounts into GPU containers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::install::{self, HamiSeen, Mounted, Outcome, Plan, Report};

/// Install the hook on this node, or check or undo the install.
///
/// Copies libvgpu.so into the host directory (atomically: write a temporary
/// file, then rename, so running containers keep a whole library) and
/// writes ld.so.preload beside it. Checks the
/// library first and changes nothing if it fails: it must be vgpu's hook
/// (export the CUDA, NVML and dlsym entry points the hook interposes,
/// cuMemAlloc_v2, cuLaunchKernel and nvmlDeviceGetMemoryInfo among them; the
/// error names those missing), and its ELF architecture and glibc symbol
/// versions must fit the node. Idempotent; the first install keeps what was
/// there, and `--uninstall` restores it.
///
/// On a HAMi node add `--hami`: HAMi's device plugin (2.5 and later) mounts
/// `libvgpu.so.<HAMi version>` when that file exists and `libvgpu.so` only
/// otherwise, and copies its versioned file back each time it starts. With
/// `--hami` every `libvgpu.so.<version>` is moved into the backup (never
/// overwritten), so the device plugin mounts vgpu's `libvgpu.so`; with
/// `--watch` it keeps doing so after a device-plugin restart copies HAMi's
/// file back. HAMi 2.4 and earlier, Volcano's vGPU device plugin and KAI's
/// resource isolator (no versioned file) are refused unless `--force` is
/// given: their start rewrites `libvgpu.so` in place. A `libvgpu.so`
/// vgpu did not install is never replaced without `--force`. Without
/// `--hami` a node HAMi 2.5+ serves is refused. After `--uninstall` a running
/// `--watch` stands down until the next install without `--watch`. A
/// `--watch` that gets SIGTERM or SIGINT (its pod deleted or rolled)
/// restores the directory as `--uninstall` does, then exits; it leaves no
/// marker, so the next pod installs again.
/// docs/kubernetes.md explains the design.
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
    /// prints each change. On SIGTERM or SIGINT, restore what the install
    /// replaced (as --uninstall, but a later keeper installs again) and exit.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    /// Restore what the first install replaced (HAMi's versioned files
    /// included), and remove vgpu's files; a running --watch stands down.
    #[arg(long, conflicts_with = "watch")]
    uninstall: bool,
    /// Change nothing; say which library HAMi's device plugin mounts into
    /// new containers now, and which HAMi release the directory shows.
    /// Exits 0 when it is vgpu's (the --from library) and stays so, 3 when
    /// it is another (or no hook at all), 4 when it is vgpu's but HAMi ≥ 2.5
    /// is not proven (with --hami, or where HAMi ≤ 2.4's or Volcano's device
    /// plugin, or KAI's isolator, left its files): those rewrite it in place
    /// on their next start.
    #[arg(long, conflicts_with_all = ["watch", "uninstall"])]
    check: bool,
    /// Replace a libvgpu.so that vgpu did not install (the first install
    /// keeps it for --uninstall), and install where the device plugin
    /// copies its libvgpu.so over the host file in place on every start
    /// (HAMi 2.4 and earlier, Volcano's vGPU device plugin, KAI's resource
    /// isolator's libsync): restart that
    /// device plugin only on a drained node, since its copy rewrites
    /// vgpu's library under the containers that have it mapped.
    /// With --hami it replaces a stray libvgpu.so, but never stands in for
    /// the proof of HAMi 2.5 or later.
    #[arg(long, conflicts_with_all = ["uninstall", "check"])]
    force: bool,
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
        return check(&args.host_dir, &lib, args.hami);
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
        keeper: args.watch.is_some(),
        force: args.force,
    };
    // Before the first install: a SIGTERM from then on waits to be read,
    // and is answered by a restore, even while an install runs.
    let stop = match args.watch {
        Some(_) => Some(install::StopSignals::block().context("block SIGTERM and SIGINT")?),
        None => None,
    };
    let report = install::install(&plan)?;
    println!("{}", describe(&report, &dir));
    let seen = install::hami_seen(&args.host_dir)?;
    if seen.rewrites_in_place() {
        println!(
            "{dir}: {}; its device plugin's next start rewrites {dir}/libvgpu.so in place: \
             restart it only on a drained node, then run install-hook --force again",
            seen.describe()
        );
    }
    if seen == HamiSeen::Kai {
        println!(
            "{dir}: KAI's webhook mounts this whole directory read-write into every fractional \
             pod: a pod running as root can replace {dir}/libvgpu.so (vgpu's or HAMi-core's) \
             for the node (docs/kubernetes.md, \"Hosts\")"
        );
    }
    let (Some(secs), Some(stop)) = (args.watch, stop) else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut last = report.outcome;
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
        let woke = match &watch {
            Some(w) => w.wait(period, &stop).or_else(|e| {
                tracing::warn!("install-hook --watch: inotify: {e}");
                stop.wait(period)
            }),
            None => stop.wait(period),
        };
        let woke = woke.unwrap_or_else(|e| {
            tracing::warn!("install-hook --watch: waiting for signals: {e}");
            std::thread::sleep(period);
            install::Woke::Changed
        });
        if let install::Woke::Stop(sig) = woke {
            return stopped(&args.host_dir, &dir, sig);
        }
        match install::install(&plan) {
            Ok(r) => {
                failing = false;
                let stood_down = r.outcome == Outcome::StoodDown;
                if r.outcome == Outcome::Installed
                    || !r.versioned.is_empty()
                    || (stood_down && last != Outcome::StoodDown)
                {
                    println!("{}", describe(&r, &dir));
                }
                last = r.outcome;
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

/// The keeper's container is being stopped (pod deleted, or replaced by a
/// rolling update; the kubelet sends SIGTERM): put back what was there
/// before vgpu, so new containers get HAMi's library (or none) rather
/// than a hook no daemon serves. The next pod's install puts vgpu's back.
fn stopped(host_dir: &std::path::Path, dir: &str, sig: &str) -> Result<ExitCode> {
    let report = install::restore(host_dir)
        .with_context(|| format!("install-hook --watch: {sig}: restoring {dir}"))?;
    println!("{sig}: {}", describe(&report, dir));
    Ok(ExitCode::SUCCESS)
}

fn check(host_dir: &std::path::Path, lib: &std::path::Path, hami: bool) -> Result<ExitCode> {
    let dir = host_dir.display();
    let seen = install::hami_seen(host_dir)?;
    let release = seen.describe();
    let seen_rewrites = seen.rewrites_in_place();
    let proven = match seen {
        HamiSeen::Versioned(_) => true,
        HamiSeen::Unversioned | HamiSeen::Volcano | HamiSeen::Kai | HamiSeen::Started => false,
        HamiSeen::Nothing => !hami,
    };
    let (line, code) = match install::mounted(host_dir, lib)? {
        Mounted::Vgpu if proven => (
            format!("new GPU containers get vgpu's hook ({dir}/libvgpu.so)"),
            0,
        ),
        Mounted::Vgpu => (
            format!(
                "{dir}/libvgpu.so is vgpu's, but HAMi 2.5 or later is not proven: the next start \
                 of a HAMi 2.4 device plugin (or Volcano's, or KAI's isolator) rewrites it in \
                 place under running containers; not served"
            ),
            4,
        ),
        Mounted::Versioned(names) => (
            format!(
                "new GPU containers get HAMi's library ({dir}/{}); run install-hook --hami",
                names.join(", ")
            ),
            3,
        ),
        Mounted::Other => (
            format!(
                "{dir}/libvgpu.so is not the library of {}; {}",
                lib.display(),
                advice(seen_rewrites)
            ),
            3,
        ),
        Mounted::NotHook(why) => (
            format!(
                "{dir}/libvgpu.so is not vgpu's hook: {why}; {}",
                advice(seen_rewrites)
            ),
            3,
        ),
        Mounted::Nothing => (format!("no hook library in {dir}"), 3),
    };
    println!("{line}\n{dir}: {release}");
    Ok(ExitCode::from(code))
}

/// What to do about a `libvgpu.so` that is not vgpu's.
fn advice(rewrites_in_place: bool) -> &'static str {
    if rewrites_in_place {
        "it is the device plugin's, which rewrites it in place on every start: upgrade HAMi \
         to 2.5 or later and run install-hook --hami, or run install-hook --force on a \
         drained node"
    } else {
        "install-hook --force replaces it (--uninstall puts it back)"
    }
}

fn describe(r: &Report, dir: &str) -> String {
    let mut line = match r.outcome {
        Outcome::Installed => format!("installed the vgpu hook in {dir}"),
        Outcome::StoodDown => format!(
            "vgpu was uninstalled from {dir}: the keeper stands down until the next install-hook"
        ),
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
