//! `vgpu cleanup`: reclaim the slots of dead processes.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::regions::admin::cleanup;
use crate::regions::summary::bytes;

/// Reclaim the slots of dead processes in a region.
///
/// Under the region lock, frees every slot whose process is certainly dead
/// (its host PID is gone, or no process mapping the region has its PID):
/// counters zeroed, pid 0, status 0. Free slots with leftover counters (a
/// HAMi-core exit) are zeroed too, and proc_num is lowered over trailing
/// free slots. Live slots are never touched and no slot is moved (other
/// processes keep pointers to their own). A slot whose liveness cannot be
/// decided (no host PID and /proc not fully readable: run as root) is left
/// alone. Refuses if the lock is held for more than 2 s.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The region file.
    path: PathBuf,
}

/// Runs `vgpu cleanup`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file =
        crate::regions::open::open_region(&args.path, crate::regions::open::Access::ReadWrite)?;
    let report = cleanup(&file)?;
    for r in &report.reclaimed {
        println!(
            "reclaimed slot {} of dead pid {} (hostpid {}), {} of counters",
            r.slot,
            r.pid,
            r.hostpid,
            bytes(r.total_bytes)
        );
    }
    for s in &report.normalised {
        println!("zeroed leftover counters of free slot {s}");
    }
    for s in &report.undecided {
        println!("left slot {s} alone: cannot tell whether its process lives (run as root)");
    }
    if report.reclaimed.is_empty() && report.normalised.is_empty() {
        println!("no dead slots");
    }
    if report.proc_num_after != report.proc_num_before {
        println!(
            "proc_num {} -> {}",
            report.proc_num_before, report.proc_num_after
        );
    }
    Ok(ExitCode::SUCCESS)
}
