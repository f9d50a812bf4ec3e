//! `vgpu suspend` / `vgpu resume`: HAMi's suspend protocol.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use crate::regions::admin::{plan_signal, send_signal, wait_status, SignalAction};
use crate::regions::open::{open_region, Access};

/// Suspend every process of a region (HAMi's SIGUSR2 protocol).
///
/// Sends SIGUSR2 to every live process of the region (by host PID) and
/// waits until each slot reports status 2 (suspended); a suspended process
/// blocks at its next allocation or launch. Refuses, signalling nobody, if
/// any live process has no known host PID, is not proven to be the slot's
/// process (it must map this region file and see itself as the slot's pid;
/// the host PID in a slot is container-writable), or does not handle both
/// SIGUSR2 and SIGUSR1 (the default action of those signals kills the
/// process). PATH must be a regular file reached without symlinks.
/// Fails after --timeout if some slot did not report.
#[derive(clap::Args, Debug)]
pub struct SuspendArgs {
    /// The region file.
    path: PathBuf,
    /// Seconds to wait for the slots to report.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = super::bounds::seconds(0.0, 3600.0))]
    timeout: f64,
}

/// Resume every process of a region (HAMi's SIGUSR1 protocol).
///
/// Sends SIGUSR1 to every live process of the region (by host PID) and
/// waits until each slot reports status 1 (running). Refuses, signalling
/// nobody, if any live process has no known host PID, is not proven to be
/// the slot's process (see `vgpu suspend --help`), or does not handle
/// SIGUSR1. Fails after --timeout if some slot did not report.
#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The region file.
    path: PathBuf,
    /// Seconds to wait for the slots to report.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = super::bounds::seconds(0.0, 3600.0))]
    timeout: f64,
}

fn act(path: &std::path::Path, timeout: f64, action: SignalAction) -> anyhow::Result<ExitCode> {
    let timeout = Duration::try_from_secs_f64(timeout)
        .with_context(|| format!("--timeout {timeout} is not a number of seconds"))?;
    let file = open_region(path, Access::ReadOnly)?;
    let targets = plan_signal(&file, action)?;
    let verb = match action {
        SignalAction::Suspend => "suspended",
        SignalAction::Resume => "resumed",
    };
    if targets.is_empty() {
        println!("no live process in {}; nothing {verb}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    send_signal(&file, &targets, action)?;
    wait_status(&file, &targets, action, timeout)?;
    for t in &targets {
        println!(
            "{verb} slot {} (pid {}, host pid {})",
            t.slot, t.pid, t.host_pid
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `vgpu suspend`.
pub fn run_suspend(args: SuspendArgs) -> anyhow::Result<ExitCode> {
    act(&args.path, args.timeout, SignalAction::Suspend)
}

/// Runs `vgpu resume`.
pub fn run_resume(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    act(&args.path, args.timeout, SignalAction::Resume)
}
